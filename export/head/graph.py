"""A head's ONNX graph, built by the GGUF importer's own builder: the target's rows of the kept
tokens (the file's blocks, byte for byte, then zero rows) embed and score tokens, the trained
layer and the input projection run as Q8_0 blocks on edgespec's GGUF kernels, attention on the
CacheAttention kernel over the head's own in-place KV cache (one layer).

I/O: ``input_ids`` int64 [1, S] (rows of the head's table: the kept tokens' indices, N for any
other token); ``target_features`` float32 [1, S, H] (for each token, the feature of the
position before it); ``seqlens_k``, ``total_sequence_length``, ``logits_rows`` and one
layer's past/present as in the target's graph; out: ``logits`` [1, R, N + pad] (the zero rows'
columns from N on are never proposed) and ``features`` [1, S, H], the predicted next features.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.gguf.attention import kv_layout, pass_position
from edgespec.export.gguf.builder import ExternalData, GraphBuilder
from edgespec.export.gguf.embedding import embedding
from edgespec.export.gguf.graph import IO, OPSET, decoder_layer, past_names, present_names
from edgespec.export.gguf.lm_head import lm_head
from edgespec.export.gguf.reader import GGUFFile, float_tensor
from edgespec.export.gguf.rope import NO_SCALING, rotary_constants
from edgespec.export.head.net import HeadShape
from edgespec.export.hf_source import CheckpointSource, FloatTensor, QuantizedTensor
from edgespec.graph.kernels import GGUF_DOMAIN

FEATURE_INPUT = "target_features"
#: The block type of the head's own matrices (its layer and input projection).
HEAD_QUANT = "Q8_0"


def table_padding(kept: int) -> int:
    """Zero rows after ``kept`` rows: at least one, up to a multiple of 8."""
    return 8 - kept % 8


def head_source(
    target: GGUFFile,
    tensors: dict[str, FloatTensor | QuantizedTensor],
    kept: np.ndarray,
    shape: HeadShape,
) -> CheckpointSource:
    """The head's weights under llama.cpp's names, for the graph builder: its own (a head
    file's, :func:`~edgespec.export.head.bundle.read_head_gguf`), the target's kept rows
    (then zero rows) and final norm as the target's file stores them."""
    arch = target.architecture
    head_arch = replace(
        arch,
        name=f"{arch.name} head",
        num_layers=1,
        intermediate_size=shape.intermediate,
        vocab_size=len(kept) + table_padding(len(kept)),
        tied_embeddings="output.weight" not in target.tensors,
        qkv_bias=False,
        gemma=False,
        qk_norm=False,
        sliding_window=0,
        output_vocabulary=(),
        rope_interleaved=False,
        rope_scaling=NO_SCALING,
        no_rope_every=0,
        rotary_dim=0,
        attention_softcap=0.0,
        final_softcap=0.0,
        rms_norm_eps=shape.rms_norm_eps,
    )
    weights: dict[str, FloatTensor | QuantizedTensor] = {
        "token_embd.weight": kept_rows(target.tensors["token_embd.weight"], kept),
        "output_norm.weight": FloatTensor(float_tensor(target.tensors["output_norm.weight"])),
    }
    if "output.weight" in target.tensors:  # an output layer of its own: its rows score
        weights["output.weight"] = kept_rows(target.tensors["output.weight"], kept)
    weights.update(tensors)
    return CheckpointSource(architecture=head_arch, tensors=weights)


def kept_rows(tensor: Any, kept: np.ndarray) -> FloatTensor | QuantizedTensor:
    """The rows of ``kept`` tokens of a GGUF tensor [vocab, H] as the file stores them, then
    zero rows (zero bytes are zeros in every block type): row N for any other token, and
    enough to make whole groups of 8 outputs, which the kernels' rows-of-8 layout needs for
    the scoring product."""
    rows = np.asarray(tensor.data)[np.asarray(kept, np.int64)]  # [N, row bytes] or [N, H]
    rows = np.concatenate([rows, np.zeros_like(rows[:1]).repeat(table_padding(len(kept)), 0)])
    if tensor.tensor_type.name in ("F32", "F16"):
        return FloatTensor(rows.astype(np.float32))
    columns = int(tensor.shape[0])
    return QuantizedTensor(data=rows, tensor_type=tensor.tensor_type, shape=(columns, len(rows)))


def build_head_graph(
    source: CheckpointSource,
    *,
    capacity: int,
    kernel_types: frozenset[str],
    data: ExternalData | None = None,
) -> tuple[Any, GraphBuilder, Any]:
    """The head's ModelProto, its builder and its KV layout."""
    from onnx import TensorProto, helper

    arch = source.architecture
    builder = GraphBuilder(accuracy_level=4, kernel_types=kernel_types, data=data)
    on_kernels = builder.raw_blocks(source.tensor("blk.0.attn_q.weight")) is not None
    layout = kv_layout(
        capacity,
        attention="kernel" if on_kernels else "plain",
        trained_length=arch.context_length,
    )
    caches = rotary_constants(builder, arch, layout.positions)
    embedded, tied = embedding(builder, source, IO["input_ids"])  # [1, S, H]
    joined = builder.node("Concat", [embedded, FEATURE_INPUT], "head.joined", axis=-1)
    x = builder.linear(joined, source.tensor("head_fc.weight"), "head.fc")  # [1, S, H]
    position = (
        pass_position(
            builder, input_ids=IO["input_ids"], total_sequence_length=IO["total_sequence_length"]
        )
        if layout.kernel
        else None
    )
    x = decoder_layer(builder, source, x, 0, caches, position, layout.half_cache)
    features = builder.node("Identity", [x], IO["features"])
    x = builder.node("Gather", [x, IO["logits_rows"]], "head_rows", axis=1)  # [1, R, H]
    x = builder.rms_norm(x, source.tensor("output_norm.weight"), "final_norm", arch.rms_norm_eps)
    logits = lm_head(builder, source, x, tied, logits=IO["logits"])
    hidden = arch.hidden_size
    kv: list[str | int] = [1, arch.num_kv_heads, "capacity", arch.head_dim]
    kv_type = TensorProto.FLOAT16 if layout.half_cache else TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info(IO["input_ids"], TensorProto.INT64, [1, "sequence"]),
        helper.make_tensor_value_info(FEATURE_INPUT, TensorProto.FLOAT, [1, "sequence", hidden]),
        helper.make_tensor_value_info(IO["seqlens_k"], TensorProto.INT32, [1]),
        helper.make_tensor_value_info(IO["total_sequence_length"], TensorProto.INT32, []),
        helper.make_tensor_value_info(IO["logits_rows"], TensorProto.INT64, ["rows"]),
        *(helper.make_tensor_value_info(n, kv_type, kv) for n in past_names(0)),
    ]
    outputs = [
        helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, "rows", arch.vocab_size]),
        helper.make_tensor_value_info(features, TensorProto.FLOAT, [1, "sequence", hidden]),
        *(helper.make_tensor_value_info(n, kv_type, kv) for n in present_names(0)),
    ]
    graph = helper.make_graph(builder.nodes, "edgespec-head", inputs, outputs, builder.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        + ([helper.make_opsetid(GGUF_DOMAIN, 1)] if builder.kernel_ops else []),
        producer_name="edgespec",
    )
    model.ir_version = 10
    return model, builder, layout


def write_head_graph(
    source: CheckpointSource, staging: Path, *, capacity: int, kernel_types: frozenset[str]
) -> tuple[GraphBuilder, Any]:
    """The head's graph and its data file in ``staging``."""
    import onnx

    from edgespec.export.gguf.manifest_records import DATA_FILE, GRAPH_FILE

    with (staging / DATA_FILE).open("wb") as stream:
        model, builder, layout = build_head_graph(
            source,
            capacity=capacity,
            kernel_types=kernel_types,
            data=ExternalData(stream=stream, location=DATA_FILE),
        )
    onnx.save(model, str(staging / GRAPH_FILE))
    return builder, layout
