"""Prompt lookup first, the draft model otherwise: one drafter for both kinds of text.

Where the output copies its input (edits, extraction, quoting) an n-gram match proposes long
runs for free; elsewhere the draft model proposes. A round drafts from the context when its
tail of ``min_ngram`` or more tokens occurred earlier, and from the model when not. Both keep
up with every committed token: the lookup index takes the model's accepted tokens, the draft
model feeds the lookup's accepted tokens through its cache at its next proposal (one pass).
Sampling verifies by ``match``, or by rejection sampling with a lookup proposal taken as a
point mass (exact either way).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter

#: A one-token match ("the", a newline) predicts little; two tokens are where the copies in
#: edit-style answers are found.
DEFAULT_MIN_NGRAM = 2
#: The most tokens a model round drafts: each costs a draft step and its acceptance falls
#: with depth, while a lookup round's tokens are free (it drafts up to the round's k).
DEFAULT_MODEL_K = 3
#: Model rounds draft fewer tokens while the share of their tokens the target accepts (a
#: running mean over recent model rounds) is low: 1 under the first, 2 under the second.
SHORT_DRAFT_BELOW = (0.3, 0.5)
ACCEPTANCE_MEMORY = 0.7


class CombinedDrafter:
    """Proposes by prompt lookup when the context's tail matches, else with the draft model.

    ``lookups`` and ``model_rounds`` count the rounds each side drafted.
    """

    def __init__(
        self,
        model: ModelDrafter,
        *,
        max_ngram: int = 3,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        model_k: int = DEFAULT_MODEL_K,
    ) -> None:
        self.model = model
        self.model_k = model_k
        self.lookup = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self._from_lookup = False
        self._point_masses = False
        self.lookups = 0
        self.model_rounds = 0
        #: Running share of the model's drafted tokens that were accepted.
        self.model_acceptance = SHORT_DRAFT_BELOW[1]

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self.model.begin(prompt, sampling=sampling, rng=rng)
        self.lookup.begin(prompt, sampling=sampling, rng=rng)
        self._from_lookup = False
        self._point_masses = not sampling.greedy and sampling.mode == "rejection"
        self.model_acceptance = SHORT_DRAFT_BELOW[1]

    def propose(self, k: int) -> Draft:
        draft = self.lookup.propose(k)
        self._from_lookup = bool(draft.tokens)
        if self._from_lookup:
            self.lookups += 1
            if self._point_masses:
                # A lookup proposal is certain: as a draft distribution it is a point mass
                # on each token ([len, vocab] one-hot rows), with which rejection sampling
                # accepts a token with the target's probability of it and stays exact.
                q = np.zeros((len(draft.tokens), self.model.vocab_size), np.float32)
                q[np.arange(len(draft.tokens)), list(draft.tokens)] = 1.0
                return Draft(tokens=draft.tokens, q_draft=q)
            return draft
        self.model_rounds += 1
        draft = self.model.propose(min(k, self._model_k()))
        self.lookup.adopt(draft.tokens)
        return draft

    def commit(self, n_accepted: int, next_token: int) -> None:
        if self._from_lookup:
            accepted = self.lookup.proposal[:n_accepted]
            self.model.catch_up(accepted, next_token)
        else:
            drafted = len(self.lookup.proposal)
            if drafted:
                self.model_acceptance = ACCEPTANCE_MEMORY * self.model_acceptance + (
                    1 - ACCEPTANCE_MEMORY
                ) * (n_accepted / drafted)
            self.model.commit(n_accepted, next_token)
        self.lookup.commit(n_accepted, next_token)

    def _model_k(self) -> int:
        """Fewer model tokens while the model's recent drafts were mostly rejected."""
        low, middle = SHORT_DRAFT_BELOW
        if self.model_acceptance < low:
            return 1
        return min(2, self.model_k) if self.model_acceptance < middle else self.model_k
