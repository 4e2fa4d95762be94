"""Prompt lookup first, the draft model otherwise: one drafter for both kinds of text.

Where the output copies its input (edits, extraction, quoting) an n-gram match proposes long
runs for free; elsewhere the draft model proposes. A round drafts from the context when its
tail of ``min_ngram`` or more tokens occurred earlier, and from the model when not. Both keep
up with every committed token: the lookup index takes the model's accepted tokens, the draft
model feeds the lookup's accepted tokens through its cache at its next proposal (one pass).
Sampling verifies by ``match``, or by rejection sampling with a lookup proposal taken as a
point mass (exact either way).

A model round drafts the number of tokens that the pair's costs make best for the model's own
acceptance, zero included: a lookup token is free, a model token costs a draft step, so the
two kinds of round are priced apart (one acceptance rate for both would price the model's
rounds at the lookup's).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter
from edgespec.runtime.k_policy import CostProfile, expected_tokens

#: A one-token match ("the", a newline) predicts little; two tokens are where the copies in
#: edit-style answers are found.
DEFAULT_MIN_NGRAM = 2
#: The most tokens a model round drafts: each costs a draft step and its acceptance falls
#: with depth, while a lookup round's tokens are free (it drafts up to the round's k).
DEFAULT_MODEL_K = 3
#: The model's acceptance before its first round (accepted / tested draft tokens), and how
#: much of the running estimate each round keeps.
PRIOR_ACCEPTANCE = 0.6
ACCEPTANCE_MEMORY = 0.8
#: After this many model rounds in a row priced at zero tokens, one drafts a single token,
#: so that an acceptance that recovers is seen.
PROBE_EVERY = 16


class CombinedDrafter:
    """Proposes by prompt lookup when the context's tail matches, else with the draft model.

    ``costs`` gives the pair's measured costs (the draft step against a target step, and the
    verify curve T(w)/T(1)); a model round drafts the j in 0..``model_k`` (and at most the
    round's k) with the most expected tokens per unit of cost,
    E[j] / (j * c + T(j + 1)), at the model's running acceptance. ``lookups`` and
    ``model_rounds`` count the rounds each side drafted.
    """

    def __init__(
        self,
        model: ModelDrafter,
        *,
        costs: Callable[[], CostProfile],
        max_ngram: int = 3,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        model_k: int = DEFAULT_MODEL_K,
    ) -> None:
        self.model = model
        self.costs = costs
        self.model_k = model_k
        self.lookup = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self._from_lookup = False
        self._point_masses = False
        self.lookups = 0
        self.model_rounds = 0
        # The model's acceptance as two running sums (accepted, tested), as AutoK keeps it.
        self._accepted = PRIOR_ACCEPTANCE
        self._tested = 1.0
        self._priced_out = 0

    @property
    def model_acceptance(self) -> float:
        """The running share of the model's tested draft tokens that the target accepted."""
        return self._accepted / self._tested

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self.model.begin(prompt, sampling=sampling, rng=rng)
        self.lookup.begin(prompt, sampling=sampling, rng=rng)
        self._from_lookup = False
        self._point_masses = not sampling.greedy and sampling.mode == "rejection"
        self._accepted, self._tested, self._priced_out = PRIOR_ACCEPTANCE, 1.0, 0

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
        length = min(k, self._model_k())
        if length:
            self.model_rounds += 1
        draft = self.model.propose(length)
        self.lookup.adopt(draft.tokens)
        return draft

    def commit(self, n_accepted: int, next_token: int) -> None:
        if self._from_lookup:
            accepted = self.lookup.proposal[:n_accepted]
            self.model.catch_up(accepted, next_token)
        else:
            drafted = len(self.lookup.proposal)
            if drafted:
                tested = n_accepted + (n_accepted < drafted)
                keep = ACCEPTANCE_MEMORY
                self._accepted = keep * self._accepted + (1 - keep) * n_accepted
                self._tested = keep * self._tested + (1 - keep) * tested
            self.model.commit(n_accepted, next_token)
        self.lookup.commit(n_accepted, next_token)

    def _model_k(self) -> int:
        """The model round's best length at the running acceptance (0: a plain step), with a
        one-token probe after :data:`PROBE_EVERY` rounds priced at zero in a row."""
        profile = self.costs()
        curve, c = profile.verify_cost, profile.c
        alpha = self.model_acceptance
        best = max(
            range(min(self.model_k, len(curve) - 1) + 1),
            key=lambda j: expected_tokens(alpha, j) / (j * c + curve[j]),
        )
        if best:
            self._priced_out = 0
            return best
        self._priced_out += 1
        if self._priced_out >= PROBE_EVERY:
            self._priced_out = 0
            return 1
        return 0
