"""The draft model as a drafter: k single-token steps of a small LM on its own KV cache."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.manifest import UNSCORED_LOGIT
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.sampling import keyed_race, probabilities, sample


class ModelDrafter:
    """Drafts with a :class:`OnnxModel`.

    The cache holds every committed token the draft has seen; ``_pending`` holds the committed
    tokens it has not seen yet (one normally, two after a fully accepted draft: its own last
    token was never fed back, and the target's next token follows it). ``stop_probability``
    ends a proposal early when the draft's probability for its own token falls below it.
    """

    def __init__(self, model: OnnxModel, *, vocab_size: int, stop_probability: float = 0.0) -> None:
        self.model = model
        #: The target's vocabulary size: draft rows are cut or padded to it, so q_draft lines
        #: up with p_target and no id the target lacks is ever proposed.
        self.vocab_size = vocab_size
        self.stop_probability = stop_probability
        self.cache = model.take_cache()  # given back by close() for the next generation
        self._pending: list[int] = []
        self._proposed: tuple[int, ...] = ()
        self._seen = 0
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)
        #: The ids the draft's head scores, found at its first sampled step (empty: all).
        self._scored_ids: np.ndarray | None = None

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        self._sampling, self._rng = sampling, rng
        self.model.start(prompt, self.cache)
        self._pending = [prompt[-1]]
        self._proposed = ()

    def propose(self, k: int) -> Draft:
        started = time.perf_counter()
        tokens: list[int] = []
        q_rows: list[np.ndarray] = []
        feed = self._pending
        seen = 0  # proposed tokens already fed into the cache
        steps = 0
        calls = min(k, self.model.max_length - self.cache.length - len(feed) + 1)
        for _ in range(max(calls, 0)):
            step = self.model.forward(feed, self.cache, last_only=True)
            logits = self._target_width(step[-1])
            steps += 1
            self._pending = []
            seen = len(tokens)
            token, q, confidence = self._pick(logits, self.cache.length)
            if tokens and confidence < self.stop_probability:
                break
            tokens.append(token)
            if q is not None:
                q_rows.append(q)
            feed = [token]
        self._proposed = tuple(tokens)
        self._seen = seen
        q_draft = np.stack(q_rows) if q_rows else None
        return Draft(
            tokens=self._proposed,
            q_draft=q_draft,
            elapsed_s=time.perf_counter() - started,
            steps=steps,
        )

    def propose_along(self, guess: Sequence[int]) -> Draft:
        """The draft's own proposal as far as it follows ``guess`` (a lookup's tokens), from
        one pass instead of a step per token.

        The pending tokens and the guess [g] go through the model at once; row i of the last
        g + 1 rows scores the token after guess[:i], and its draw is the draft's own token
        there. The proposal is the draws up to and including the first that differs from its
        guess token (g + 1 when none does): the tokens ``propose`` would draft one step at a
        time, since each draw sees the same context, at the cost of one pass over 1-2 + g
        positions. The cache keeps the guess tokens the proposal shares.
        """
        started = time.perf_counter()
        room = self.model.max_length - self.cache.length - len(self._pending)
        guess = [int(t) for t in guess[: max(room, 0)]]
        if not guess:
            return self.propose(1)
        fed = len(self._pending) + len(guess)
        rows = self.model.forward([*self._pending, *guess], self.cache)  # [fed, vocab]
        position = self.cache.length - len(guess)  # of the token after the pending ones
        tokens: list[int] = []
        q_rows: list[np.ndarray] = []
        for i in range(len(guess) + 1):
            logits = self._target_width(rows[fed - len(guess) - 1 + i])
            token, q, confidence = self._pick(logits, position + i)
            if tokens and confidence < self.stop_probability:
                break
            tokens.append(token)
            if q is not None:
                q_rows.append(q)
            if i == len(guess) or token != guess[i]:
                break
        # Every proposed token but the last is a guess token the cache holds (a step-by-step
        # proposal never feeds its last token either); the guess tokens after them go.
        seen = len(tokens) - 1
        self.cache.crop(self.cache.length - (len(guess) - seen))
        self._pending = []
        self._proposed, self._seen = tuple(tokens), seen
        return Draft(
            tokens=self._proposed,
            q_draft=np.stack(q_rows) if q_rows else None,
            elapsed_s=time.perf_counter() - started,
            steps=1,
        )

    def _pick(self, logits: np.ndarray, position: int) -> tuple[int, np.ndarray | None, float]:
        """The draft's token at absolute ``position`` from its logits [vocab_target], its
        distribution when sampling (None when greedy) and its own probability of the token
        (1.0 when greedy without ``stop_probability``)."""
        if self._sampling.greedy:
            # The hot path: no probability row is needed to pick the argmax.
            token = int(np.argmax(logits))
            return token, None, self._softmax_at(logits, token) if self.stop_probability else 1.0
        token, q = self._sampled(logits, position)
        return token, q, float(q[token])

    def _target_width(self, logits: np.ndarray) -> np.ndarray:
        """The draft's logits [vocab_draft] as [vocab_target]: cut, or padded with -inf."""
        if len(logits) >= self.vocab_size:
            return logits[: self.vocab_size]
        return np.concatenate([logits, np.full(self.vocab_size - len(logits), -np.inf)])

    def _sampled(self, logits: np.ndarray, position: int) -> tuple[int, np.ndarray]:
        """A token drawn from the draft's distribution, and that distribution [vocab_target].

        A draft with a reduced output vocabulary scores N of the ids (32,768 of 151,936 for the
        catalog's Qwen draft) and gives the rest ``UNSCORED_LOGIT``, whose probability is
        exactly 0: the row is formed and drawn over the N scored ids, then spread back to full
        width, which costs a fraction of a draw over the full row
        (docs/benchmarks/qwen-vs-llama-cpp.md, "On a 2-core AVX-512 Xeon")."""
        if self._scored_ids is None:
            scored = np.flatnonzero(logits != np.float32(UNSCORED_LOGIT))  # [N]
            self._scored_ids = scored if len(scored) < len(logits) else np.empty(0, np.int64)
        if not len(self._scored_ids):
            q = probabilities(logits, self._sampling)  # [vocab_target]
            return self._draw(q, position), q
        scored_q = probabilities(logits[self._scored_ids], self._sampling)  # [N]
        q = np.zeros(len(logits), dtype=np.float64)
        q[self._scored_ids] = scored_q
        return int(self._scored_ids[self._draw(scored_q, position, self._scored_ids)]), q

    def _draw(self, q: np.ndarray, position: int, ids: np.ndarray | None = None) -> int:
        """An index into ``q`` (its token ids ``ids``, else its indices) for the token at
        absolute ``position``."""
        if self._sampling.mode == "match":
            # Racing with the target's keyed variables for that position (keyed by token id)
            # makes the draws coincide whenever the two distributions are close, which is
            # what match verification accepts.
            return keyed_race(q, self._sampling.seed, position, ids)
        return sample(q, self._rng)

    @staticmethod
    def _softmax_at(logits: np.ndarray, token: int) -> float:
        """The draft's own probability of ``token`` under its raw distribution."""
        shifted = np.exp(logits - logits[token])
        return float(1.0 / shifted.sum())

    def close(self) -> None:
        self.model.keep_cache(self.cache)

    def catch_up(
        self, accepted: Sequence[int], next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        """Committed tokens another drafter proposed: fed with the next proposal's first pass
        (``features``, the verdict's, are for drafters that read them)."""
        if self._proposed:
            raise ValueError("commit the draft model's own proposal first")
        self._pending.extend(int(t) for t in accepted)
        self._pending.append(next_token)

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        proposed = self._proposed
        if not 0 <= n_accepted <= len(proposed):
            raise ValueError(f"{n_accepted} accepted of a {len(proposed)}-token draft")
        if not proposed:
            self._pending.append(next_token)
            return
        # The cache holds the old pending tokens and proposed[:seen]; keep what was accepted.
        seen = self._seen
        if n_accepted <= seen:
            self.cache.crop(self.cache.length - (seen - n_accepted))
            self._pending = [next_token]
        else:  # the whole draft was accepted: its last token was never fed
            self._pending = [proposed[-1], next_token]
        self._proposed = ()
