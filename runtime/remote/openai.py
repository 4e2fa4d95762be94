"""Verification by an OpenAI-compatible serving engine: llama.cpp's ``llama-server``, vLLM,
and engines that echo prompts with log-probabilities (llama-cpp-python's server).

:class:`OpenAITarget` is the connection and what every such engine shares (its model listing,
the tokenizer check, the chat format where the engine tells it, a round's deadline). Which
engine answers is asked once, before the first generation, of the registry :data:`ENGINES`:
each engine's module (:mod:`.llama_server`, :mod:`.vllm`, :mod:`.echo`) recognises its engine
and builds what differs: its limits and costs, and the verifier of one generation. Adding an
engine is one module with a ``detect(target)`` and one line in :data:`ENGINES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from edgespec.errors import RemoteError, RemoteUnavailableError
from edgespec.protocol.server_info import ChatFormat, ServerInfo
from edgespec.runtime.remote import echo, llama_server, vllm
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.target import MeteredVerifier, OpenAIEngine
from edgespec.runtime.remote.transport import Connection, raise_for_status
from edgespec.runtime.remote.vocabulary import VOCABULARY_PROBE, check_vocabulary

#: The context assumed of an engine that does not tell its own (all but llama-server).
DEFAULT_CONTEXT = 2048

#: The engines, asked in order whether they answer at a URL (the last takes any engine).
ENGINES: tuple[Callable[[OpenAITarget], OpenAIEngine | None], ...] = (
    llama_server.detect,
    vllm.detect,
    echo.detect,
)


class OpenAITarget(Connection):
    """An OpenAI-compatible engine at ``url`` (with or without its ``/v1``) serving ``model``
    (default: the first of ``GET /v1/models``). ``prompt_format`` is an echoing engine's
    (:class:`~edgespec.runtime.remote.echo.EchoEngine`). ``max_length`` bounds a generation
    (default: llama-server's context per slot, else :data:`DEFAULT_CONTEXT`); ``max_k`` the
    draft length (llama-server: also its slots less one).
    """

    peer = "the serving engine"
    fix = (
        "check that the engine (llama-server, vLLM, llama-cpp-python's server) runs there, or "
        "use --fallback local/draft"
    )
    health_path = "/v1/models"
    kind = "an OpenAI-compatible server"
    kind_fix = (
        "pass the engine's base URL (e.g. http://127.0.0.1:8000), or --remote-api edgespec "
        "for 'edgespec serve'"
    )
    api = "openai"

    def __init__(
        self,
        url: str,
        *,
        model: str | None = None,
        prompt_format: str = "auto",
        max_length: int | None = None,
        max_k: int = 8,
        **connection: Any,
    ) -> None:
        if prompt_format not in echo.PROMPT_FORMATS:
            echo.EchoEngine(self, prompt_format=prompt_format)  # raises, naming the formats
        base = url.rstrip("/")
        super().__init__(base[: -len("/v1")] if base.endswith("/v1") else base, **connection)
        self._model = model
        self.prompt_format = prompt_format
        self.max_length = max_length or DEFAULT_CONTEXT
        self.max_length_given = max_length is not None
        self.max_k = max_k
        self._models: Any = None
        self._engine: OpenAIEngine | None = None
        self._info: ServerInfo | None = None
        self._checked_vocabulary = False

    def models(self) -> Any:
        """The engine's ``GET /v1/models`` answer (asked once)."""
        if self._models is None:
            exchange = self.request("GET", "/v1/models")
            self.check_peer(exchange, "/v1/models")
            raise_for_status(exchange, "GET /v1/models", peer=self.peer)
            self._models = exchange.data
        return self._models

    @property
    def model(self) -> str:
        if self._model is None:
            listing = self.models()
            models = listing.get("data") if isinstance(listing, dict) else None
            if not models:
                raise RemoteError(
                    f"{self.peer} {self.url} lists no models",
                    fix="start the engine with a model, or pass the model name",
                )
            self._model = str(models[0]["id"])
        return self._model

    def serving_engine(self) -> OpenAIEngine:
        """The engine that answers, from :data:`ENGINES` (asked once)."""
        if self._engine is None:
            self._engine = next(e for e in (d(self) for d in ENGINES) if e is not None)
        return self._engine

    def engine(self) -> str:
        """The name of the engine that answers ("llama-server", "vllm", "echo")."""
        return self.serving_engine().name

    @property
    def greedy_only(self) -> bool:
        """Whether the engine verifies greedy drafts only (all but llama-server, whose
        ``post_sampling_probs`` is the distribution it samples from)."""
        return self.serving_engine().greedy_only

    def info(self) -> ServerInfo:
        """What the k policy and the limits need: the context, k, and the engine's measured
        cost of a round where it is measured (llama-server). An engine that reports no costs
        prices a round as one round trip whatever k is, and ``AutoK`` learns from the rounds."""
        if self._info is None:
            described = ServerInfo(
                vocab_size=0,
                max_length=self.max_length,
                eos_token_ids=(),
                tokenizer_sha256="",
                max_k=self.max_k,
                target_step_s=0.0,
                verify_cost=(1.0,) * (self.max_k + 1),
            )
            self._info = self.serving_engine().info(described)
        return self._info

    def verifier(self, pieces: Callable[[], TokenPieces]) -> MeteredVerifier:
        """One generation's verifier, as the engine verifies (the draft's tokenizer checked
        against the engine's once, first)."""
        token_pieces = pieces()
        self.check_vocabulary(token_pieces)
        return self.serving_engine().verifier(token_pieces)

    def round_deadline(self, uncached: int) -> float:
        """A round's deadline: the connection's, plus twice the time the engine would take to
        compute ``uncached`` prompt tokens at the per-token cost of its measured widest round
        (a first round after a long history computes it once per slot)."""
        info = self.info()
        widest = len(info.verify_cost)
        per_token_s = info.target_step_s * info.verify_cost[-1] / (widest * (widest + 1) / 2)
        return self.timeout_s + 2.0 * uncached * per_token_s

    def check_vocabulary(self, pieces: TokenPieces) -> None:
        """Refuses, once, a draft whose tokenizer is not the served model's
        (:func:`~edgespec.runtime.remote.vocabulary.check_vocabulary`)."""
        if self._checked_vocabulary:
            return
        encoded = pieces.tokenizer.encode(VOCABULARY_PROBE, add_special_tokens=False)
        check_vocabulary(self, self.model, list(encoded.ids))
        self._checked_vocabulary = True

    def chat_format(self) -> ChatFormat | None:
        """The target's chat format where the engine tells it, else None: ``edgespec serve``
        answers it in ``GET /v1/verify/info``, llama.cpp's server in ``GET /props``. Asked
        once each, without retries; an engine that answers neither (vLLM, llama-cpp-python)
        leaves chat formatting to the draft's template."""
        for path in ("/v1/verify/info", "/props"):
            try:
                exchange = self.request("GET", path, retry=False)
            except RemoteUnavailableError:
                return None
            data = exchange.data if exchange.status == 200 else None
            if isinstance(data, dict) and isinstance(data.get("chat"), dict):
                return ChatFormat.from_json(data["chat"])
            if isinstance(data, dict) and isinstance(data.get("chat_template"), str):
                return ChatFormat(
                    template=data["chat_template"],
                    bos_token=str(data.get("bos_token") or ""),
                    eos_token=str(data.get("eos_token") or ""),
                )
        return None
