"""Verification by echo, for OpenAI-compatible engines that are neither llama-server nor vLLM
(llama-cpp-python's server).

An echoing engine's legacy ``/v1/completions`` returns the prompt with log-probabilities:
sending ``history + draft`` with ``echo``, ``logprobs=1``, ``max_tokens=1`` and temperature 0
returns, for every prompt position, the target's top token there and the log-probability of
the token we sent, plus the engine's own greedy next token. A drafted token is accepted while
it is the target's top token; the first one that is not is replaced by the top token, and when
all are accepted the engine's next token is the bonus. That is greedy verification, so the
output equals the engine's own greedy output. llama-cpp-python reuses its KV cache by longest
prefix, so the resent history costs it little compute; the bytes grow with the history. (vLLM
skips its prefix cache for prompt log-probabilities: every echo would recompute the history,
which is why vLLM verifies by batched prompts.)

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

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import (
    ConfigError,
    OpenAIMismatchError,
    RemoteError,
    RemoteUnavailableError,
)
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.pieces import REPLACEMENT_CHARACTER, TokenPieces
from edgespec.runtime.remote.target import OpenAIConnection
from edgespec.runtime.remote.transport import Traffic, TrafficMeter, raise_for_status
from edgespec.runtime.remote.vocabulary import VOCABULARY_PROBE
from edgespec.runtime.verifiers.base import Verdict

#: How far a recomputed log-probability may drift (a different batch shape on the engine).
LOGPROB_TOLERANCE = 1e-3
PROMPT_FORMATS = ("auto", "ids", "text")
#: Candidates echoed at most to settle which token a shared text names.
MAX_CANDIDATES = 4


def detect(target: OpenAIConnection) -> EchoEngine:
    """Any engine: echo is what is left when no other engine is recognised (the first
    generation's check refuses one that does not echo either)."""
    return EchoEngine(target, prompt_format=target.prompt_format)


class EchoEngine:
    """An OpenAI-compatible engine that verifies by echo (llama-cpp-python's server): the
    last of the registry's engines, taken when no other is recognised. ``prompt_format``
    "ids" sends token ids, "text" sends text, "auto" tries ids once and falls back to text
    when they are refused."""

    name = "echo"
    #: Echoed log-probabilities of the top tokens are not the whole distribution.
    greedy_only = True

    def __init__(self, target: OpenAIConnection, *, prompt_format: str = "auto") -> None:
        if prompt_format not in PROMPT_FORMATS:
            raise ConfigError(
                f"unknown prompt format {prompt_format!r}", fix=f"use one of {PROMPT_FORMATS}"
            )
        self.target = target
        self.prompt_format = prompt_format
        self._checked_echo = False

    def info(self, described: ServerInfo) -> ServerInfo:
        """Nothing to add: an echo round is priced as one round trip whatever k is."""
        return described

    def verifier(self, pieces: TokenPieces) -> EchoVerifier:
        self.check_echo(pieces)
        return EchoVerifier(self, pieces)

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
                f"{self.target.url} is neither llama-server nor vLLM, and it does not echo prompts "
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
                    self.target.request(
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
        exchange = meter.record(self.target.request("POST", "/v1/completions", body))
        raise_for_status(exchange, "a verification request", peer=self.target.peer)
        return Echo.from_json(exchange.data)

    def _body(
        self, token_ids: Sequence[int], pieces: TokenPieces, prompt_format: str
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.target.model,
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


class EchoVerifier:
    """One greedy generation verified by echo on ``engine`` (see the module text).

    ``pieces`` holds the draft's tokenizer, which must be the engine model's."""

    def __init__(self, engine: EchoEngine, pieces: TokenPieces) -> None:
        self.engine = engine
        self.pieces = pieces
        self.max_length = engine.target.max_length
        self.suggested_k = engine.target.max_k
        self.meter = TrafficMeter()
        self._history: list[int] = []

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        if not sampling.greedy:
            raise ConfigError(
                "an OpenAI-compatible engine verifies greedy drafts only: its top "
                "log-probabilities are not the whole distribution that lossless sampling needs",
                fix="use temperature 0, or verify on 'edgespec serve'",
            )
        self._history = list(prompt)

    def _sendable(self, draft: Sequence[int]) -> tuple[int, ...]:
        """The longest prefix of ``draft`` that can travel: no BOS (engines hide it in the
        echo), and as text only up to a whole character."""
        tokens = list(draft)
        for index, token in enumerate(tokens):
            if token in self.pieces.bos_ids:
                del tokens[index:]
                break
        if self.engine.prompt_format != "ids":
            # Whether the text ends inside a character depends on its last character only
            # (at most 4 bytes, so at most the last 4 tokens): decode a tail, not the history.
            tail = self._history[-4:]
            while tokens and self.pieces.text(tail + tokens).endswith(REPLACEMENT_CHARACTER):
                tokens.pop()
        if all(token in self.pieces.bos_ids for token in self._history):
            tokens = []  # the first entry carries no log-probabilities: nothing to judge
        return tuple(tokens)

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        if last_token != self._history[-1]:
            raise ValueError(f"last token {last_token} is not the history's {self._history[-1]}")
        started = time.perf_counter()
        drafted = self._sendable(draft.tokens)
        sequence = self._history + list(drafted)
        echo = self.engine.echo(sequence, self.pieces, self.meter)
        alignment = align(sequence, echo, self.pieces)
        if alignment.matched < len(self._history) and drafted:
            # The draft's first tokens merged with the history's last ones in the engine's
            # tokenization: send the history alone and take the engine's next token.
            drafted, sequence = (), list(self._history)
            echo = self.engine.echo(sequence, self.pieces, self.meter)
            alignment = align(sequence, echo, self.pieces)
        if alignment.matched < len(self._history):
            raise history_mismatch(alignment.matched, sequence, self.pieces)
        tokens: list[int] = []
        for offset, token in enumerate(drafted):
            position = len(self._history) + offset
            entry = alignment.entries.get(position)
            top = None if entry is None else echo.top_logprobs[entry]
            own = None if entry is None else echo.token_logprobs[entry]
            if top is None:
                raise OpenAIMismatchError(f"the engine gave no log-probabilities at {position}")
            key, best = top_token(top)
            if position < alignment.matched and own is not None and own >= best:
                tokens.append(token)
                continue
            # Rejected, or the engine's text parted from ours here: either way the target's
            # own token at this position ends the round.
            tokens.append(self._name(key, sequence[:position], best))
            break
        else:
            tokens.append(self._next_token(echo, alignment, sequence))
        self._history.extend(tokens)
        elapsed = self.meter.round(started, server_s=None)
        return Verdict(tokens=tuple(tokens), n_accepted=len(tokens) - 1, elapsed_s=elapsed)

    def _next_token(self, echo: Echo, alignment: Alignment, sequence: list[int]) -> int:
        """The engine's greedy token after the whole sequence (the bonus token)."""
        last_entry = max(alignment.entries.values(), default=-1)
        if len(echo.tokens) == last_entry + 2:
            key = echo.tokens[-1]
            own, top = echo.token_logprobs[-1], echo.top_logprobs[-1]
            if own is not None and top is not None and own < top_token(top)[1]:
                raise OpenAIMismatchError(
                    f"the engine's next token {key!r} is not its own top token: it did not "
                    "decode greedily, or its log-probabilities are shifted by one position "
                    "(llama-cpp-python does that when no BOS token starts the prompt)",
                    fix="start prompts with the model's BOS token, or use another engine",
                )
            return self._name(key, sequence, own)
        if echo.finish_reason == "stop" and self.pieces.eos_ids:
            return self.pieces.eos_ids[0]  # the engine stopped at EOS without listing it
        raise RemoteError(
            f"the engine returned no next token (finish reason {echo.finish_reason!r})"
        )

    def _name(self, key: str, prefix: list[int], best: float | None) -> int:
        """The token the engine named ``key`` after ``prefix``, where its log-probability
        was ``best``. A text several tokens share is settled by echoing each candidate after
        the prefix: the one whose log-probability there is ``best`` is the engine's token."""
        candidates = self.pieces.candidates(key)
        if len(candidates) == 1:
            return candidates[0]
        for token in candidates[:MAX_CANDIDATES]:
            if best is None:
                break
            probe = [*prefix, token]
            echo = self.engine.echo(probe, self.pieces, self.meter)
            alignment = align(probe, echo, self.pieces)
            if alignment.matched < len(probe):
                continue  # this candidate does not survive the trip as text
            own = echo.token_logprobs[alignment.entries[len(prefix)]]
            if own is not None and abs(own - best) <= LOGPROB_TOLERANCE * max(1.0, abs(best)):
                return token
        raise OpenAIMismatchError(
            f"the engine's token {key!r} cannot be named exactly: "
            f"{len(candidates)} tokens of the draft's vocabulary have that text",
            fix="serve the target on an engine that returns token ids (vLLM with "
            "return_tokens_as_token_ids), or on 'edgespec serve'",
        )

    def traffic(self) -> Traffic:
        return self.meter.traffic()

    def work(self) -> None:
        """The peer does not report what it computed per round."""

    def close(self) -> None:
        """Nothing to release: an engine keeps no session for us."""


@dataclass(frozen=True, kw_only=True)
class Echo:
    """An echoed completion: per entry, the engine's token name, its log-probability and the
    top tokens there (None where the engine gives none, the first entry)."""

    tokens: tuple[str, ...]
    token_logprobs: tuple[float | None, ...]
    top_logprobs: tuple[dict[str, float] | None, ...]
    finish_reason: str | None

    @classmethod
    def from_json(cls, data: Any) -> Echo:
        try:
            choice = data["choices"][0]
            logprobs = choice["logprobs"]
            tokens = tuple(str(t) for t in logprobs["tokens"])
            token_logprobs = tuple(
                None if v is None else float(v) for v in logprobs["token_logprobs"]
            )
            top_logprobs = tuple(
                None if top is None else {str(k): float(v) for k, v in top.items()}
                for top in logprobs["top_logprobs"]
            )
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise RemoteError(
                f"the engine's completion has no usable prompt log-probabilities ({error!r})",
                fix="verify on llama.cpp's llama-server, vLLM, 'edgespec serve', or an engine "
                "that echoes prompts with logprobs on /v1/completions (llama-cpp-python: "
                "start it with --logits_all true)",
            ) from error
        if not len(tokens) == len(token_logprobs) == len(top_logprobs):
            raise RemoteError("the engine's log-probability lists differ in length")
        return cls(
            tokens=tokens,
            token_logprobs=token_logprobs,
            top_logprobs=top_logprobs,
            finish_reason=choice.get("finish_reason"),
        )


@dataclass(frozen=True, kw_only=True)
class Alignment:
    """Where our tokens sit in an echo. ``matched``: how many leading positions the engine
    echoed as our tokens. ``entries``: the echo entry of each of those positions and of the
    first differing one, whose top tokens still depend on our tokens alone (causality)."""

    matched: int
    entries: dict[int, int]


def align(sequence: Sequence[int], echo: Echo, pieces: TokenPieces) -> Alignment:
    """Lines ``sequence`` up with ``echo``: engines list every prompt token (vLLM) or every
    one but BOS (llama-cpp-python), then the next token."""
    best = Alignment(matched=-1, entries={})
    for hidden in (frozenset(), pieces.bos_ids):
        shown = [i for i, token in enumerate(sequence) if token not in hidden]
        count = 0
        while count < min(len(shown), len(echo.tokens)) and pieces.matches(
            echo.tokens[count], sequence[shown[count]]
        ):
            count += 1
        matched = shown[count] if count < len(shown) else len(sequence)
        if matched > best.matched:
            last = min(count + 1, len(shown), len(echo.tokens))
            best = Alignment(matched=matched, entries={shown[e]: e for e in range(last)})
    return best


def history_mismatch(
    position: int, sequence: Sequence[int], pieces: TokenPieces
) -> OpenAIMismatchError:
    return OpenAIMismatchError(
        f"the engine tokenized the committed text differently from us at position {position} "
        f"(our token {pieces.pieces[sequence[position]]!r}): a text-prompt engine re-tokenizes "
        "what it is sent, and the target's own tokens here are not that tokenization",
        fix="serve the target on an engine that takes token-id prompts (vLLM), or on "
        "'edgespec serve'",
    )


def top_token(entry: dict[str, float]) -> tuple[str, float]:
    return max(entry.items(), key=lambda item: item[1])
