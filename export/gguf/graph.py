"""The ONNX graph of a GGUF Llama-family model, with an in-place KV cache.

Per layer: RMSNorm → Q, K, V (MatMulNBits on llama.cpp's own blocks) → GroupQueryAttention
(past and present one buffer per layer) → output projection → residual → RMSNorm → SwiGLU MLP
→ residual. Then the final norm and the LM head (the embedding table itself when tied).

Attention comes in two forms (:mod:`edgespec.export.gguf.attention` says which serves what):
edgespec's CacheAttention kernel wherever the GGUF kernels run, ONNX Runtime's
GroupQueryAttention elsewhere.

I/O (names in :data:`IO`): ``input_ids`` int64 [1, S]; ``seqlens_k`` int32 [1] = past + S - 1;
``total_sequence_length`` int32 scalar = past + S; per layer ``past_key_values.{i}.key`` /
``.value`` float32 (float16 on the kernel's float16 cache) [1, kv_heads, capacity, head_dim]
(``capacity`` symbolic: the runtime allocates them for the context it runs at, up to the
rotary tables' length, the manifest's ``max_length``), whose outputs ``present.{i}.key`` /
``.value`` are bound to the same buffers, so a step writes its S new positions in place and a
rollback is a change of length; ``logits_rows`` int64 [R], the pass-local rows whose logits
the graph computes (the hidden states are gathered to those rows before the final norm and
the LM head, so a prefill that reads no logits runs the head on one row); ``logits`` float32
[1, R, vocab].
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgespec.errors import ConfigError
from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.export.gguf.attention import (
    KVLayout,
    cache_attention,
    kv_layout,
    pass_position,
    plain_attention,
)
from edgespec.export.gguf.builder import ExternalData, GraphBuilder
from edgespec.export.gguf.embedding import embedding
from edgespec.export.gguf.lm_head import lm_head
from edgespec.export.gguf.norm_fusion import fuse_residual_norms
from edgespec.export.gguf.reader import WeightSource, float_tensor
from edgespec.export.gguf.rope import rotary_constants
from edgespec.graph.kernels import GGUF_DOMAIN

OPSET = 21
#: Bumped when the graph's structure or what its manifest tells the runtime changes (caches of
#: exported bundles key on it). 4: the manifest records the attention's rounding boundaries;
#: 5: K-quant scales stored as the file's own factors, Q6_K kept exactly in blocks of 16;
#: 6: K-quants on edgespec's GGUF kernels; 7: the ``logits_rows`` input, the LM head runs on
#: the rows the caller reads; 8: biases and residuals added by the GGUF kernels themselves;
#: 9: the legacy types in the kernels' rows-of-8 layout; 10: SwiGLU and the attention
#: output's input order inside the GGUF kernels (no Split, Sigmoid, Mul or Gather nodes);
#: 11: sliding-window layers folded too (Gemma 3), their window an attention bias; 12: a
#: float16-attention copy of the graph, which CUDA sessions run (``half_attention_file``);
#: 13: attention on edgespec's CacheAttention kernel wherever the GGUF kernels run; 14: its
#: caches in float16 (CacheAttentionHalf); 15: the ``features`` output (the last layer's
#: hidden states, which a head on the target drafts from); 16: the KV buffers' length symbolic
#: and the rotary tables as long as the model's trained context (the runtime's ``--context``).
GRAPH_REVISION = 16
IO = {
    "input_ids": "input_ids",
    "seqlens_k": "seqlens_k",
    "total_sequence_length": "total_sequence_length",
    "logits_rows": "logits_rows",
    "logits": "logits",
    "features": "features",
}


def past_names(layer: int) -> tuple[str, str]:
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    return f"present.{layer}.key", f"present.{layer}.value"


def _attention(
    builder: GraphBuilder,
    source: WeightSource,
    x: str,
    layer: int,
    caches: dict[str, str],
    position: str | None = None,
    half_cache: bool = False,
) -> str:
    """The layer's attention block: with ``position`` (the pass's first position), the
    CacheAttention kernel (over float16 caches with ``half_cache``); without, plain."""
    arch = source.architecture
    prefix = f"blk.{layer}"
    normed = _layer_norm(builder, source, x, layer, "attn_norm")
    # Q, K and V in one product [1, S, (heads + 2 kv_heads) * D]: GroupQueryAttention takes
    # them packed (its key and value inputs left empty).
    tensors = [source.tensor(f"{prefix}.attn_{part}.weight") for part in ("q", "k", "v")]
    bias = None
    if arch.qkv_bias:
        biases = [float_tensor(source.tensor(f"{prefix}.attn_{part}.bias")) for part in "qkv"]
        bias = builder.constant(f"l{layer}.qkv.bias", np.concatenate(biases))
    biased = f"l{layer}.qkv.biased" if bias else ""
    qkv = builder.linear_stacked(normed, tensors, f"l{layer}.qkv", addend=bias, output=biased)
    # Packed Q, K, V, or (Qwen3, Gemma: each head of Q and K RMS-normed first) the three apart.
    if arch.qk_norm:
        query_key_value = _normed_qkv(builder, source, qkv, layer)
    elif position is not None:
        query_key_value = _split_qkv(builder, arch, qkv, layer)
    else:
        query_key_value = [qkv, "", ""]
    kv = (*past_names(layer), *present_names(layer))
    lengths = (IO["seqlens_k"], IO["total_sequence_length"])
    if position is not None:
        cache_attention(
            builder,
            arch,
            query_key_value,
            layer,
            caches,
            position,
            kv,
            lengths,
            sliding=arch.is_sliding(layer),
            half_cache=half_cache,
        )
    else:
        plain_attention(builder, arch, query_key_value, layer, caches, kv, lengths)
    attended = f"l{layer}.attn"
    out_weight: Any = source.tensor(f"{prefix}.attn_output.weight")
    residual = f"l{layer}.attn_residual"
    if not arch.gemma:  # the residual added by the product's own kernel where it can
        return builder.linear(attended, out_weight, f"l{layer}.o", addend=x, output=residual)
    out = builder.linear(attended, out_weight, f"l{layer}.o")
    out = _layer_norm(builder, source, out, layer, "post_attention_norm")
    return builder.node("Add", [x, out], residual)


def decoder_layer(
    builder: GraphBuilder,
    source: WeightSource,
    x: str,
    layer: int,
    caches: dict[str, str],
    position: str | None,
    half_cache: bool,
) -> str:
    """One decoder layer over the residual stream ``x`` [1, S, hidden]: attention (the
    CacheAttention kernel with ``position``, plain without) and the MLP, each with its
    residual; ``blk.{layer}.*`` weights. A head on the target is one such layer."""
    x = _attention(builder, source, x, layer, caches, position, half_cache)
    return _mlp(builder, source, x, layer)


def _split_qkv(builder: GraphBuilder, arch: Any, qkv: str, layer: int) -> list[str]:
    from onnx import helper

    d = arch.head_dim
    widths = [arch.num_heads * d, arch.num_kv_heads * d, arch.num_kv_heads * d]
    parts = [f"l{layer}.{part}" for part in ("q", "k", "v")]
    sizes = builder.constant(f"l{layer}.qkv_widths", np.array(widths))
    builder.nodes.append(
        helper.make_node("Split", [qkv, sizes], parts, name=f"l{layer}.qkv_split", axis=-1)
    )
    return parts


def _normed_qkv(builder: GraphBuilder, source: WeightSource, qkv: str, layer: int) -> list[str]:
    """[query, key, value] from the stacked projection, with RMSNorm over each head of the
    query and the key (Qwen3, Gemma), before the rotary embedding."""
    arch, d = source.architecture, source.architecture.head_dim
    parts = _split_qkv(builder, arch, qkv, layer)
    normed = []
    for part, heads in (("q", arch.num_heads), ("k", arch.num_kv_heads)):
        per_head = builder.constant(f"l{layer}.{part}_heads", np.array([1, -1, heads, d]))
        flat = builder.constant(f"l{layer}.{part}_flat", np.array([1, -1, heads * d]))
        split = builder.node("Reshape", [f"l{layer}.{part}", per_head], f"l{layer}.{part}_h")
        norm = _layer_norm(builder, source, split, layer, f"attn_{part}_norm")
        normed.append(builder.node("Reshape", [norm, flat], f"l{layer}.{part}_normed"))
    return [*normed, parts[2]]


def _mlp(builder: GraphBuilder, source: WeightSource, x: str, layer: int) -> str:
    arch = source.architecture
    prefix = f"blk.{layer}"
    normed = _layer_norm(builder, source, x, layer, "ffn_norm")
    tensors = [source.tensor(f"{prefix}.ffn_{part}.weight") for part in ("gate", "up")]
    gate, up = tensors
    fused = None if arch.gemma else builder.swiglu(normed, gate, up, f"l{layer}.gated")
    hidden = fused or _gated(builder, arch, normed, tensors, layer)  # [1, S, ffn]
    down_weight = source.tensor(f"{prefix}.ffn_down.weight")
    residual = f"l{layer}.mlp_residual"
    if not arch.gemma:
        return builder.linear(hidden, down_weight, f"l{layer}.down", addend=x, output=residual)
    down = builder.linear(hidden, down_weight, f"l{layer}.down")
    down = _layer_norm(builder, source, down, layer, "post_ffw_norm")
    return builder.node("Add", [x, down], residual)


def _gated(builder: GraphBuilder, arch: Any, normed: str, tensors: list[Any], layer: int) -> str:
    """The gated MLP's hidden state as separate nodes: one product of gate and up stacked, a
    Split, the activation, a Mul."""
    both = builder.linear_stacked(normed, tensors, f"l{layer}.gate_up")  # [1, S, 2 * ffn]
    width = arch.intermediate_size
    halves = builder.constant(f"l{layer}.halves", np.array([width, width]))
    gate, up = f"l{layer}.gate", f"l{layer}.up"
    from onnx import helper

    builder.nodes.append(
        helper.make_node("Split", [both, halves], [gate, up], name=f"l{layer}.split", axis=-1)
    )
    if arch.gemma:  # GELU with llama.cpp's tanh approximation
        activated = builder.node("Gelu", [gate], f"l{layer}.gelu", approximate="tanh")
    else:  # SiLU
        activated = builder.node(
            "Mul", [gate, builder.node("Sigmoid", [gate], f"l{layer}.sig")], f"l{layer}.silu"
        )
    return builder.node("Mul", [activated, up], f"l{layer}.gated")


def _layer_norm(builder: GraphBuilder, source: WeightSource, x: str, layer: int, name: str) -> str:
    """RMSNorm with the layer's ``blk.{layer}.{name}.weight``."""
    weight = source.tensor(f"blk.{layer}.{name}.weight")
    return builder.rms_norm(x, weight, f"l{layer}.{name}", source.architecture.rms_norm_eps)


def build_graph(
    source: WeightSource,
    *,
    capacity: int | None,
    accuracy_level: int,
    dequantize: bool = False,
    kernel_types: frozenset[str] = frozenset(),
    attention: str = "auto",
    kv_cache: str = "auto",
    observe: ProgressObserver = ignore_progress,
    data: ExternalData | None = None,
) -> tuple[Any, GraphBuilder, KVLayout]:
    """The ONNX ModelProto, the builder (which knows what was quantized how) and the graph's
    KV layout; ``observe`` hears of each layer built. With ``data``, the large initializers
    are written there as they are made and the ModelProto refers to them. ``kv_cache``:
    "float16", "float32" or "auto" (float16 where the kernel attends, else float32).
    ``capacity``: the most positions the graph may run at (None: :func:`kv_layout`'s choice);
    the rotary tables hold that many rows, the KV buffers' length is the runtime's."""
    from onnx import TensorProto, helper

    arch = source.architecture
    builder = GraphBuilder(
        accuracy_level=accuracy_level, dequantize=dequantize, kernel_types=kernel_types, data=data
    )
    first = source.tensor("blk.0.attn_q.weight")
    # On the GGUF kernels a one-token step needs no padding for its products, and the
    # attention runs on their CacheAttention kernel, which gives a row the same bits in any
    # pass (ONNX Runtime's plain attention rounds a one-row pass apart from a multi-row one):
    # the whole step runs unpadded (docs/benchmarks/kernels.md, "Attention on edgespec's
    # kernel").
    on_kernels = builder.raw_blocks(first) is not None
    if attention == "auto":
        attention = "kernel" if on_kernels else "plain"
    if attention == "kernel" and not on_kernels:
        raise ConfigError(
            "--attention kernel runs on edgespec's GGUF kernels, which this import does not use "
            "(a float or --kernels mlas graph, or an install where they did not build)",
            fix="leave --attention at auto, or import a GGUF file with --kernels gguf",
        )
    if kv_cache == "float16" and attention != "kernel":
        raise ConfigError(
            "--kv-cache float16 needs edgespec's CacheAttention kernel, which this graph does "
            f"not use (attention {attention!r})",
            fix="leave --kv-cache at auto, or import a GGUF file with --kernels gguf",
        )
    layout = kv_layout(
        capacity, attention=attention, trained_length=arch.context_length, kv_cache=kv_cache
    )
    # The tables sit in the data file, which ONNX Runtime maps: a row costs memory once a
    # position that far is run, so a long table costs disk, not the short contexts' memory.
    caches = rotary_constants(builder, arch, layout.positions)
    x, tied = embedding(builder, source, IO["input_ids"])
    if arch.embedding_scale != 1.0:  # Gemma: the embedding times sqrt(hidden), in float32
        scale = builder.constant("embed.scale", np.float32(arch.embedding_scale))
        x = builder.node("Mul", [x, scale], "embed.scaled")
    position = (
        pass_position(
            builder, input_ids=IO["input_ids"], total_sequence_length=IO["total_sequence_length"]
        )
        if layout.kernel
        else None
    )
    for layer in range(arch.num_layers):
        x = decoder_layer(builder, source, x, layer, caches, position, layout.half_cache)
        source.release_pages()  # the layer's weights are in the data file
        observe(
            ProgressEvent(
                stage="graph", message="layers built", step=layer + 1, total=arch.num_layers
            )
        )
    # Every position's hidden state [1, S, hidden] before the final norm: a head on the target
    # drafts from it. The Gather below reads the same value, so asking for it computes nothing.
    features = builder.node("Identity", [x], IO["features"])
    # Each row's norm and head are computed from that row alone, so a row's logits do not
    # depend on which other rows are asked for.
    x = builder.node("Gather", [x, IO["logits_rows"]], "head_rows", axis=1)  # [1, R, hidden]
    x = builder.rms_norm(x, source.tensor("output_norm.weight"), "final_norm", arch.rms_norm_eps)
    logits = lm_head(builder, source, x, tied, logits=IO["logits"])
    kv: list[str | int] = [1, arch.num_kv_heads, "capacity", arch.head_dim]
    kv_type = TensorProto.FLOAT16 if layout.half_cache else TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info(IO["input_ids"], TensorProto.INT64, [1, "sequence"]),
        helper.make_tensor_value_info(IO["seqlens_k"], TensorProto.INT32, [1]),
        helper.make_tensor_value_info(IO["total_sequence_length"], TensorProto.INT32, []),
        helper.make_tensor_value_info(IO["logits_rows"], TensorProto.INT64, ["rows"]),
    ]
    outputs = [
        helper.make_tensor_value_info(logits, TensorProto.FLOAT, [1, "rows", arch.vocab_size]),
        helper.make_tensor_value_info(
            features, TensorProto.FLOAT, [1, "sequence", arch.hidden_size]
        ),
    ]
    for layer in range(arch.num_layers):
        inputs += [helper.make_tensor_value_info(n, kv_type, kv) for n in past_names(layer)]
        outputs += [helper.make_tensor_value_info(n, kv_type, kv) for n in present_names(layer)]
    # Only a float graph fuses: with 8-bit activations (MatMulNBits at accuracy level 4) the
    # fused kernel's last-bit differences in the norm change how activations round, which
    # flipped a near-tie in the default model's answer to "What is the capital of France?".
    nodes = builder.nodes if builder.quantized else fuse_residual_norms(builder.nodes)
    graph = helper.make_graph(nodes, "edgespec-gguf", inputs, outputs, builder.initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
        + ([helper.make_opsetid(GGUF_DOMAIN, 1)] if builder.kernel_ops else []),
        producer_name="edgespec",
    )
    model.ir_version = 10
    return model, builder, layout
