"""One ONNX Runtime session for one bundle: providers, session options, and ``forward``.

``forward(token_ids, cache) -> logits`` runs the tokens after the cache's ``length`` tokens,
advances the cache and returns logits [len(token_ids), vocab] (float32), through the
:class:`~edgespec.graph.driver.GraphDriver` built with the model: IO binding (the present KV
written straight into the cache's buffers and the logits into a preallocated buffer, a view
valid until the next call) or the plain path (``session.run``), chosen once.

Measured by benchmarks/session_paths.py (docs/benchmarks/export.md, "Quantization and verify
cost: a 14M pair"), the plain path is as fast or faster, so it is the default for
optimum's graphs, whose bound buffers live in host memory: on a GPU provider their
KV cache crosses to the host every step. The in-place graphs (``kv_sharing`` "shared") are
bound by default, and on CUDA their cache lives on the GPU (:attr:`OnnxModel.kv_device`): only
the token ids and lengths go up and the logits come down. Tests check that the paths agree. No
speculation logic lives here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import BundleError, ConfigError
from edgespec.graph.driver import GraphDriver
from edgespec.graph.kernels import register_gguf_kernels, uses_gguf_kernels
from edgespec.graph.kv_cache import KVCache
from edgespec.graph.paths import PREFILL_CHUNK, GraphSizes
from edgespec.graph.window import EXTERNAL_DATA_FOLDER, windowed_graph
from edgespec.manifest import Bundle, GraphSpec
from edgespec.runtime.prefix import HeldTokens

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
    #: The context to run at, within the bundle's (``Manifest.context``); None: the default
    #: (4,096, or the model's own if shorter). The in-place cache is allocated for it.
    max_length: int | None = None
    #: ONNX Runtime's CPU memory arena keeps the largest pass's buffers for the session's
    #: life; off, they go back to the system after each pass (a server's choice).
    memory_arena: bool = True
    #: Whether passes keep the graph's batch invariance (one-token steps padded to its
    #: narrowest pass, passes cut at its attention boundaries), so that every position gets
    #: the same bits whichever pass computes it. A target needs it (greedy speculative output
    #: equals target-only output); a draft does not (the target checks whatever it proposes),
    #: so a draft runs its one-token steps unpadded.
    exact_passes: bool = True
    #: Whether the spinning threads stop when a pass ends instead of spinning on for the next
    #: kernel: a session beside another one on the same cores (a target beside a threaded
    #: draft) otherwise keeps those cores busy through the other session's pass.
    stop_spinning_after_run: bool = False
    #: A draft's attention over the last this many positions (and the first
    #: :data:`~edgespec.graph.window.SINK`) instead of its whole history, so that its step
    #: does not grow with the context; 0: the whole history. Only edgespec's CacheAttention
    #: graphs (GGUF imports) take one; never a target's (its passes must be exact).
    attention_window: int = 0


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


def open_session(
    bundle: Bundle,
    options: Any,
    providers: Sequence[str],
    graph_path: Path | None = None,
    graph_bytes: bytes | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of the bundle's graph (or of ``graph_path``, a copy
    of it; or ``graph_bytes``, an edited copy of ``graph_path`` whose weights stay in the files
    beside it). A graph ONNX Runtime cannot load (damaged after its checksum was written, or
    from a newer opset) is a bundle problem: one line naming the file, not ONNX Runtime's
    traceback."""
    import onnxruntime

    register_gguf_kernels(
        options, required=uses_gguf_kernels(bundle.manifest.quantization.op_types)
    )
    graph_path = graph_path or bundle.graph_path
    source: str | bytes = str(graph_path)
    if graph_bytes is not None:
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(graph_path.parent))
        source = graph_bytes
    try:
        return onnxruntime.InferenceSession(source, options, providers=providers)
    except Exception as error:  # ORT raises its own classes (InvalidProtobuf, Fail, ...)
        first_line = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        raise BundleError(
            f"ONNX Runtime cannot load {graph_path}: {type(error).__name__} {first_line}",
            fix="re-export the bundle (edgespec export), or upgrade onnxruntime if it is older "
            "than the exporter's",
        ) from error


def check_graph_loads(bundle: Bundle) -> None:
    """Loads the bundle's graph once on the CPU (raises :class:`BundleError` if it cannot)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 4
    open_session(bundle, options, ["CPUExecutionProvider"])


def cpu_parts_under_cuda(
    graph: GraphSpec, op_types: Sequence[str], providers: Sequence[str]
) -> list[str]:
    """What of a graph the CUDA provider leaves to the CPU (none off CUDA), each with its fix."""
    if providers[0] != "CUDAExecutionProvider":
        return []
    parts = []
    float_attention = graph.kv_sharing == "shared" and graph.kv_dtype == "float32"
    if float_attention and not graph.half_attention_file:
        parts.append(
            "its attention (the bundle has no float16-attention graph; re-export it with this "
            "version's edgespec export)"
        )
    if uses_gguf_kernels(list(op_types)):
        parts.append(
            "its matrix products (edgespec's GGUF kernels are CPU code; re-import the GGUF "
            "with --kernels mlas)"
        )
    return parts


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
        self.max_length = manifest.context(options.max_length)
        #: The tokens each cache holds, for :meth:`start`'s reuse of a shared prefix.
        self.held = HeldTokens()
        self._kept_lock = threading.Lock()
        #: Prompt tokens the last :meth:`start` found in its cache and did not prefill again.
        self.reused_tokens = 0
        self.kv_dtype = np.dtype(self.graph.kv_dtype)
        session_options = onnxruntime.SessionOptions()
        session_options.log_severity_level = 3
        session_options.inter_op_num_threads = 1
        #: The intra-op threads asked for (0: ONNX Runtime's default, one per core).
        self.intra_op_threads = options.intra_op_threads
        if options.intra_op_threads:
            session_options.intra_op_num_threads = options.intra_op_threads
        session_options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if options.spinning else "0"
        )
        if options.stop_spinning_after_run:
            session_options.add_session_config_entry("session.force_spinning_stop", "1")
        if not options.memory_arena or (bundle.manifest.extra.get("gguf") or {}).get(
            "output_vocabulary"
        ):
            # A draft's reduced head fills full-width logits around its scores: the arena kept
            # those prefill buffers, at no gain in speed (measured: docs/export.md, the reduced
            # head); freed, they go back to the system.
            session_options.enable_cpu_mem_arena = False
        self.requested_providers = choose_providers(providers)
        graph_path = bundle.graph_path
        self.half_attention = self.runs_attention_in_half(self.graph, self.requested_providers)
        if self.half_attention:
            assert self.graph.half_attention_file is not None
            graph_path = bundle.root / self.graph.half_attention_file
            self.graph = replace(self.graph, kv_dtype="float16")
            self.kv_dtype = np.dtype(np.float16)
        #: Under CUDA, the parts of this bundle's graph that still run on the CPU, in words.
        self.cpu_parts_under_cuda = cpu_parts_under_cuda(
            self.graph, manifest.quantization.op_types, self.requested_providers
        )
        windowed = (
            windowed_graph(graph_path, options.attention_window)
            if options.attention_window
            else None
        )
        #: The positions each pass attends over besides the sink (0: the whole history).
        self.attention_window = options.attention_window if windowed is not None else 0
        self.session = open_session(
            bundle, session_options, self.requested_providers, graph_path, windowed
        )
        self.released = False
        #: What really runs: ONNX Runtime falls back to CPU with only a log warning.
        self.providers = tuple(self.session.get_providers())
        self.fell_back = self.requested_providers[0] not in self.providers
        # The in-place graph is bound by default (its point is that nothing is copied).
        self.io_binding = self.shared_kv if options.io_binding is None else options.io_binding
        sizes = GraphSizes(
            kv_heads=manifest.model.num_kv_heads,
            head_dim=manifest.model.head_dim,
            vocab_size=self.vocab_size,
            hidden_size=manifest.model.hidden_size,
            # An older in-place graph's buffers have a fixed length (a shorter context uses
            # less of them); the others are allocated for the context.
            capacity=self.graph.kv_capacity or self.max_length,
        )
        self.driver = GraphDriver(
            self.session,
            self.graph
            if options.exact_passes
            else replace(self.graph, min_pass_width=1, attention_boundaries=()),
            sizes,
            bound=self.io_binding,
            device=self.kv_device,
            label=str(bundle.root),
        )

    @staticmethod
    def runs_attention_in_half(graph: GraphSpec, providers: Sequence[str]) -> bool:
        """Whether the session runs the graph's float16-attention copy: on CUDA, whose
        attention operator takes no float32."""
        return providers[0] == "CUDAExecutionProvider" and graph.half_attention_file is not None

    @property
    def shared_kv(self) -> bool:
        """Whether the graph writes its KV cache in place (one buffer per layer)."""
        return self.graph.kv_sharing == "shared"

    @property
    def kv_device(self) -> str | None:
        """Where a bound in-place cache lives: on the GPU when CUDA runs the session's
        attention (no copy of the cache per step, only of the logits), else in host memory
        (None), where a float32 attention that CUDA leaves to the CPU reads it in place."""
        on_cuda = bool(self.providers) and self.providers[0] == "CUDAExecutionProvider"
        on_gpu = on_cuda and self.half_attention
        return "cuda" if self.shared_kv and self.io_binding and on_gpu else None

    def release(self) -> None:
        """Lets go of the ONNX Runtime session and the driver that holds it (the engine's
        ``close``): the model cannot run afterwards. Releasing twice does nothing."""
        if self.released:
            return
        self.released = True
        del self.driver
        del self.session

    def new_cache(self) -> KVCache:
        """A cache for :meth:`forward` (the kind the graph and the session's path need)."""
        return self.driver.new_cache()

    def take_cache(self) -> KVCache:
        """The cache the last generation gave back (:meth:`keep_cache`), with what it holds,
        else a new one: a generation's holder takes it and no other holder shares it."""
        with self._kept_lock:  # two generations set up at once (a server's) never share it
            cache, self._kept = self._kept, None
        return cache if cache is not None else self.new_cache()

    def keep_cache(self, cache: KVCache) -> None:
        """Keeps ``cache`` for the next :meth:`take_cache`: the next prompt that starts with
        the same tokens is prefilled from where the two part."""
        with self._kept_lock:
            self._kept = cache

    _kept: KVCache | None = None

    def start(self, prompt: Sequence[int], cache: KVCache) -> int:
        """Feeds every prompt token but the last (which the first round feeds together with
        its draft), ``PREFILL_CHUNK`` tokens per pass, after the positions ``cache`` already
        holds for the same tokens (:class:`~edgespec.runtime.prefix.HeldTokens`); returns how
        many it reused. Nothing reads these passes' logits, so each asks for its last row
        only."""
        fed = prompt[:-1]
        reused = self.held.reusable(cache, fed)
        if reused:
            cache.crop(reused)
        else:
            cache.reset()
        for begin in range(reused, len(fed), PREFILL_CHUNK):
            self.forward(fed[begin : begin + PREFILL_CHUNK], cache, last_only=True)
        self.reused_tokens = reused
        return reused

    @property
    def has_features(self) -> bool:
        """Whether the graph returns the features a head on this target drafts from."""
        return self.driver.has_features

    def start_features(self, prompt: Sequence[int], cache: KVCache) -> np.ndarray:
        """:meth:`start`, and the features [len(prompt) - 1, hidden] of the tokens it fed."""
        cache.reset()
        fed = prompt[:-1]
        self.held.forget(cache)  # every position's features are asked for: none reused
        parts = [np.zeros((0, self.model.hidden_size), dtype=np.float32)]
        for begin in range(0, len(fed), PREFILL_CHUNK):
            chunk = fed[begin : begin + PREFILL_CHUNK]
            self._check_room(len(chunk), cache)
            parts.append(self.driver.forward_features(chunk, cache, last_only=True)[1])
        return np.concatenate(parts)

    def forward_features(
        self,
        token_ids: Sequence[int],
        cache: KVCache,
        *,
        last_only: bool = False,
        feature_input: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`forward`'s logits and the features [len(token_ids), hidden] of its tokens (a
        head's graph takes ``feature_input`` [len(token_ids), hidden] too)."""
        if len(token_ids) < 1:
            raise ValueError("forward needs at least one token")
        self._check_room(len(token_ids), cache)
        if feature_input is None:
            self.held.record(cache, cache.length, token_ids)
        else:  # a head's positions depend on the features it was given too
            self.held.forget(cache)
        return self.driver.forward_features(
            token_ids, cache, last_only=last_only, feature_input=feature_input
        )

    def _check_room(self, count: int, cache: KVCache) -> None:
        length = cache.length
        if length + count > self.max_length:
            raise ConfigError(
                f"{length + count} tokens exceed the context limit of {self.max_length} "
                f"of {self.bundle.root}",
                fix="use a shorter prompt or fewer new tokens, or load with a longer --context "
                f"(up to {self.bundle.manifest.context(self.model.max_length)})",
            )

    def forward(
        self, token_ids: Sequence[int], cache: KVCache, *, last_only: bool = False
    ) -> np.ndarray:
        """Logits [len(token_ids), vocab] for the tokens after ``cache.length``, or with
        ``last_only`` the last token's [1, vocab] (computed without the other rows' LM head
        where the graph allows it). On a bound graph the rows are a view of the session's
        output buffer, which its next pass overwrites: copy them to keep them."""
        if len(token_ids) < 1:
            raise ValueError("forward needs at least one token")
        # The context limit counts real tokens; an in-place graph's padding must fit its
        # buffers too (the driver checks it).
        self._check_room(len(token_ids), cache)
        self.held.record(cache, cache.length, token_ids)
        return self.driver.forward(token_ids, cache, last_only=last_only)
