""":class:`GraphDriver`: runs an exported graph's passes in one ONNX Runtime session, through
the forward path (:mod:`edgespec.graph.paths`) that the graph's kind and IO binding pick when
the driver is built. The runtime's models and the exporters' checks both drive graphs with it,
so a checked graph runs at export exactly as it will on a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ConfigError
from edgespec.graph.concat_paths import ConcatBound, ConcatReference
from edgespec.graph.kernels import register_gguf_kernels
from edgespec.graph.kv_cache import KVCache, SharedKVCache
from edgespec.graph.paths import (
    ForwardPath,
    GraphSizes,
    SharedBound,
    SharedPath,
    SharedReference,
)
from edgespec.manifest import GraphSpec


class GraphDriver:
    """``forward(token_ids, cache) -> logits``: runs the tokens after the cache's ``length``
    tokens, advances the cache and returns logits [len(token_ids), vocab] (float32).

    ``bound`` picks IO binding (logits are then a view valid until the next call) or the plain
    path; ``device`` puts an in-place graph's bound caches on an ONNX Runtime device ("cuda").
    Caches come from :meth:`new_cache`; a cache of another path's kind does not fit.
    """

    def __init__(
        self,
        session: Any,
        graph: GraphSpec,
        sizes: GraphSizes,
        *,
        bound: bool,
        device: str | None = None,
        label: str = "the graph",
    ) -> None:
        self.session = session
        self.graph = graph
        self._label = label
        self._path: ForwardPath[Any]
        if graph.kv_sharing == "shared":
            kind = SharedBound if bound else SharedReference
            self._path = kind(session, graph, sizes, label=label, device=device)
        else:
            self._path = (ConcatBound if bound else ConcatReference)(
                session, graph, sizes, label=label
            )

    def new_cache(self) -> KVCache:
        """An empty cache of the kind this driver's path writes."""
        return self._path.new_cache()

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, *, last_only: bool = False
    ) -> np.ndarray:
        """Logits [len(token_ids), vocab] for the tokens after ``cache.length``, or with
        ``last_only`` the last token's [1, vocab] (a graph with a ``logits_rows`` input then
        runs its LM head on that row, not on every row of the pass)."""
        if len(token_ids) < 1:
            raise ValueError("forward needs at least one token")
        return self._path.forward(token_ids, cache, last_only=last_only)

    def forward_features(
        self,
        token_ids: Sequence[int],
        cache: KVCache,
        *,
        last_only: bool = False,
        feature_input: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`forward`'s logits and the graph's features [len(token_ids), hidden]: each
        token's hidden state after the last layer (an in-place graph with a ``features``
        output; others raise :class:`~edgespec.errors.ConfigError`). A head's graph takes
        ``feature_input`` [len(token_ids), hidden] too."""
        if not isinstance(self._path, SharedPath):
            raise ConfigError(
                f"{self._label} has no in-place cache and returns no features",
                fix="import the model as a GGUF file or with the in-place exporter",
            )
        if len(token_ids) < 1:
            raise ValueError("forward needs at least one token")
        assert isinstance(cache, SharedKVCache)  # the path's own kind (new_cache)
        return self._path.forward_features(
            token_ids, cache, last_only=last_only, feature_input=feature_input
        )

    @property
    def has_features(self) -> bool:
        """Whether the graph returns features (:meth:`forward_features`)."""
        return self.graph.features is not None and isinstance(self._path, SharedPath)

    def greedy(self, prompt: Sequence[int], count: int) -> list[int]:
        """``count`` tokens of greedy continuation of ``prompt`` (one pass over the prompt,
        then one token per pass)."""
        cache = self.new_cache()
        logits = self.forward(prompt, cache, last_only=True)
        produced = [int(np.argmax(logits[-1]))]
        while len(produced) < count:
            logits = self.forward(produced[-1:], cache)
            produced.append(int(np.argmax(logits[-1])))
        return produced


def check_session(graph_path: Path) -> Any:
    """A CPU session of ``graph_path`` with ONNX Runtime's warnings off, as the exporters'
    checks and a distillation teacher run a graph."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    register_gguf_kernels(options, required=False)
    return onnxruntime.InferenceSession(
        str(graph_path), options, providers=["CPUExecutionProvider"]
    )
