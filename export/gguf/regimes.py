"""Where GroupQueryAttention's arithmetic changes with the pass's total length, and how passes
are cut so that a position's logits never depend on the pass that computed it.

ONNX Runtime's CPU attention multiplies Q [rows, D] by K' [D, T] for T = past + width
positions. Its matrix kernel chooses how to split the D-long dot products by the shape, and
with 256-wide heads (Gemma 3) the choice flips with T: measured on this project's x86 machine,
a row's output changes when T crosses 65, 193, 321, ... (every 128 from 65), by about 1e-7,
enough to flip a near-tie, so a verify pass and the single steps it replaces could disagree.
Heads of 64 or 128 show no such totals.

The fix is in how passes are cut (:func:`edgespec.graph.passes.pass_pieces`), not in the graph:
every position p is computed at a total
in the same *regime* (the number of boundaries at or below T) as the single step that would
compute it (T = p + min_pass_width), so target-only decoding and any speculative schedule give
the same bits. A pass that would mix regimes is cut where the regime changes (a few extra
passes per thousand positions).

The boundaries are probed, not derived: :func:`probe_boundaries` runs one GroupQueryAttention
node of the model's shape over every total up to the capacity and records where a row's output
changes between passes of two and three positions.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


def attention_session(
    *, heads: int, kv_heads: int, head_dim: int, capacity: int, window: int = 0
) -> Any:
    """An ONNX Runtime session of one GroupQueryAttention node of this shape: inputs q, k, v
    [1, S, heads|kv_heads × D], past_k and past_v [1, kv_heads, capacity, D], seqlens_k [1],
    total []; outputs out, present_k, present_v."""
    import onnxruntime
    from onnx import TensorProto, helper

    hidden, kv_hidden = heads * head_dim, kv_heads * head_dim
    cache = [1, kv_heads, capacity, head_dim]
    inputs = [
        helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, "S", hidden]),
        helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, "S", kv_hidden]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, "S", kv_hidden]),
        helper.make_tensor_value_info("past_k", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_v", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total", TensorProto.INT32, []),
    ]
    attributes: dict[str, Any] = {"local_window_size": window} if window else {}
    node = helper.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "past_k", "past_v", "seqlens_k", "total"],
        ["out", "present_k", "present_v"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        **attributes,
    )
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in node.output]
    model = helper.make_model(
        helper.make_graph([node], "attention-probe", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 10
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


@lru_cache(maxsize=16)
def probe_boundaries(
    *, heads: int, kv_heads: int, head_dim: int, capacity: int, window: int = 0
) -> tuple[int, ...]:
    """Totals T at which the output of a pass's first row changes, for one GroupQueryAttention
    node of this shape (``window``: its ``local_window_size``, 0 for none) on this machine's
    CPU kernels: for each past length, the row is computed in passes of two and three
    positions, and a difference puts a boundary at past + 3."""
    import numpy as np

    shape = {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "capacity": capacity}
    session = attention_session(**shape, window=window)
    hidden, kv_hidden = heads * head_dim, kv_heads * head_dim
    cache = [1, kv_heads, capacity, head_dim]
    rng = np.random.default_rng(0)
    past_k = rng.standard_normal(cache).astype(np.float32)
    past_v = rng.standard_normal(cache).astype(np.float32)
    q = rng.standard_normal((1, 3, hidden)).astype(np.float32)
    k = rng.standard_normal((1, 3, kv_hidden)).astype(np.float32)
    v = rng.standard_normal((1, 3, kv_hidden)).astype(np.float32)

    def first_row(past: int, width: int) -> np.ndarray:
        # Past and present are separate buffers here (ONNX Runtime copies the past into the
        # present), so every probe reads the same past; the products run as in the runtime.
        feeds = {
            "q": q[:, :width],
            "k": k[:, :width],
            "v": v[:, :width],
            "past_k": past_k,
            "past_v": past_v,
            "seqlens_k": np.array([past + width - 1], np.int32),
            "total": np.array(past + width, np.int32),
        }
        return session.run(["out"], feeds)[0][0, 0]

    return tuple(
        past + 3
        for past in range(1, capacity - 3)
        if not np.array_equal(first_row(past, 2), first_row(past, 3))
    )
