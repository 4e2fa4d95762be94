"""A head on the target as a drafter: one decoder layer that drafts from the target's own
features, on its own small KV cache (EAGLE's drafter).

The head's cache holds one pair per committed position t: the token x_{t+1} and the target's
feature f_t. Its output at t is its guess of f_{t+1}, scored by the target's own final norm and
rows of the kept tokens: the draft of x_{t+2}. So a proposal's first token comes from the last
committed pair, and each further one from a step over (the token just drafted, the head's own
guess of the feature). On commit the guessed pairs are dropped (a crop) and the accepted tokens
go in again with the target's true features, in one pass whose last row drafts the next
round's first token.

Tokens outside the head's kept vocabulary are never proposed; as inputs they look up the
head's zero row. Exactness never depends on it: the target checks every proposal.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.manifest import UNSCORED_LOGIT
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.round import Draft

#: Pairs per pass of the head's prefill (its activations grow with the width).
PREFILL_PAIRS = 256


def kept_tokens(head: OnnxModel) -> np.ndarray:
    """The target token id of each of the head's scored rows (its ``vocabulary.json``)."""
    data = json.loads(head.bundle.tokenizer_path.read_text(encoding="utf-8"))
    return np.asarray(data["kept"], np.int64)


class HeadDrafter(ModelDrafter):
    """Drafts with a head bundle (``head``) beside its target; ``vocab_size`` is the
    target's. It reads the features the verifier hands ``begin`` and ``commit``."""

    def __init__(self, head: OnnxModel, *, vocab_size: int, stop_probability: float = 0.0) -> None:
        super().__init__(head, vocab_size=vocab_size, stop_probability=stop_probability)
        self.kept = kept_tokens(head)  # [N]
        #: Each target token's row in the head's table: its index among the kept, else N.
        self.rows = np.full(vocab_size, len(self.kept), np.int64)
        self.rows[self.kept] = np.arange(len(self.kept))
        #: The last pass's scores of the kept tokens [N] and its guess of the next feature
        #: [hidden]: what the next proposal starts from (None before the first features).
        self._scores: np.ndarray | None = None
        self._guess: np.ndarray | None = None
        #: Positions of the head's cache that hold committed pairs (true features).
        self._committed = 0
        #: Committed pairs not fed yet (tokens, and their features, [len, hidden] a round):
        #: fed with the next proposal that drafts.
        self._waiting_tokens: list[int] = []
        self._waiting_features: list[np.ndarray] = []
        #: Whether the head's cache ran out of positions (it drafts no more this generation).
        self._full = False

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        if features is None:
            raise ConfigError(
                "the head drafter needs the target's features, which this verifier does not "
                "return (a remote target, or a local one not asked for them)",
                fix="verify with the local target, or draft with --drafter model or ngram",
            )
        self._sampling, self._rng = sampling, rng
        self.cache.reset()
        self._committed = 0
        self._scores = self._guess = None
        self._proposed = ()
        self._waiting_tokens, self._waiting_features = [], []
        self._full = False
        self._feed(list(prompt[1:]), features)

    def _feed(self, tokens: list[int], features: np.ndarray) -> None:
        """Pairs (tokens[i], features[i]) at the next committed positions; the last pass's
        last row becomes the next proposal's start."""
        if self.cache.length + len(tokens) > self.model.max_length:
            # The head's cache holds fewer positions than the target's context: past them it
            # drafts nothing more (its rounds are plain target steps).
            self._full = True
            self._scores = self._guess = None
            return
        rows = self.rows[np.asarray(tokens, np.int64)] if tokens else np.zeros(0, np.int64)
        for begin in range(0, len(tokens), PREFILL_PAIRS):
            end = min(begin + PREFILL_PAIRS, len(tokens))
            logits, guesses = self.model.forward_features(
                rows[begin:end].tolist(),
                self.cache,
                last_only=True,
                feature_input=features[begin:end],
            )
            self._scores = np.array(logits[-1, : len(self.kept)])
            self._guess = guesses[-1]
        self._committed = self.cache.length

    def propose(self, k: int) -> Draft:
        started = time.perf_counter()
        steps = 0
        if k >= 1 and self._waiting_tokens and not self._full:
            # The rounds' accepted pairs since the last proposal, with the target's features:
            # one pass, whatever the number of rounds that drafted nothing in between.
            self._feed(self._waiting_tokens, np.concatenate(self._waiting_features))
            self._waiting_tokens, self._waiting_features = [], []
            steps += 1
        room = self.model.max_length - self.cache.length
        if k < 1 or self._scores is None or self._guess is None or room < k + 1:
            self._proposed = ()
            return Draft(tokens=(), elapsed_s=time.perf_counter() - started)
        scores, guess = self._scores, self._guess
        tokens: list[int] = []
        q_rows: list[np.ndarray] = []
        while True:
            token, q, confidence = self._draw_kept(scores, self.cache.length + 1)
            if tokens and confidence < self.stop_probability:
                break
            tokens.append(token)
            if q is not None:
                q_rows.append(q)
            if len(tokens) == k:
                break
            logits, guesses = self.model.forward_features(
                [int(self.rows[token])], self.cache, feature_input=guess[None]
            )
            steps += 1
            scores, guess = logits[-1, : len(self.kept)], guesses[-1]
        self._proposed = tuple(tokens)
        return Draft(
            tokens=self._proposed,
            q_draft=np.stack(q_rows) if q_rows else None,
            elapsed_s=time.perf_counter() - started,
            steps=steps,
        )

    def _draw_kept(self, scores: np.ndarray, position: int) -> tuple[int, np.ndarray | None, float]:
        """The draft token from the kept tokens' scores [N] (``ModelDrafter._pick`` over the
        full width when sampling or stopping early; the argmax straight off when greedy)."""
        if self._sampling.greedy and not self.stop_probability:
            return int(self.kept[int(np.argmax(scores))]), None, 1.0
        return self._pick(self._full_width(scores), position)

    def _full_width(self, scores: np.ndarray) -> np.ndarray:
        """The kept tokens' scores [N] as logits over the target's vocabulary (the others
        ``UNSCORED_LOGIT``, never drawn); greedy reads the argmax straight off."""
        logits = np.full(self.vocab_size, UNSCORED_LOGIT, np.float32)
        logits[self.kept] = scores
        return logits

    def propose_along(self, guess: Sequence[int]) -> Draft:
        """The head's own proposal as far as it follows ``guess``, drafted step by step (a
        head's step reads its previous step's output, so a guess cannot go through at once)."""
        draft = self.propose(len(guess) + 1)
        kept = 0
        while kept < len(draft.tokens) and kept < len(guess) and draft.tokens[kept] == guess[kept]:
            kept += 1
        tokens = draft.tokens[: kept + 1]
        self._proposed = tokens
        q = draft.q_draft[: len(tokens)] if draft.q_draft is not None else None
        return Draft(tokens=tokens, q_draft=q, elapsed_s=draft.elapsed_s, steps=draft.steps)

    def catch_up(
        self, accepted: Sequence[int], next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        """Committed tokens another drafter proposed, with the verdict's features."""
        self._proposed = tuple(int(t) for t in accepted)
        self.commit(len(accepted), next_token, features=features)

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        proposed = self._proposed
        if not 0 <= n_accepted <= len(proposed):
            raise ValueError(f"{n_accepted} accepted of a {len(proposed)}-token draft")
        if features is None or len(features) != n_accepted + 1:
            raise ValueError("the head drafter commits with the verdict's features")
        self.cache.crop(self._committed)  # the guessed pairs go
        self._proposed = ()
        # Fed with the next proposal that drafts, so the draft's time counts it.
        self._waiting_tokens += [*proposed[:n_accepted], int(next_token)]
        self._waiting_features.append(np.array(features))
