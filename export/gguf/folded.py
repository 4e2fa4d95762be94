"""Folded attention: the query heads that share a KV head as rows of one GroupQueryAttention
problem (see :mod:`edgespec.export.gguf.graph` for why), and the KV layout it needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.errors import ConfigError
from edgespec.export.gguf.builder import GraphBuilder
from edgespec.export.gguf.rope import layer_tables

#: The widest pass a folded graph's buffers leave room for at the end of the context: the
#: runtime prefills 128 tokens per pass.
FOLDED_PASS_WIDTH = 128
#: ``attention="auto"`` folds graphs whose context limit exceeds this: folding saves much of
#: a long-context step and costs a little at short context (the slice, rotary, split, pad and
#: reshape nodes it adds), breaking even near 1,000 positions on a 4-bit SmolLM2 step
#: (``benchmarks/step_cost.py``: docs/benchmarks/kernels.md, "Where a K-quant step goes").
FOLDED_FROM = 2048


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    """How a graph uses its KV buffers: ``buffer_length`` positions per layer, of which a pass
    of n tokens writes n × ``positions_per_token`` from its start (the first n are kept)."""

    buffer_length: int
    positions_per_token: int = 1
    #: The attention runs on edgespec's CacheAttention kernel (``cache_attention``), which
    #: gives a row the same bits at any pass width: no padding, no rounding boundaries.
    kernel: bool = False
    #: The kernel's caches hold float16 (``CacheAttentionHalf``): half the memory, as
    #: llama.cpp keeps its cache.
    half_cache: bool = False

    @property
    def folded(self) -> bool:
        return self.positions_per_token > 1

    @property
    def kv_dtype(self) -> str:
        return "float16" if self.half_cache else "float32"


def kv_layout(
    arch: Any, capacity: int, *, quantized: bool, attention: str = "auto", kv_cache: str = "auto"
) -> KVLayout:
    """The kernel's layout for ``attention`` "kernel" (its caches float16 unless ``kv_cache``
    is "float32"). Folded attention for block-quantized graphs of models whose query heads
    share KV heads (and whose heads are whole blocks of 32, so the output projection's blocks
    can be reordered), when ``attention`` asks for it ("folded", or "auto" past
    ``FOLDED_FROM`` positions); plain otherwise (float graphs, whose one-row pass needs no
    padding, and sliding-window layers). Only the kernel keeps a float16 cache."""
    if attention == "kernel":
        return KVLayout(buffer_length=capacity, kernel=True, half_cache=kv_cache != "float32")
    group = arch.num_heads // arch.num_kv_heads
    wanted = attention == "folded" or (attention == "auto" and capacity > FOLDED_FROM)
    if not wanted or not quantized or group == 1 or arch.head_dim % 32:
        return KVLayout(buffer_length=capacity)
    return KVLayout(
        buffer_length=capacity + (group - 1) * FOLDED_PASS_WIDTH, positions_per_token=group
    )


def attention_boundaries(arch: Any, layout: KVLayout) -> tuple[int, ...]:
    """The totals at which this graph's GroupQueryAttention rounds differently on this machine
    (:func:`edgespec.export.gguf.regimes.probe_boundaries`, for its global and, with a
    sliding window, its local layers); none for folded graphs, whose every problem already
    has the same multi-row shape at any width (SmolLM2's 64-wide heads show none either)."""
    from edgespec.export.gguf.regimes import probe_boundaries

    if layout.folded or layout.kernel:
        return ()
    shape = {
        "heads": arch.num_heads,
        "kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "capacity": layout.buffer_length,
    }
    found = set(probe_boundaries(**shape))
    if arch.sliding_window:
        found |= set(probe_boundaries(**shape, window=arch.sliding_window))
    return tuple(sorted(found))


def folded_head_order(arch: Any) -> np.ndarray:
    """The query heads in folded order: ONNX Runtime pairs query head h with KV head
    h // group, so folded head g * kv_heads + j (row g of KV head j) is head j * group + g."""
    group = arch.num_heads // arch.num_kv_heads
    heads = [j * group + g for g in range(group) for j in range(arch.num_kv_heads)]
    d = arch.head_dim
    return (np.asarray(heads)[:, None] * d + np.arange(d)[None, :]).reshape(-1)


def folding_inputs(
    builder: GraphBuilder,
    arch: Any,
    *,
    input_ids: str,
    seqlens_k: str,
    total_sequence_length: str,
) -> dict[str, str]:
    """What every folded attention node shares, computed once from the pass's S and lengths.

    The runtime pads a one-token step to S = 2 tokens (for the matrix products' rounding), and
    tells a folded graph how many of them are real: ``total_sequence_length`` = past + S and
    ``seqlens_k`` = past + R - 1 for R real tokens (R = S when nothing is padded). Attention
    runs on the R real tokens only: a padded row would cost a folded problem ``group`` more
    rows (measured in docs/benchmarks/kernels.md, "Where a K-quant step goes"), and a real row's
    attention is the same bit for bit whatever the number of rows, because every folded
    problem has at least ``group`` of them.

    Returns the real token count R [1]; the rotary position offset (the pass's first
    position) [1]; the lengths the folded problem reports to GroupQueryAttention
    (past + group × R); the pads that append (group - 1) × R zero rows to K and V and
    the S - R zero rows that give the attention output back the pass's width; and the bias
    [1, 1, group × R, past + group × R] that lets folded row r (token r // group) see
    positions up to past + r // group only, with (Gemma's sliding-window layers) a second
    one, "local_bias", that also hides the positions ``sliding_window`` or more before it
    (llama.cpp's window: ONNX Runtime's ``local_window_size`` keeps one position more)."""
    group = arch.num_heads // arch.num_kv_heads
    one = builder.constant("fold.one", np.array(1, np.int64))
    axis0, axis1 = (
        builder.constant("fold.ax0", np.array([0])),
        builder.constant("fold.ax1", np.array([1])),
    )
    width = builder.node("Shape", [input_ids], "fold.width", start=1, end=2)  # [S]
    total = builder.node("Cast", [total_sequence_length], "fold.total", to=7)
    past = builder.node("Sub", [total, width], "fold.past")  # [1]
    last_real = builder.node("Cast", [seqlens_k], "fold.last_real", to=7)  # [past + R - 1]
    real = builder.node(
        "Sub", [builder.node("Add", [last_real, one], "fold.real_end"), past], "fold.real"
    )  # [R]
    group_c = builder.constant("fold.group", np.array(group, np.int64))
    rows = builder.node("Mul", [real, group_c], "fold.rows")  # [group × R]
    folded_total = builder.node("Add", [past, rows], "fold.folded_total")  # [1]
    seqlens = builder.node(
        "Cast", [builder.node("Sub", [folded_total, one], "fold.last")], "fold.seqlens_k", to=6
    )
    total_scalar = builder.node(
        "Cast",
        [builder.node("Squeeze", [folded_total], "fold.total_scalar64")],
        "fold.total_sequence_length",
        to=6,
    )
    zeros = builder.constant("fold.zeros", np.zeros(4, np.int64))
    zero = builder.constant("fold.zero", np.zeros(1, np.int64))

    def row_pads(count: str, name: str) -> str:
        # [0, 0, 0, 0, count, 0]: rows appended on axis 1 of a [1, n, width] tensor
        return builder.node("Concat", [zeros, count, zero], name, axis=0)

    pads = row_pads(builder.node("Sub", [rows, real], "fold.extra"), "fold.pads")
    unpads = row_pads(builder.node("Sub", [width, real], "fold.padding"), "fold.unpads")
    start = builder.constant("fold.start", np.array(0, np.int64))
    row_ids = builder.node(
        "Range", [start, builder.node("Squeeze", [rows], "fold.rows_scalar"), one], "fold.row_ids"
    )
    tokens = builder.node("Div", [row_ids, group_c], "fold.row_token")
    last_seen = builder.node(
        "Unsqueeze",
        [builder.node("Add", [tokens, past], "fold.last_seen1"), axis1],
        "fold.last_seen",
    )  # [group × S, 1]
    positions = builder.node(
        "Unsqueeze",
        [
            builder.node(
                "Range",
                [start, builder.node("Squeeze", [folded_total], "fold.t"), one],
                "fold.positions1",
            ),
            axis0,
        ],
        "fold.positions",
    )  # [1, past + group × S]
    visible = builder.node("LessOrEqual", [positions, last_seen], "fold.visible")
    bias = builder.node(
        "Where",
        [
            visible,
            builder.constant("fold.open", np.array(0.0, np.float32)),
            builder.constant("fold.masked", np.array(-np.inf, np.float32)),
        ],
        "fold.bias2",
    )
    axes01 = builder.constant("fold.ax01", np.array([0, 1]))
    bias = builder.node("Unsqueeze", [bias, axes01], "fold.bias")
    local: dict[str, str] = {}
    if arch.sliding_window:
        window = builder.constant("fold.window", np.array(arch.sliding_window, np.int64))
        recent = builder.node(
            "Less",
            [last_seen, builder.node("Add", [positions, window], "fold.window_end")],
            "fold.recent",
        )  # [group × S, past + group × S]: less than the window before the row's token
        local_bias = builder.node(
            "Where",
            [
                builder.node("And", [visible, recent], "fold.local_visible"),
                "fold.open",
                "fold.masked",
            ],
            "fold.local_bias2",
        )
        local["local_bias"] = builder.node("Unsqueeze", [local_bias, axes01], "fold.local_bias")
    return {
        "first": zero,
        "axis1": axis1,
        "real": real,
        "unpads": unpads,
        "position": past,
        "seqlens_k": seqlens,
        "total_sequence_length": total_scalar,
        "pads": pads,
        "bias": bias,
        **local,
    }


def rotated_query_key(
    builder: GraphBuilder,
    arch: Any,
    query_key: tuple[str, str],
    layer: int,
    caches: dict[str, str],
    position: str,
) -> list[str]:
    """Q [1, S, heads × D] and K [1, S, kv_heads × D] rotated from ``position`` (the pass's
    first position [1]) by the layer's rotary tables (:func:`layer_tables`)."""
    cos, sin = layer_tables(caches, arch, layer)
    heads = (arch.num_heads, arch.num_kv_heads)
    # A head rotated over its first dimensions only (Phi-4-mini): the tables are that narrow.
    partial = {"rotary_embedding_dim": arch.rotated_dims} if arch.rotary_dim else {}
    return [
        builder.node(
            "RotaryEmbedding",
            [tensor, position, cos, sin],
            f"l{layer}.{part}_rot",
            domain="com.microsoft",
            num_heads=count,
            interleaved=int(arch.rope_interleaved),
            **partial,
        )
        for part, tensor, count in zip(("q", "k"), query_key, heads, strict=True)
    ]


def folded_attention(
    builder: GraphBuilder,
    arch: Any,
    qkv: list[str],
    layer: int,
    caches: dict[str, str],
    names: dict[str, str],
    kv: tuple[str, str, str, str],
    *,
    sliding: bool = False,
) -> None:
    """Rotary on Q and K, then GroupQueryAttention over the folded problem: Q [1, R, heads × D]
    of the R real tokens (heads already in folded order) as [1, group × R, kv_heads × D]; K
    and V with zero rows appended to the same length; the output unfolded to
    [1, R, heads × D] (still in folded head order, which the output projection's columns
    follow) and padded with zero rows to the pass's S tokens, as ``l{layer}.attn``. ``names``
    are :func:`folding_inputs`' outputs; ``kv`` the layer's past and present key and value.
    A ``sliding`` layer rotates with the local rotary tables and sees its window only."""
    from onnx import helper

    query, key, value = qkv
    rotated = rotated_query_key(builder, arch, (query, key), layer, caches, names["position"])
    d = arch.head_dim
    folded_q = builder.node(
        "Reshape",
        [
            rotated[0],
            builder.constant(f"l{layer}.fold_shape", np.array([1, -1, arch.num_kv_heads * d])),
        ],
        f"l{layer}.q_folded",
    )
    key_rows = builder.node("Pad", [rotated[1], names["pads"]], f"l{layer}.k_folded")
    value_rows = builder.node("Pad", [value, names["pads"]], f"l{layer}.v_folded")
    past_key, past_value, present_key, present_value = kv
    attended = f"l{layer}.attn"
    builder.nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [
                folded_q,
                key_rows,
                value_rows,
                past_key,
                past_value,
                names["seqlens_k"],
                names["total_sequence_length"],
                "",
                "",
                "",
                names["local_bias"] if sliding else names["bias"],
            ],
            [f"{attended}.folded", present_key, present_value],
            name=f"{attended}.folded",
            domain="com.microsoft",
            num_heads=arch.num_kv_heads,
            kv_num_heads=arch.num_kv_heads,
            **softcap(arch),
        )
    )
    unfolded = builder.node(
        "Reshape",
        [
            f"{attended}.folded",
            builder.constant(f"l{layer}.unfold_shape", np.array([1, -1, arch.num_heads * d])),
        ],
        f"{attended}.real",
    )  # [1, R, heads × D]
    builder.node("Pad", [unfolded, names["unpads"]], attended)  # [1, S, heads × D]


def real_rows(builder: GraphBuilder, tensor: str, names: dict[str, str], output: str) -> str:
    """``tensor`` [1, S, n] cut to the pass's R real tokens [1, R, n] (see
    :func:`folding_inputs`)."""
    return builder.node("Slice", [tensor, names["first"], names["real"], names["axis1"]], output)


def softcap(arch: Any) -> dict[str, Any]:
    """GroupQueryAttention's ``softcap`` attribute for Gemma 2's capped scores, else none."""
    return {"softcap": float(arch.attention_softcap)} if arch.attention_softcap else {}


def _kernel_softcap(arch: Any) -> dict[str, Any]:
    """CacheAttention's ``softcap``: an integer attribute (Gemma 2's 50)."""
    cap = arch.attention_softcap
    if cap and cap != int(cap):
        raise ConfigError(
            f"edgespec's attention kernel caps scores at whole numbers; this model's cap is "
            f"{cap:g}",
            fix="import it with --attention plain",
        )
    return {"softcap": int(cap)} if cap else {}


def cache_attention(
    builder: GraphBuilder,
    arch: Any,
    qkv: list[str],
    layer: int,
    caches: dict[str, str],
    position: str,
    kv: tuple[str, str, str, str],
    lengths: tuple[str, str],
    *,
    sliding: bool = False,
    half_cache: bool = False,
) -> None:
    """Rotary on Q [1, S, heads × D] and K [1, S, kv_heads × D] from ``position`` (the pass's
    first position [1]), then edgespec's CacheAttention over the layer's in-place cache
    (CacheAttentionHalf over a float16 one with ``half_cache``; its window for a ``sliding``
    layer, whose rotary tables are the local ones), as
    ``l{layer}.attn`` [1, S, heads × D]; ``kv``: the layer's past and present key and value.
    The kernel reads the pass's real rows from ``lengths``, the graph's seqlens_k and
    total_sequence_length (GroupQueryAttention's)."""
    from onnx import helper

    from edgespec.graph.kernels import CACHE_ATTENTION, CACHE_ATTENTION_HALF, GGUF_DOMAIN

    query, key, value = qkv
    rotated = rotated_query_key(builder, arch, (query, key), layer, caches, position)
    op = CACHE_ATTENTION_HALF if half_cache else CACHE_ATTENTION
    builder.kernel_ops.add(op)
    past_key, past_value, present_key, present_value = kv
    attended = f"l{layer}.attn"
    builder.nodes.append(
        helper.make_node(
            op,
            [*rotated, value, past_key, past_value, *lengths],
            [attended, present_key, present_value],
            name=attended,
            domain=GGUF_DOMAIN,
            num_heads=arch.num_heads,
            kv_num_heads=arch.num_kv_heads,
            window=arch.sliding_window if sliding else 0,
            **_kernel_softcap(arch),
        )
    )


def pass_position(builder: GraphBuilder, *, input_ids: str, total_sequence_length: str) -> str:
    """The pass's first position [1] (int64): total_sequence_length - S."""
    width = builder.node("Shape", [input_ids], "cache.width", start=1, end=2)  # [S]
    total = builder.node("Cast", [total_sequence_length], "cache.total", to=7)
    return builder.node("Sub", [total, width], "cache.position")
