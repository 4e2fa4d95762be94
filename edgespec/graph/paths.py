"""The four forward paths: a graph kind (``kv_sharing``) times IO binding or plain
``session.run``. Each makes its own kind of cache and runs passes on it; :class:`GraphDriver`
(:mod:`edgespec.graph.driver`) picks one when it is built.

* optimum's graphs ("concat": past in, past + new out), in :mod:`edgespec.graph.concat_paths`:

  * :class:`ConcatBound`: IO binding, so the present KV is written straight into a
    :class:`PingPongKVCache`'s other buffers and the logits into a preallocated buffer (a view,
    valid until the next call);
  * :class:`ConcatReference`: ``session.run``, presents fed back as pasts
    (:class:`ReferenceKVCache`).

* in-place graphs ("shared": edgespec's CacheAttention or ONNX Runtime's GroupQueryAttention
  over one :class:`SharedKVCache` buffer per layer): a pass of n tokens after ``length``
  positions writes positions length .. length + n - 1 of each buffer and returns logits
  [n, vocab]. A graph with a ``logits_rows`` input computes the logits of the rows it is given
  only: every row of a pass, or, for a caller that reads the last token's logits only (a
  prefill), the last row (:func:`head_rows`).

  * :class:`SharedBound`: past and present of a layer are bound to one ONNX Runtime value over
    the cache's buffer (or on the device), so nothing is copied; the logits go into a
    preallocated buffer (a view valid until the next call);
  * :class:`SharedReference`: ``session.run`` with numpy feeds; the returned presents are
    copied back into the buffers.

  Both cut a pass at the graph's ``attention_boundaries``
  (:func:`edgespec.graph.passes.pass_pieces`) and pad a piece narrower than its width by
  repeating its last token: the padded positions are written past ``length`` and overwritten
  by the next pass.

The bound and plain paths of a kind give identical logits (tests check it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from edgespec.errors import ConfigError
from edgespec.graph.kv_cache import SharedKVCache
from edgespec.graph.passes import pass_pieces
from edgespec.manifest import GraphSpec

#: Prompt tokens per prefill pass. A pass's activations grow with its width, and so do its
#: logits where it returns every row (width × vocab floats: 25 MB at 128 × 49,152, 177 MB for a
#: 900-token prompt in one pass); on 2 CPU cores chunks of 128 prefill as fast as one pass.
PREFILL_CHUNK = 128

Cache = TypeVar("Cache")


class ForwardPath(Protocol[Cache]):
    """One way of running a graph's passes, on the caches it makes."""

    def new_cache(self) -> Cache: ...

    def forward(
        self, token_ids: Sequence[int], cache: Cache, *, last_only: bool = False
    ) -> np.ndarray:
        """Logits [len(token_ids), vocab] (float32) for the one or more tokens after
        ``cache.length``, or with ``last_only`` the last token's [1, vocab] (a graph with a
        ``logits_rows`` input then computes no more rows than that needs); the cache advances
        past them."""
        ...


@dataclass(frozen=True, kw_only=True)
class GraphSizes:
    """What the manifest's graph record does not say: the KV heads and head size of a cache
    position, the vocabulary (the logits' width) and the positions a cache holds."""

    kv_heads: int
    head_dim: int
    vocab_size: int
    #: A concat cache's positions; a shared graph's buffers have the graph's fixed length.
    capacity: int
    #: The width of a ``features`` output row (0: the graph has none).
    hidden_size: int = 0


class GraphPath:
    """What every path knows: the session, the graph's I/O names and the sizes."""

    def __init__(self, session: Any, graph: GraphSpec, sizes: GraphSizes, *, label: str) -> None:
        self.session = session
        self.graph = graph
        self.sizes = sizes
        self.layers = len(graph.past_key)
        self.kv_dtype = np.dtype(graph.kv_dtype)
        #: Names the graph in errors (its bundle or file).
        self.label = label


def padded(token_ids: Sequence[int], width: int) -> list[int]:
    tokens = list(token_ids)
    return tokens + [tokens[-1]] * (width - len(tokens)) if len(tokens) < width else tokens


def pass_lengths(graph: GraphSpec, past: int, width: int) -> dict[str, np.ndarray]:
    """``seqlens_k`` and ``total_sequence_length`` for a pass of ``width`` tokens after
    ``past`` (padding included: its positions are written past the cache's length)."""
    assert graph.seqlens_k is not None and graph.total_sequence_length is not None
    return {
        graph.seqlens_k: np.array([past + width - 1], dtype=np.int32),
        graph.total_sequence_length: np.array(past + width, dtype=np.int32),
    }


def head_rows(
    graph: GraphSpec, width: int, real: int, *, last_only: bool
) -> tuple[dict[str, np.ndarray], int, slice]:
    """For a pass of ``width`` tokens, the first ``real`` of them real: the ``logits_rows``
    feed (none for a graph without that input, which computes every row), how many rows of
    logits the graph returns, and which of them the caller gets: the real ones, or with
    ``last_only`` the last real one. A last-only pass asks for the last ``min_pass_width``
    rows, because a head narrower than the graph's narrowest pass can round apart from the
    same row in a wider one (ONNX Runtime's one-row products): a row's logits keep their bits
    whichever rows are asked for. (Only a pass narrower than ``min_pass_width`` is padded, so
    those rows hold the last real one.)"""
    if graph.logits_rows is None:
        return {}, width, slice(real - 1, real) if last_only else slice(0, real)
    count = min(width, max(graph.min_pass_width, 1)) if last_only else width
    last = real - 1 - (width - count)
    returned = slice(last, last + 1) if last_only else slice(0, real)
    return {graph.logits_rows: np.arange(width - count, width, dtype=np.int64)}, count, returned


class SharedPath(GraphPath, ABC):
    """Cuts a pass into pieces the graph runs as one pass each; subclasses run a piece."""

    def __init__(
        self, session: Any, graph: GraphSpec, sizes: GraphSizes, *, label: str, device: str | None
    ) -> None:
        super().__init__(session, graph, sizes, label=label)
        #: Where new caches live: None for host memory, else an ONNX Runtime device ("cuda").
        self.device = device

    def new_cache(self) -> SharedKVCache:
        return SharedKVCache(
            layers=self.layers,
            kv_heads=self.sizes.kv_heads,
            head_dim=self.sizes.head_dim,
            capacity=self.sizes.capacity,
            dtype=self.kv_dtype,
            device=self.device,
        )

    def forward_features(
        self,
        token_ids: Sequence[int],
        cache: SharedKVCache,
        *,
        last_only: bool = False,
        feature_input: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`forward`'s logits, and the graph's features [len(token_ids), hidden] for every
        token of the pass (a copy: the caller keeps them). A head's graph also takes
        ``feature_input`` [len(token_ids), hidden], its one pass unpadded and uncut."""
        if self.graph.features is None:
            raise ConfigError(
                f"{self.label} returns no features (an older import, or a graph without an "
                "in-place cache)",
                fix="import the model again with this version (edgespec export), which adds them",
            )
        if (self.graph.feature_input is None) != (feature_input is None):
            raise ValueError("a head's graph takes feature_input, and no other graph does")
        if feature_input is not None:
            pieces = pass_pieces(
                cache.length,
                len(token_ids),
                self.graph.min_pass_width,
                self.graph.attention_boundaries,
            )
            if len(pieces) > 1 or pieces[0][2] != len(token_ids):
                raise ValueError("a head's passes run unpadded and uncut (min_pass_width 1)")
            self._feature_input = np.ascontiguousarray(feature_input[None], dtype=np.float32)
        parts: list[np.ndarray] = []
        self._collect = parts
        try:
            logits = self.forward(token_ids, cache, last_only=last_only)
        finally:
            self._collect = None
            self._feature_input = None
        return logits, np.concatenate(parts) if len(parts) > 1 else parts[0]

    #: Set for the length of one :meth:`forward_features` call.
    _collect: list[np.ndarray] | None = None
    _feature_input: np.ndarray | None = None

    def forward(
        self, token_ids: Sequence[int], cache: SharedKVCache, *, last_only: bool = False
    ) -> np.ndarray:
        graph = self.graph
        pieces = pass_pieces(
            cache.length, len(token_ids), graph.min_pass_width, graph.attention_boundaries
        )
        if len(pieces) > 1:  # the pass mixes attention regimes: run it in pieces
            return self._in_parts(token_ids, cache, [(b, e) for b, e, _ in pieces], last_only)
        width = pieces[0][2]
        written = cache.length + width
        if written > cache.capacity:
            raise ConfigError(
                f"a pass of {width} tokens after {cache.length} writes {written} positions "
                f"of a {cache.capacity}-position KV buffer in {self.label}",
                fix="stop one token earlier, or load with a longer --context",
            )
        return self.run(padded(token_ids, width), cache, real=len(token_ids), last_only=last_only)

    def _in_parts(
        self,
        token_ids: Sequence[int],
        cache: SharedKVCache,
        parts: list[tuple[int, int]],
        last_only: bool,
    ) -> np.ndarray:
        """The pass run as consecutive passes over ``parts`` (begin, end); with ``last_only``
        each asks for its last row only and the last part's is returned."""
        if last_only:
            for begin, end in parts[:-1]:
                self.forward(token_ids[begin:end], cache, last_only=True)
            begin, end = parts[-1]
            return self.forward(token_ids[begin:end], cache, last_only=True)
        return np.concatenate(
            [np.array(self.forward(token_ids[begin:end], cache)) for begin, end in parts]
        )

    @abstractmethod
    def run(
        self, tokens: list[int], cache: SharedKVCache, *, real: int, last_only: bool
    ) -> np.ndarray:
        """One pass of ``tokens``, the first ``real`` of them real and the rest padding."""


class SharedBound(SharedPath):
    def __init__(
        self, session: Any, graph: GraphSpec, sizes: GraphSizes, *, label: str, device: str | None
    ) -> None:
        super().__init__(session, graph, sizes, label=label, device=device)
        self._logits = np.zeros(0, dtype=np.float32)
        self._features = np.zeros(0, dtype=np.float32)

    def run(
        self, tokens: list[int], cache: SharedKVCache, *, real: int, last_only: bool
    ) -> np.ndarray:
        """The returned logits are a view valid until the next call."""
        graph, width, vocab = self.graph, len(tokens), self.sizes.vocab_size
        rows, count, returned = head_rows(graph, width, real, last_only=last_only)
        if self._logits.size < count * vocab:
            self._logits = np.zeros(count * vocab, dtype=np.float32)
        binding = self._binding(cache)
        binding.bind_cpu_input(graph.input_ids, np.asarray([tokens], dtype=np.int64))
        for name, value in (pass_lengths(graph, cache.length, width) | rows).items():
            binding.bind_cpu_input(name, value)
        if graph.feature_input is not None and self._feature_input is not None:
            binding.bind_cpu_input(graph.feature_input, self._feature_input)
        view = self._logits[: count * vocab].reshape(1, count, vocab)
        binding.bind_output(graph.logits, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
        features = self._bind_features(binding, width)
        self.session.run_with_iobinding(binding)
        cache.advance(real)
        if features is not None and self._collect is not None:
            self._collect.append(features[0, :real].copy())
        return view[0, returned]

    def _bind_features(self, binding: Any, width: int) -> np.ndarray | None:
        """The features buffer [1, width, hidden], bound for every pass of a graph that has
        the output: its value is the one the LM head reads, so binding it costs one copy of
        width x hidden floats, read only by :meth:`forward_features`."""
        name = self.graph.features
        if name is None:
            return None
        hidden = self.sizes.hidden_size
        if self._features.size < width * hidden:
            self._features = np.zeros(width * hidden, dtype=np.float32)
        view = self._features[: width * hidden].reshape(1, width, hidden)
        binding.bind_output(name, "cpu", 0, view.dtype, view.shape, view.ctypes.data)
        return view

    def _binding(self, cache: SharedKVCache) -> Any:
        """The cache's IO binding for this session, with every layer's past and present bound
        to the same buffer once; a pass rebinds only the token ids, the lengths and the
        logits."""
        if cache.binding is None or cache.binding[0] is not self.session:
            binding = self.session.io_binding()
            values = _ort_values(cache)
            graph = self.graph
            for kind, (past_names, present_names) in enumerate(
                ((graph.past_key, graph.present_key), (graph.past_value, graph.present_value))
            ):
                for layer, value in enumerate(values[kind]):
                    binding.bind_ortvalue_input(past_names[layer], value)
                    binding.bind_ortvalue_output(present_names[layer], value)
            cache.binding = (self.session, binding)
        return cache.binding[1]


def _ort_values(cache: SharedKVCache) -> list[list[Any]]:
    if cache.ort_values is None:
        import onnxruntime

        cache.ort_values = [
            [onnxruntime.OrtValue.ortvalue_from_numpy(buffer) for buffer in kind]
            for kind in cache.buffers
        ]
    return cache.ort_values


class SharedReference(SharedPath):
    def run(
        self, tokens: list[int], cache: SharedKVCache, *, real: int, last_only: bool
    ) -> np.ndarray:
        if not cache.buffers:
            raise ValueError("the plain path needs a cache in host memory (device=None)")
        graph = self.graph
        feeds: dict[str, np.ndarray] = {graph.input_ids: np.asarray([tokens], dtype=np.int64)}
        feeds.update(pass_lengths(graph, cache.length, len(tokens)))
        rows, _, returned = head_rows(graph, len(tokens), real, last_only=last_only)
        feeds.update(rows)
        if graph.feature_input is not None and self._feature_input is not None:
            feeds[graph.feature_input] = self._feature_input
        for kind, names in enumerate((graph.past_key, graph.past_value)):
            for layer, name in enumerate(names):
                feeds[name] = cache.buffers[kind][layer]
        outputs = [graph.logits, *graph.present_key, *graph.present_value]
        collect = self._collect is not None and graph.features is not None
        results = self.session.run(outputs + ([graph.features] if collect else []), feeds)
        layers = cache.layers
        for kind in (0, 1):
            for layer in range(layers):
                np.copyto(cache.buffers[kind][layer], results[1 + kind * layers + layer])
        cache.advance(real)
        if collect and self._collect is not None:
            self._collect.append(np.asarray(results[-1][0, :real], dtype=np.float32))
        return np.asarray(results[0][0, returned], dtype=np.float32)
