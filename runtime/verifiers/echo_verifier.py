"""One greedy generation verified by echo on an OpenAI-compatible engine that is neither
llama-server nor vLLM (llama-cpp-python's server): the history plus the draft, echoed with
log-probabilities (see ``openai_compat``'s module text)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, OpenAIMismatchError, RemoteError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.verifiers.base import Verdict
from edgespec.runtime.verifiers.http import Traffic, TrafficMeter
from edgespec.runtime.verifiers.openai_compat import (
    LOGPROB_TOLERANCE,
    MAX_CANDIDATES,
    OpenAITarget,
)
from edgespec.runtime.verifiers.openai_echo import (
    REPLACEMENT_CHARACTER,
    Alignment,
    Echo,
    TokenPieces,
    align,
    history_mismatch,
    top_token,
)


class OpenAIVerifier:
    """One greedy generation verified by an :class:`OpenAITarget` (see the module text).

    ``pieces`` holds the draft's tokenizer, which must be the engine model's."""

    def __init__(self, target: OpenAITarget, pieces: TokenPieces) -> None:
        self.target = target
        self.pieces = pieces
        self.max_length = target.max_length
        self.suggested_k = target.max_k
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
        if self.target.prompt_format != "ids":
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
        echo = self.target.echo(sequence, self.pieces, self.meter)
        alignment = align(sequence, echo, self.pieces)
        if alignment.matched < len(self._history) and drafted:
            # The draft's first tokens merged with the history's last ones in the engine's
            # tokenization: send the history alone and take the engine's next token.
            drafted, sequence = (), list(self._history)
            echo = self.target.echo(sequence, self.pieces, self.meter)
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
            echo = self.target.echo(probe, self.pieces, self.meter)
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
