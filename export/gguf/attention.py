"""The attention of an in-place GGUF graph, in the two forms a bundle may hold, and the KV
layout each needs.

* kernel (the CPU default wherever edgespec's GGUF kernels run): rotary, then edgespec's
  CacheAttention over the layer's in-place cache (CacheAttentionHalf over a float16 one, as
  llama.cpp keeps its cache). It gives a row the same bits in any pass, so a one-token step
  runs unpadded; it reads each position once per KV head, skips what a sliding window hides
  (docs/benchmarks/kernels.md, "Attention on edgespec's kernel").
* plain (graphs without the GGUF kernels: an install where they did not build, ``--kernels
  mlas``, float graphs, and the GPU, whose copy of the graph runs it in float16:
  :mod:`edgespec.export.half_attention`): ONNX Runtime's GroupQueryAttention with its own
  rotary over the packed Q, K, V. It rounds a one-row pass apart from a multi-row one, so the
  runtime pads a quantized graph's one-token step to two rows, and with some head widths its
  arithmetic changes at certain totals, where passes are cut
  (:mod:`edgespec.export.gguf.regimes`).

A pass of n tokens writes positions past .. past + n - 1 of each layer's buffer in both forms.
The buffers' length is not in the graph (its KV inputs are [1, kv_heads, "capacity", D]): the
runtime sizes them for the context it is asked for, up to the graph's rotary tables' length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgespec.errors import ConfigError
from edgespec.export.gguf.builder import GraphBuilder
from edgespec.export.gguf.rope import layer_tables

#: What ``--attention`` may ask for: "auto" is the kernel where the GGUF kernels run, else plain.
ATTENTION_FORMS = ("auto", "kernel", "plain")


@dataclass(frozen=True, kw_only=True)
class KVLayout:
    """How a graph keeps its KV: at most ``positions`` per layer (its rotary tables' length;
    the runtime allocates the buffers for the context it runs at)."""

    positions: int
    #: The attention runs on edgespec's CacheAttention kernel (``cache_attention``), which
    #: gives a row the same bits at any pass width: no padding, no rounding boundaries.
    kernel: bool = False
    #: The kernel's caches hold float16 (``CacheAttentionHalf``): half the memory, as
    #: llama.cpp keeps its cache.
    half_cache: bool = False

    @property
    def kv_dtype(self) -> str:
        return "float16" if self.half_cache else "float32"


#: Most positions of a plain-attention graph unless asked for more: its rounding boundaries
#: are probed over every total up to its length (:mod:`edgespec.export.gguf.regimes`), a cost
#: that grows with the square of the length.
PLAIN_POSITIONS = 2048


def kv_layout(
    positions: int | None,
    *,
    attention: str,
    trained_length: int,
    kv_cache: str = "auto",
) -> KVLayout:
    """The kernel's layout for ``attention`` "kernel" (its caches float16 unless ``kv_cache``
    is "float32"), plain attention's otherwise (a float32 cache). ``positions`` None: the
    model's ``trained_length`` where the kernel attends (it needs no probe), else
    :data:`PLAIN_POSITIONS`; never more than the trained length."""
    if attention == "kernel":
        most = min(positions or trained_length, trained_length)
        return KVLayout(positions=most, kernel=True, half_cache=kv_cache != "float32")
    return KVLayout(positions=min(positions or PLAIN_POSITIONS, trained_length))


def attention_boundaries(arch: Any, layout: KVLayout) -> tuple[int, ...]:
    """The totals at which this graph's GroupQueryAttention rounds differently on this machine
    (:func:`edgespec.export.gguf.regimes.probe_boundaries`, for its global and, with a
    sliding window, its local layers); none where the kernel attends, which gives a row the
    same bits at any total."""
    from edgespec.export.gguf.regimes import probe_boundaries

    if layout.kernel:
        return ()
    shape = {
        "heads": arch.num_heads,
        "kv_heads": arch.num_kv_heads,
        "head_dim": arch.head_dim,
        "capacity": layout.positions,
    }
    found = set(probe_boundaries(**shape))
    if arch.sliding_window:
        found |= set(probe_boundaries(**shape, window=arch.sliding_window))
    return tuple(sorted(found))


def plain_attention(
    builder: GraphBuilder,
    arch: Any,
    qkv: list[str],
    layer: int,
    caches: dict[str, str],
    kv: tuple[str, str, str, str],
    lengths: tuple[str, str],
) -> None:
    """GroupQueryAttention with its own rotary over ``qkv`` (packed [1, S, (heads + 2 kv_heads)
    × D] with two empty names, or the three apart) and the layer's in-place cache, as
    ``l{layer}.attn`` [1, S, heads × D]; ``kv``: the layer's past and present key and value;
    ``lengths``: the graph's seqlens_k and total_sequence_length."""
    from onnx import helper

    sliding = arch.is_sliding(layer)
    cos, sin = layer_tables(caches, arch, layer)
    if arch.rotary_dim and arch.rotary_dim % 16:
        raise ConfigError(
            f"ONNX Runtime's GroupQueryAttention rotates a multiple of 16 of each head's "
            f"dimensions; this model's heads turn {arch.rotary_dim} of {arch.head_dim}",
            fix="import a block-quantized file of it (Q8_0, Q4_K_M ...), whose attention "
            "runs on the GGUF kernels",
        )
    window: dict[str, Any] = {"local_window_size": arch.sliding_window} if sliding else {}
    past_key, past_value, present_key, present_value = kv
    attended = f"l{layer}.attn"
    builder.nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [*qkv, past_key, past_value, *lengths, cos, sin],
            [attended, present_key, present_value],
            name=attended,
            domain="com.microsoft",
            num_heads=arch.num_heads,
            kv_num_heads=arch.num_kv_heads,
            **softcap(arch),
            do_rotary=1,
            rotary_interleaved=int(arch.rope_interleaved),
            **window,
        )
    )


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
