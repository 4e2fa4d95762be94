"""Verification by an OpenAI-compatible serving engine: llama.cpp's ``llama-server``, vLLM,
and engines that echo prompts with log-probabilities (llama-cpp-python's server).

:class:`OpenAITarget` finds out which engine answers (``engine_probe``). llama-server and vLLM
verify each round by batched prompts (``engine_rounds``, ``prompt_batch``): the k + 1 prompts
"history + the first i drafted tokens" in one request, token ids end to end, the engine's work
per round bounded by the draft, not the history. Other engines verify by echo, with this
``echo_verifier``'s :class:`OpenAIVerifier`:

An echoing engine's legacy ``/v1/completions`` returns the
prompt with log-probabilities: sending ``history + draft`` with ``echo``, ``logprobs=1``,
``max_tokens=1`` and temperature 0 returns, for every prompt position, the target's top token
there and the log-probability of the token we sent, plus the engine's own greedy next token.
A drafted token is accepted while it is the target's top token; the first one that is not is
replaced by the top token, and when all are accepted the engine's next token is the bonus.
That is greedy verification, so the output equals the engine's own greedy output.
llama-cpp-python reuses its KV cache by longest prefix, so the resent history costs it little
compute; the bytes grow with the history. (vLLM skips its prefix cache for prompt
log-probabilities: every echo would recompute the history, which is why vLLM verifies by
batched prompts.)

Two kinds of echoing engines:
- token-id prompts: the prompt travels as token ids and ``return_tokens_as_token_ids``
  names every token as ``token_id:N``. Nothing is re-tokenized, nothing is ambiguous.
- text prompts (llama-cpp-python's server): the engine re-tokenizes the text it is sent and
  names tokens by their text. That is exact only while our tokens are the engine's own
  tokenization of their text. Every round checks the echoed tokens against ours, and a top
  token whose text several tokens share is settled by echoing each candidate (the one with
  the top log-probability is the engine's); where neither works the round raises
  :class:`OpenAIMismatchError` before anything unverified is committed.

Echo is greedy only: log-probabilities of the top tokens are not the whole distribution that
lossless rejection sampling needs (llama-server and ``edgespec serve`` verify sampled drafts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgespec.errors import ConfigError, RemoteError, RemoteUnavailableError
from edgespec.protocol.server_info import ChatFormat, ServerInfo
from edgespec.runtime.verifiers.engine_probe import (
    ECHO,
    LLAMA_SERVER,
    VLLM,
    VOCABULARY_PROBE,
    LlamaServerProps,
    check_vocabulary,
    is_vllm,
    llama_server_props,
    llama_server_round_cost,
)
from edgespec.runtime.verifiers.engine_rounds import (
    llama_server_round,
    openai_prompts_round,
    sampled_support_size,
)
from edgespec.runtime.verifiers.http import Connection, TrafficMeter, raise_for_status
from edgespec.runtime.verifiers.openai_echo import (
    Echo,
    TokenPieces,
)
from edgespec.runtime.verifiers.prompt_batch import PromptBatchVerifier

#: How far a recomputed log-probability may drift (a different batch shape on the engine).
LOGPROB_TOLERANCE = 1e-3
PROMPT_FORMATS = ("auto", "ids", "text")
#: The context assumed of an engine that does not tell its own (all but llama-server).
DEFAULT_CONTEXT = 2048
#: Candidates echoed at most to settle which token a shared text names.
MAX_CANDIDATES = 4


class OpenAITarget(Connection):
    """An OpenAI-compatible engine at ``url`` (with or without its ``/v1``) serving ``model``
    (default: the first of ``GET /v1/models``). ``prompt_format`` "ids" sends token ids,
    "text" sends text, "auto" tries ids once and falls back to text when they are refused.
    ``max_length`` bounds a generation (default: llama-server's context per slot, else
    :data:`DEFAULT_CONTEXT`); ``max_k`` the draft length (llama-server: also its slots less one).
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
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(
                f"unknown prompt format {prompt_format!r}", fix=f"use one of {PROMPT_FORMATS}"
            )
        base = url.rstrip("/")
        super().__init__(base[: -len("/v1")] if base.endswith("/v1") else base, **connection)
        self._model = model
        self.prompt_format = prompt_format
        self.max_length = max_length or DEFAULT_CONTEXT
        self._max_length_given = max_length is not None
        self.max_k = max_k
        self._engine: str | None = None
        self._props: LlamaServerProps | None = None
        self._info: ServerInfo | None = None
        self._checked_vocabulary = False
        self._checked_echo = False
        self._vllm = False

    @property
    def model(self) -> str:
        if self._model is None:
            exchange = self.request("GET", "/v1/models")
            self.check_peer(exchange, "/v1/models")
            raise_for_status(exchange, "GET /v1/models", peer=self.peer)
            models = exchange.data.get("data") if isinstance(exchange.data, dict) else None
            if not models:
                raise RemoteError(
                    f"{self.peer} {self.url} lists no models",
                    fix="start the engine with a model, or pass the model name",
                )
            self._model = str(models[0]["id"])
            self._vllm = is_vllm(exchange.data)
        return self._model

    @property
    def greedy_only(self) -> bool:
        """Only llama-server returns the distribution it samples from (``post_sampling_probs``);
        echoed or batched log-probabilities elsewhere show the top token, not the whole
        distribution."""
        return self.engine() != LLAMA_SERVER

    def engine(self) -> str:
        """Which engine answers (``engine_probe``): asked once, before the first generation."""
        if self._engine is None:
            self._props = llama_server_props(self)
            if self._props is not None:
                self._engine = LLAMA_SERVER
            else:
                self.model  # noqa: B018 (asks GET /v1/models, which says whether it is vLLM)
                self._engine = VLLM if self._vllm else ECHO
        return self._engine

    def info(self) -> ServerInfo:
        """What the engine's cost model and limits need. llama-server: the context of one
        slot, k up to its slots less one (a round takes k + 1), and its measured cost of a round
        of w prompts. Other engines report no costs: a round is priced as one round trip
        whatever k is, and ``AutoK`` learns from the rounds."""
        if self._info is not None:
            return self._info
        max_length, max_k = self.max_length, self.max_k
        step_s, verify_cost = 0.0, (1.0,) * (self.max_k + 1)
        if self.engine() == LLAMA_SERVER:
            props = self._props
            assert props is not None
            if props.total_slots < 2:
                raise RemoteError(
                    f"llama-server at {self.url} has {props.total_slots} slot: a verification "
                    "round sends k + 1 prompts at once and needs at least 2",
                    fix="restart it with -np 5 -c 10240 --no-cache-idle-slots (k + 1 slots for "
                    "each device that drafts k tokens, no --kv-unified; docs/serving.md)",
                )
            max_k = min(max_k, props.total_slots - 1)
            if props.slot_context:
                given = max_length if self._max_length_given else props.slot_context
                max_length = min(given, props.slot_context)
            step_s, verify_cost = llama_server_round_cost(self, max_k)
        self._info = ServerInfo(
            vocab_size=0,
            max_length=max_length,
            eos_token_ids=(),
            tokenizer_sha256="",
            max_k=max_k,
            target_step_s=step_s,
            verify_cost=verify_cost,
        )
        return self._info

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
        (``engine_probe.check_vocabulary``)."""
        if self._checked_vocabulary:
            return
        encoded = pieces.tokenizer.encode(VOCABULARY_PROBE, add_special_tokens=False)
        check_vocabulary(self, self.model, list(encoded.ids))
        self._checked_vocabulary = True

    def prompt_batch_verifier(self, pieces: TokenPieces) -> PromptBatchVerifier:
        """One generation's verifier by batched prompts (llama-server, vLLM)."""
        self.check_vocabulary(pieces)
        info = self.info()
        if self.engine() == LLAMA_SERVER:
            return PromptBatchVerifier(
                round_request=lambda prompts, sampling, meter, uncached: llama_server_round(
                    self, prompts, sampling, meter, timeout_s=self.round_deadline(uncached)
                ),
                max_length=info.max_length,
                suggested_k=info.max_k,
                sampled=True,
                sampled_fix="",
                check_sampling=sampled_support_size,
            )
        return PromptBatchVerifier(
            round_request=lambda prompts, sampling, meter, uncached: openai_prompts_round(
                self, self.model, prompts, meter, timeout_s=self.round_deadline(uncached)
            ),
            max_length=info.max_length,
            suggested_k=info.max_k,
            sampled=False,
            sampled_fix="use temperature 0 with vLLM (its log-probabilities are not the "
            "distribution it samples from), or verify on llama-server or 'edgespec serve'",
        )

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

    def check_echo(self, pieces: TokenPieces) -> None:
        """Refuses, once and before any generation, an engine that is neither llama-server nor
        vLLM and does not echo prompts with log-probabilities either (Ollama's OpenAI routes,
        a proxy to a hosted API): every round would fail."""
        if self._checked_echo:
            return
        probe = list(pieces.tokenizer.encode(VOCABULARY_PROBE, add_special_tokens=False).ids)[:4]
        try:
            self.echo(probe, pieces, TrafficMeter())
        except RemoteUnavailableError:
            raise
        except RemoteError as error:
            raise RemoteError(
                f"{self.url} is neither llama-server nor vLLM, and it does not echo prompts "
                f"with log-probabilities, which verification needs ({error.problem})",
                fix="verify on llama.cpp's llama-server, vLLM, 'edgespec serve', or "
                "llama-cpp-python's server started with --logits_all true",
            ) from error
        self._checked_echo = True

    def echo(self, token_ids: Sequence[int], pieces: TokenPieces, meter: TrafficMeter) -> Echo:
        """One ``/v1/completions`` request that echoes ``token_ids`` with log-probabilities
        and adds the engine's greedy next token.

        Under "auto" the first request offers token ids once, without retries: engines that
        do not take them answer with an error (llama-cpp-python: HTTP 500 for a validation
        error), and from then on this target sends text."""
        if self.prompt_format == "auto":
            try:
                exchange = meter.record(
                    self.request(
                        "POST", "/v1/completions", self._body(token_ids, pieces, "ids"), retry=False
                    )
                )
            except RemoteUnavailableError:
                exchange = None
            if exchange is not None and exchange.status < 400:
                self.prompt_format = "ids"
                return Echo.from_json(exchange.data)
            self.prompt_format = "text"
        body = self._body(token_ids, pieces, self.prompt_format)
        exchange = meter.record(self.request("POST", "/v1/completions", body))
        raise_for_status(exchange, "a verification request", peer=self.peer)
        return Echo.from_json(exchange.data)

    def _body(
        self, token_ids: Sequence[int], pieces: TokenPieces, prompt_format: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": 1,
            "temperature": 0.0,
            "echo": True,
            "logprobs": 1,
            # llama-cpp-python penalises repeats unless told not to; greedy is argmax.
            "repeat_penalty": 1.0,
        }
        if prompt_format == "ids":
            body["prompt"] = list(token_ids)
            body["return_tokens_as_token_ids"] = True
        else:
            body["prompt"] = pieces.text(token_ids)
        return body
