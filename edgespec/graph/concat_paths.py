"""The forward paths of optimum's graphs ("concat": past in, past + new out), bound and plain;
:mod:`edgespec.graph.paths` has the protocol, the in-place paths and what they share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgespec.graph.kv_cache import PingPongKVCache, ReferenceKVCache
from edgespec.graph.paths import GraphPath, GraphSizes
from edgespec.manifest import GraphSpec


class ConcatBound(GraphPath):
    def __init__(self, session: Any, graph: GraphSpec, sizes: GraphSizes, *, label: str) -> None:
        super().__init__(session, graph, sizes, label=label)
        self._binding = session.io_binding()
        self._logits_dtype = np.dtype(graph.logits_dtype)
        self._logits = np.zeros(0, dtype=self._logits_dtype)
        self._positions = np.arange(sizes.capacity + 1, dtype=np.int64)[None, :]
        self._mask = np.ones((1, sizes.capacity + 1), dtype=np.int64)

    def new_cache(self) -> PingPongKVCache:
        return PingPongKVCache(
            layers=self.layers,
            kv_heads=self.sizes.kv_heads,
            head_dim=self.sizes.head_dim,
            capacity=self.sizes.capacity,
            dtype=self.kv_dtype,
        )

    def forward(
        self, token_ids: Sequence[int], cache: PingPongKVCache, *, last_only: bool = False
    ) -> np.ndarray:
        """The returned logits are a view valid until the next call."""
        count = len(token_ids)
        past = cache.length
        graph, binding = self.graph, self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input(graph.input_ids, np.asarray([token_ids], dtype=np.int64))
        if graph.attention_mask is not None:
            binding.bind_cpu_input(graph.attention_mask, self._mask[:, : past + count])
        if graph.position_ids is not None:
            binding.bind_cpu_input(
                graph.position_ids, np.ascontiguousarray(self._positions[:, past : past + count])
            )
        for kind, (past_names, present_names) in enumerate(
            ((graph.past_key, graph.present_key), (graph.past_value, graph.present_value))
        ):
            for layer in range(self.layers):
                binding.bind_cpu_input(past_names[layer], cache.past(kind, layer))
                present = cache.present(kind, layer, count)
                binding.bind_output(
                    present_names[layer],
                    "cpu",
                    0,
                    self.kv_dtype,
                    present.shape,
                    present.ctypes.data,
                )
        vocab = self.sizes.vocab_size
        if self._logits.size < count * vocab:
            self._logits = np.zeros(count * vocab, dtype=self._logits_dtype)
        logits = self._logits[: count * vocab].reshape(1, count, vocab)
        binding.bind_output(
            graph.logits, "cpu", 0, self._logits_dtype, logits.shape, logits.ctypes.data
        )
        self.session.run_with_iobinding(binding)
        cache.advance(count)
        rows = logits[0, -1:] if last_only else logits[0]
        return rows if self._logits_dtype == np.float32 else rows.astype(np.float32)


class ConcatReference(GraphPath):
    def new_cache(self) -> ReferenceKVCache:
        return ReferenceKVCache(
            layers=self.layers,
            kv_heads=self.sizes.kv_heads,
            head_dim=self.sizes.head_dim,
            dtype=self.kv_dtype,
        )

    def forward(
        self, token_ids: Sequence[int], cache: ReferenceKVCache, *, last_only: bool = False
    ) -> np.ndarray:
        count = len(token_ids)
        past = cache.length
        graph = self.graph
        feeds: dict[str, np.ndarray] = {graph.input_ids: np.asarray([token_ids], dtype=np.int64)}
        if graph.attention_mask is not None:
            feeds[graph.attention_mask] = np.ones((1, past + count), dtype=np.int64)
        if graph.position_ids is not None:
            feeds[graph.position_ids] = np.arange(past, past + count, dtype=np.int64)[None, :]
        for kind, names in enumerate((graph.past_key, graph.past_value)):
            for layer, name in enumerate(names):
                feeds[name] = cache.arrays[kind][layer]
        outputs = [graph.logits, *graph.present_key, *graph.present_value]
        results = self.session.run(outputs, feeds)
        layers = self.layers
        cache.arrays = [list(results[1 : 1 + layers]), list(results[1 + layers :])]
        return np.asarray(results[0][0, -1:] if last_only else results[0][0], dtype=np.float32)
