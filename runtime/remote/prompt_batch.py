"""One generation verified on a serving engine by batched prompts (``engine_rounds``): each
round sends the k + 1 prompts "history + the first i drafted tokens" in one request and reads
the engine's next token (greedy) or its sampling distribution (sampled) after each.

Greedy rounds keep drafted tokens while each equals the engine's token after the ones before
it, then add the engine's token there: the output is the engine's own greedy output. Sampled
rounds apply the acceptance rules of a local verify pass (Leviathan et al.'s rejection sampling
with the draft's q, or the keyed ``match`` draws) to the distributions the engine returned, so
the output follows the engine's sampling distribution exactly. The client owns the history;
the engine keeps nothing for us but its prefix caches, so a lost or restarted engine costs a
recomputation, never a token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, RemoteError
from edgespec.runtime.acceptance import Acceptance, accept_match, accept_sampled
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.target import EngineWork
from edgespec.runtime.remote.transport import Traffic, TrafficMeter
from edgespec.runtime.verifiers.base import Verdict


@dataclass(frozen=True, kw_only=True)
class NextToken:
    """The engine's answer for one prompt: its next ``token``; for a sampled round the
    distribution it drew from (``support`` ids with ``probs``); the prompt tokens it computed
    (``computed``; -1 when it does not say) and its milliseconds for this prompt (None: not
    reported)."""

    token: int
    support: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    computed: int = -1
    server_ms: float | None = None


#: A round: the next token after each prompt, from one request, and the tokens of the prompts
#: the engine may have to compute (none of them cached: the first round), which its deadline
#: allows for.
RoundRequest = Callable[
    [Sequence[Sequence[int]], SamplingConfig, TrafficMeter, int], list[NextToken]
]


class PromptBatchVerifier:
    """Greedy and sampled verification by ``round_request`` (see the module text).

    ``sampled`` says whether the engine returns the distribution it samples from; where it does
    not, a sampled generation is refused at ``begin`` with ``sampled_fix``."""

    def __init__(
        self,
        *,
        round_request: RoundRequest,
        max_length: int,
        suggested_k: int,
        sampled: bool,
        sampled_fix: str,
        check_sampling: Callable[[SamplingConfig], object] = lambda sampling: None,
    ) -> None:
        self.round_request = round_request
        self.max_length = max_length
        #: The k the engine's slots allow a device alone; ``suggested_k`` is what this device
        #: takes now: halved when a round finds its slots taken by other clients (it then
        #: recomputes the history), grown back by one after each round that finds them kept.
        self.max_k = suggested_k
        self.suggested_k = suggested_k
        self.sampled = sampled
        self.sampled_fix = sampled_fix
        self.check_sampling = check_sampling
        self.meter = TrafficMeter()
        self._history: list[int] = []
        self._cached = 0
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)
        self._round_tokens: list[int] = []
        self._round_ms: list[float] = []

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        if not sampling.greedy:
            if not self.sampled:
                raise ConfigError(
                    "this engine does not return the distribution it samples from, which "
                    "lossless sampled verification needs",
                    fix=self.sampled_fix,
                )
            self.check_sampling(sampling)
        self._sampling, self._rng = sampling, rng
        # Nothing is sent yet: the first round's prompts compute the history in the slots
        # they land in, each slot once, and only as many slots as that round's k needs.
        self._history = list(prompt)
        self._cached = 0
        self._round_tokens, self._round_ms = [], []

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        if last_token != self._history[-1]:
            raise ValueError(f"last token {last_token} is not the history's {self._history[-1]}")
        started = time.perf_counter()
        drafted = list(draft.tokens)
        prompts = [self._history + drafted[:i] for i in range(len(drafted) + 1)]
        # Tokens no slot may hold yet: all of them in the first round, then what follows the
        # history every slot of the last round shared.
        uncached = sum(len(prompt) - self._cached for prompt in prompts)
        answers = self.round_request(prompts, self._sampling, self.meter, uncached)
        if self._cached:
            self._share_slots(max(answer.computed for answer in answers) >= self._cached)
        self._cached = len(self._history)
        acceptance = self._accept(draft, answers)
        self._history.extend(acceptance.tokens)
        self._round_tokens.append(sum(max(answer.computed, 0) for answer in answers))
        reported = [answer.server_ms for answer in answers if answer.server_ms is not None]
        # The prompts run in one batched pass: the slowest one's time is the round's.
        server_s = max(reported) / 1000.0 if reported else None
        if server_s is not None:
            self._round_ms.append(server_s * 1000.0)
        elapsed = self.meter.round(started, server_s=server_s)
        return Verdict(
            tokens=acceptance.tokens, n_accepted=acceptance.n_accepted, elapsed_s=elapsed
        )

    def _share_slots(self, taken: bool) -> None:
        """Backs off when other devices' rounds took this one's slots (the engine serves
        them all from one set of slots), and takes them back as they stay kept."""
        if taken:
            self.suggested_k = max(1, self.suggested_k // 2)
        else:
            self.suggested_k = min(self.max_k, self.suggested_k + 1)

    def _accept(self, draft: Draft, answers: list[NextToken]) -> Acceptance:
        drafted = draft.tokens
        if self._sampling.greedy:
            n_accepted = 0
            while n_accepted < len(drafted) and drafted[n_accepted] == answers[n_accepted].token:
                n_accepted += 1
            next_token = answers[n_accepted].token
            tokens = (*drafted[:n_accepted], next_token)
            return Acceptance(n_accepted=n_accepted, next_token=next_token, tokens=tokens)
        q_draft = draft.q_draft
        width = max(
            [q_draft.shape[1] if q_draft is not None else 0]
            + [max(answer.support, default=0) + 1 for answer in answers]
        )
        p_target = np.zeros((len(answers), width))  # [k + 1, vocab]
        for row, answer in enumerate(answers):
            if not answer.support:
                raise RemoteError("the engine returned no distribution for a sampled round")
            p_target[row, list(answer.support)] = answer.probs
            p_target[row] /= p_target[row].sum()  # its probabilities are rounded in JSON
        if self._sampling.mode == "match":
            position = len(self._history)
            return accept_match(drafted, p_target, seed=self._sampling.seed, position=position)
        if drafted and q_draft is None:
            raise ConfigError(
                "rejection sampling needs the draft's probabilities, and this drafter has none",
                fix="use sampling mode 'match' with the prompt-lookup drafter",
            )
        q = np.zeros((0, width)) if q_draft is None else _widen(q_draft, width)
        return accept_sampled(drafted, q, p_target, self._rng)

    def work(self) -> EngineWork:
        return EngineWork(
            round_tokens=tuple(self._round_tokens),
            round_server_ms=tuple(self._round_ms),
        )

    def traffic(self) -> Traffic:
        return self.meter.traffic()

    def close(self) -> None:
        """Nothing to release: the engine keeps no session for us."""


def _widen(rows: np.ndarray, width: int) -> np.ndarray:
    """``rows`` [n, v] padded with zero columns to [n, width] (a draft head smaller than the
    target's vocabulary gives the missing tokens q = 0)."""
    if rows.shape[1] >= width:
        return rows
    return np.pad(rows, ((0, 0), (0, width - rows.shape[1])))
