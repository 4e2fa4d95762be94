"""One ONNX Runtime session for one bundle: providers, session options, and ``forward``.

``forward(token_ids, cache) -> logits`` runs the tokens after the cache's ``length`` tokens,
advances the cache and returns logits [len(token_ids), vocab] (float32). Two paths exist:

* ``forward_bound``: IO binding, so the present KV is written straight into the cache's
  ping-pong buffers and the logits into a preallocated buffer (a view, valid until the next
  call);
* ``forward_reference``: the plain path (``session.run``, presents fed back as pasts).

Measured on the 2-core CPU this project is developed on (benchmarks/session_paths.py), the
plain path was as fast or faster (IO binding 0.83-1.05x of it), so it is the default for
those (optimum's) graphs, whose bound buffers live in host memory: on a GPU provider their
KV cache crosses to the host every step. The in-place graphs (``kv_sharing`` "shared",
:mod:`edgespec.runtime.shared_kv`) are bound by default, and on CUDA their cache lives on
the GPU (:attr:`OnnxModel.kv_device`): only the token ids and lengths go up and the logits
come down. Tests check that the paths agree. No speculation logic lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from edgespec.errors import BundleError, ConfigError
from edgespec.manifest import Bundle
from edgespec.passes import pass_pieces
from edgespec.runtime.kv_cache import KVCache, ReferenceKVCache, SharedKVCache
from edgespec.runtime.shared_kv import forward_shared, forward_shared_reference

#: The cache kinds :meth:`OnnxModel.forward` takes.
AnyCache = KVCache | ReferenceKVCache | SharedKVCache

#: Providers tried in order when the caller names none (TensorRT builds engines for minutes on
#: first use, so it is used only when asked for).
DEFAULT_PROVIDER_ORDER = (
    "CUDAExecutionProvider",
    "ROCMExecutionProvider",
    "CoreMLExecutionProvider",
    "CPUExecutionProvider",
)


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """Threading for one session. ``spinning`` off lets two sessions share cores politely."""

    intra_op_threads: int = 0
    spinning: bool = False
    #: None: the measured default, the plain path (see the module docstring).
    io_binding: bool | None = None
    #: A context shorter than the bundle's (a memory budget's admission); None: the bundle's.
    max_length: int | None = None
    #: ONNX Runtime's CPU memory arena keeps the largest pass's buffers for the session's
    #: life; off, they go back to the system after each pass (a server's choice).
    memory_arena: bool = True


def choose_providers(requested: Sequence[str] | None) -> list[str]:
    import onnxruntime

    available = onnxruntime.get_available_providers()
    if requested is None:
        return [name for name in DEFAULT_PROVIDER_ORDER if name in available]
    missing = [name for name in requested if name not in available]
    if missing:
        raise ConfigError(
            f"execution provider(s) {', '.join(missing)} are not available in this ONNX Runtime "
            f"build (available: {', '.join(available)})",
            fix="install the matching onnxruntime package (see README: Install) or pick an "
            "available provider",
        )
    return list(requested)


def open_session(bundle: Bundle, options: Any, providers: Sequence[str]) -> Any:
    """An ``onnxruntime.InferenceSession`` of the bundle's graph. A graph ONNX Runtime cannot
    load (damaged after its checksum was written, or from a newer opset) is a bundle problem:
    one line naming the file, not ONNX Runtime's traceback."""
    import onnxruntime

    try:
        return onnxruntime.InferenceSession(str(bundle.graph_path), options, providers=providers)
    except Exception as error:  # ORT raises its own classes (InvalidProtobuf, Fail, ...)
        first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise BundleError(
            f"ONNX Runtime cannot load {bundle.graph_path}: {type(error).__name__} {first_line}",
            fix="re-export the bundle (edgespec export), or upgrade onnxruntime if it is older "
            "than the exporter's",
        ) from error


def check_graph_loads(bundle: Bundle) -> None:
    """Loads the bundle's graph once on the CPU (raises :class:`BundleError` if it cannot)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    open_session(bundle, options, ["CPUExecutionProvider"])


#: Prompt tokens per prefill pass. A pass returns logits for every position (width × vocab
#: floats: 25 MB at 128 × 49,152, but 177 MB for a 900-token prompt in one pass) and its
#: activations grow with width too; on 2 CPU cores chunks of 128 prefill as fast as one pass.
PREFILL_CHUNK = 128


class OnnxModel:
    """An exported causal LM as an ONNX Runtime session, driven only by its manifest."""

    def __init__(
        self,
        bundle: Bundle,
        *,
        providers: Sequence[str] | None = None,
        options: ModelOptions = ModelOptions(),
    ) -> None:
        import onnxruntime

        manifest = bundle.manifest
        self.bundle = bundle
        self.graph = manifest.graph
        self.model = manifest.model
        self.vocab_size = manifest.model.vocab_size
        self.max_length = min(manifest.model.max_length, options.max_length or 1 << 62)
        self.kv_dtype = np.dtype(self.graph.kv_dtype)
        session_options = onnxruntime.SessionOptions()
        session_options.log_severity_level = 3
        session_options.inter_op_num_threads = 1
        if options.intra_op_threads:
            session_options.intra_op_num_threads = options.intra_op_threads
        session_options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if options.spinning else "0"
        )
        if not options.memory_arena or (bundle.manifest.extra.get("gguf") or {}).get(
            "output_vocabulary"
        ):
            # A draft's reduced head fills full-width logits around its scores: the arena kept
            # those prefill buffers (+118 MB after 128-token passes against +42 MB without it,
            # the step as fast); freed, they go back to the system.
            session_options.enable_cpu_mem_arena = False
        self.requested_providers = choose_providers(providers)
        self.session = open_session(bundle, session_options, self.requested_providers)
        #: What really runs: ONNX Runtime falls back to CPU with only a log warning.
        self.providers = tuple(self.session.get_providers())
        self.fell_back = self.requested_providers[0] not in self.providers
        # The in-place graph is bound by default (its point is that nothing is copied).
        self.io_binding = self.shared_kv if options.io_binding is None else options.io_binding
        self._binding = self.session.io_binding()
        self._logits_dtype = np.dtype(self.graph.logits_dtype)
        self._logits = np.zeros(0, dtype=self._logits_dtype)
        self._positions = np.arange(self.max_length + 1, dtype=np.int64)[None, :]
        self._mask = np.ones((1, self.max_length + 1), dtype=np.int64)

    @property
    def shared_kv(self) -> bool:
        """Whether the graph writes its KV cache in place (one buffer per layer)."""
        return self.graph.kv_sharing == "shared"

    @property
    def kv_device(self) -> str | None:
        """Where a bound in-place cache lives: on the GPU when CUDA runs the session (no copy
        of the cache per step, only of the logits), else in host memory (None)."""
        on_cuda = bool(self.providers) and self.providers[0] == "CUDAExecutionProvider"
        return "cuda" if self.shared_kv and self.io_binding and on_cuda else None

    def new_cache(self) -> AnyCache:
        """A cache for :meth:`forward` (the kind the graph and the session's path need)."""
        if self.shared_kv:
            return SharedKVCache(
                layers=self.model.num_layers,
                kv_heads=self.model.num_kv_heads,
                head_dim=self.model.head_dim,
                # The graph's buffers have a fixed length; a shrunk context uses less of them.
                capacity=self.graph.kv_capacity or self.model.max_length,
                dtype=self.kv_dtype,
                device=self.kv_device,
            )
        return self.new_bound_cache() if self.io_binding else self.new_reference_cache()

    def start(self, prompt: Sequence[int], cache: AnyCache) -> None:
        """Empties ``cache`` and feeds every prompt token but the last (which the first round
        feeds together with its draft), ``PREFILL_CHUNK`` tokens per pass."""
        cache.reset()
        fed = prompt[:-1]
        for begin in range(0, len(fed), PREFILL_CHUNK):
            self.forward(fed[begin : begin + PREFILL_CHUNK], cache)

    def forward(self, token_ids: Sequence[int], cache: AnyCache) -> np.ndarray:
        """Logits [len(token_ids), vocab] for the tokens after ``cache.length``."""
        if self.shared_kv:
            shared = cast(SharedKVCache, cache)
            pieces = pass_pieces(
                shared.length,
                len(token_ids),
                self.graph.min_pass_width,
                self.graph.attention_boundaries,
            )
            if len(pieces) > 1:  # the pass mixes attention regimes: run it in pieces
                return np.concatenate(
                    [np.array(self.forward(token_ids[b:e], cache)) for b, e, _ in pieces]
                )
            width = pieces[0][2]
            # The context limit counts real tokens; the padding and a folded graph's extra
            # rows must fit the buffers (checked below).
            self._check_room(shared.length, len(token_ids))
            written = shared.length + width * self.graph.kv_positions_per_token
            if written > shared.capacity and len(token_ids) > PREFILL_CHUNK:
                # A folded graph writes heads / kv_heads positions per token from the pass's
                # start; its buffers leave room for passes of PREFILL_CHUNK tokens.
                return np.concatenate(
                    [
                        np.array(self.forward(token_ids[begin : begin + PREFILL_CHUNK], cache))
                        for begin in range(0, len(token_ids), PREFILL_CHUNK)
                    ]
                )
            if written > shared.capacity:
                raise ConfigError(
                    f"a pass of {width} tokens after {shared.length} writes {written} positions "
                    f"of a {shared.capacity}-position KV buffer in {self.bundle.root}",
                    fix="stop one token earlier, or re-export with a larger --max-length",
                )
            if not self.io_binding:
                return forward_shared_reference(
                    self.session, self.graph, token_ids, shared, width=width
                )
            if self._logits.size < width * self.vocab_size:
                self._logits = np.zeros(width * self.vocab_size, dtype=np.float32)
            return forward_shared(
                self.session,
                self.graph,
                token_ids,
                shared,
                logits=self._logits,
                vocab=self.vocab_size,
                width=width,
            )
        if self.io_binding:
            return self.forward_bound(token_ids, cast(KVCache, cache))
        return self.forward_reference(token_ids, cast(ReferenceKVCache, cache))

    def new_bound_cache(self) -> KVCache:
        return KVCache(
            layers=self.model.num_layers,
            kv_heads=self.model.num_kv_heads,
            head_dim=self.model.head_dim,
            capacity=self.max_length,
            dtype=self.kv_dtype,
        )

    def new_reference_cache(self) -> ReferenceKVCache:
        return ReferenceKVCache(
            layers=self.model.num_layers,
            kv_heads=self.model.num_kv_heads,
            head_dim=self.model.head_dim,
            dtype=self.kv_dtype,
        )

    def _check_room(self, length: int, count: int) -> None:
        if count < 1:
            raise ValueError("forward needs at least one token")
        if length + count > self.max_length:
            raise ConfigError(
                f"{length + count} tokens exceed the context limit of {self.max_length} "
                f"of {self.bundle.root}",
                fix="use a shorter prompt or fewer new tokens, or re-export with a larger "
                "--max-length",
            )

    def forward_bound(self, token_ids: Sequence[int], cache: KVCache) -> np.ndarray:
        """The IO-binding path; the returned logits are a view valid until the next call."""
        count = len(token_ids)
        past = cache.length
        self._check_room(past, count)
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
            for layer in range(self.model.num_layers):
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
        needed = count * self.vocab_size
        if self._logits.size < needed:
            self._logits = np.zeros(needed, dtype=self._logits_dtype)
        logits = self._logits[:needed].reshape(1, count, self.vocab_size)
        binding.bind_output(
            graph.logits, "cpu", 0, self._logits_dtype, logits.shape, logits.ctypes.data
        )
        self.session.run_with_iobinding(binding)
        cache.advance(count)
        return logits[0] if self._logits_dtype == np.float32 else logits[0].astype(np.float32)

    def forward_reference(self, token_ids: Sequence[int], cache: ReferenceKVCache) -> np.ndarray:
        """The plain path: ``session.run`` with numpy feeds; presents replace the cache."""
        count = len(token_ids)
        past = cache.length
        self._check_room(past, count)
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
        layers = self.model.num_layers
        cache.arrays = [list(results[1 : 1 + layers]), list(results[1 + layers :])]
        return np.asarray(results[0][0], dtype=np.float32)
