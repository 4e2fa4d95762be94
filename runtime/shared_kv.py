"""Passes of a graph whose KV cache is one in-place buffer per layer (``kv_sharing`` "shared",
GroupQueryAttention): a pass of n tokens after ``length`` positions writes positions
length .. length + n - 1 of each buffer and returns logits [n, vocab]. (A graph with folded
attention, ``kv_positions_per_token`` > 1, also writes zero rows after those, up to
length + n × kv_positions_per_token - 1; they lie past ``length`` and are overwritten too.)

* :func:`forward_shared`: IO binding; past and present of a layer are bound to one ONNX Runtime
  value over the cache's numpy buffer, so nothing is copied; the logits go into a preallocated
  buffer (a view valid until the next call).
* :func:`forward_shared_reference`: the plain path (``session.run`` with numpy feeds; the
  returned presents are copied back into the buffers), kept to test the fast path against.

Both pad a pass narrower than the graph's ``min_pass_width`` (or a given width: see
:func:`edgespec.passes.pass_pieces`) by repeating its last token: the
padded positions are written past ``length`` and overwritten by the next pass (a folded graph
is told which tokens are padding and leaves them out of attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgespec.manifest import GraphSpec
from edgespec.runtime.kv_cache import SharedKVCache


def padded(token_ids: Sequence[int], width: int) -> list[int]:
    tokens = list(token_ids)
    return tokens + [tokens[-1]] * (width - len(tokens)) if len(tokens) < width else tokens


def pass_lengths(graph: GraphSpec, past: int, real: int, width: int) -> dict[str, np.ndarray]:
    """``seqlens_k`` and ``total_sequence_length`` for a pass of ``width`` tokens after
    ``past``, the first ``real`` of them real and the rest padding: a folded graph
    (``kv_positions_per_token`` > 1) takes the real count in ``seqlens_k`` and runs attention
    on those tokens only; other graphs take every token as real."""
    assert graph.seqlens_k is not None and graph.total_sequence_length is not None
    counted = real if graph.kv_positions_per_token > 1 else width
    return {
        graph.seqlens_k: np.array([past + counted - 1], dtype=np.int32),
        graph.total_sequence_length: np.array(past + width, dtype=np.int32),
    }


def _ort_values(cache: SharedKVCache) -> list[list[Any]]:
    if cache.ort_values is None:
        import onnxruntime

        cache.ort_values = [
            [onnxruntime.OrtValue.ortvalue_from_numpy(buffer) for buffer in kind]
            for kind in cache.buffers
        ]
    return cache.ort_values


def _binding(session: Any, graph: GraphSpec, cache: SharedKVCache) -> Any:
    """The cache's IO binding for ``session``, with every layer's past and present bound to
    the same buffer once; a pass rebinds only the token ids, the lengths and the logits."""
    if cache.binding is None or cache.binding[0] is not session:
        binding = session.io_binding()
        values = _ort_values(cache)
        for kind, (past_names, present_names) in enumerate(
            ((graph.past_key, graph.present_key), (graph.past_value, graph.present_value))
        ):
            for layer, value in enumerate(values[kind]):
                binding.bind_ortvalue_input(past_names[layer], value)
                binding.bind_ortvalue_output(present_names[layer], value)
        cache.binding = (session, binding)
    return cache.binding[1]


def forward_shared(
    session: Any,
    graph: GraphSpec,
    token_ids: Sequence[int],
    cache: SharedKVCache,
    *,
    logits: np.ndarray,
    vocab: int,
    width: int | None = None,
) -> np.ndarray:
    """One bound pass, padded to ``width`` (default: the graph's ``min_pass_width``);
    ``logits`` is a flat float32 buffer of at least width × vocab."""
    tokens = padded(token_ids, width or graph.min_pass_width)
    binding = _binding(session, graph, cache)
    binding.bind_cpu_input(graph.input_ids, np.asarray([tokens], dtype=np.int64))
    lengths = pass_lengths(graph, cache.length, len(token_ids), len(tokens))
    for name, value in lengths.items():
        binding.bind_cpu_input(name, value)
    view = logits[: len(tokens) * vocab].reshape(1, len(tokens), vocab)
    binding.bind_output(graph.logits, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
    session.run_with_iobinding(binding)
    cache.advance(len(token_ids))
    return view[0, : len(token_ids)]


def forward_shared_reference(
    session: Any,
    graph: GraphSpec,
    token_ids: Sequence[int],
    cache: SharedKVCache,
    width: int | None = None,
) -> np.ndarray:
    if not cache.buffers:
        raise ValueError("the plain path needs a cache in host memory (device=None)")
    tokens = padded(token_ids, width or graph.min_pass_width)
    feeds: dict[str, np.ndarray] = {graph.input_ids: np.asarray([tokens], dtype=np.int64)}
    feeds.update(pass_lengths(graph, cache.length, len(token_ids), len(tokens)))
    for kind, names in enumerate((graph.past_key, graph.past_value)):
        for layer, name in enumerate(names):
            feeds[name] = cache.buffers[kind][layer]
    outputs = [graph.logits, *graph.present_key, *graph.present_value]
    results = session.run(outputs, feeds)
    layers = cache.layers
    for kind in (0, 1):
        for layer in range(layers):
            np.copyto(cache.buffers[kind][layer], results[1 + kind * layers + layer])
    cache.advance(len(token_ids))
    return np.asarray(results[0][0, : len(token_ids)], dtype=np.float32)
