"""Prompt lookup first, the draft model otherwise: one drafter for both kinds of text.

Where the output copies its input (edits, extraction, quoting) an n-gram match proposes long
runs for free; elsewhere the draft model proposes. A round drafts from the context when its
tail of ``min_ngram`` or more tokens occurred earlier, and from the model when not. Both keep
up with every committed token: the lookup index takes the model's accepted tokens, the draft
model feeds the lookup's accepted tokens through its cache at its next proposal (one pass).
Sampling verifies by ``match``, or by rejection sampling with a lookup proposal taken as a
point mass (exact either way).

Each side keeps its own running acceptance and each round is priced in expected tokens per
unit of cost: a lookup round of j tokens at E(beta, j) / T(j + 1) (its tokens are free), a
model round of j tokens at E(alpha, j) / (j * c + T(j + 1)), zero included (a plain step).
A lookup match drafts when its best length pays at least as well as the model's best round,
truncated to that length. Otherwise the model drafts, and where a match exists it drafts
*along* it: the match goes through the draft model in one pass, and the model's own tokens
are proposed as far as they follow the match (plus the model's token where they part). Those
are exactly the tokens the model would draft step by step, for one pass instead of one step
each. Greedy copies are accepted often, so long lookups win there; a sampled target accepts a
copied token only with its probability of it, so the lookup's acceptance falls and the model,
whose draws are coupled to the target's, drafts along the match instead. A match that is not
drafted as it stands is still scored against the tokens the round commits, so the lookup's
acceptance follows the text either way (docs/benchmarks/qwen-vs-llama-cpp.md, "On a 2-core
AVX-512 Xeon").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter
from edgespec.runtime.k_policy import (
    GREEDY_ALPHA_SMOOTHING,
    SAMPLED_ALPHA_SMOOTHING,
    CostProfile,
    RunningAcceptance,
    expected_tokens,
)

#: A one-token match ("the", a newline) predicts little; two tokens are where the copies in
#: edit-style answers are found.
DEFAULT_MIN_NGRAM = 2
#: The most tokens a model round drafts: each costs a draft step and its acceptance falls
#: with depth, while a lookup round's tokens are free (it drafts up to the round's k).
DEFAULT_MODEL_K = 3
#: Each side's acceptance before its first round (accepted / tested draft tokens). A copy
#: from the context is more often right than a model's guess, so the lookup starts higher.
#: Both follow rounds with AutoK's greedy weight, except the model's when sampling: a sampled
#: token is accepted by a draw, and the quick weight priced a model out of a whole answer after
#: a run of five rejections that drafting on through recovered.
PRIOR_ACCEPTANCE = 0.6
PRIOR_LOOKUP_ACCEPTANCE = 0.8
#: After this many model rounds in a row priced at zero tokens, one drafts a single token, so
#: that an acceptance that recovers is seen. (The lookup needs no probe: a match that was not
#: drafted is scored against the tokens the round committed.)
PROBE_EVERY = 16


class CombinedDrafter:
    """Proposes by prompt lookup or with the draft model, whichever round pays more.

    ``costs`` gives the pair's measured costs (the draft step against a target step, and the
    verify curve T(w)/T(1)). A model round drafts the j in 0..``model_k`` (and at most the
    round's k) with the most expected tokens per unit of cost, E[j] / (j * c + T(j + 1)), at
    the model's running acceptance; a lookup round the j up to its match's length with the
    most E[j] / T(j + 1) at the lookup's. ``lookups``, ``model_rounds`` and ``along_rounds``
    count the rounds drafted by the lookup, by the model step by step and by the model along
    a match.
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
        self._match: tuple[int, ...] = ()  # the round's lookup match, when not drafted as is
        self._point_masses = False
        self.lookups = 0
        self.model_rounds = 0
        self.along_rounds = 0
        self._model_acceptance = RunningAcceptance(PRIOR_ACCEPTANCE)
        self._lookup_acceptance = RunningAcceptance(PRIOR_LOOKUP_ACCEPTANCE)
        self._priced_out = 0  # model rounds priced at zero tokens in a row

    @property
    def model_acceptance(self) -> float:
        """The running share of the model's tested draft tokens that the target accepted."""
        return self._model_acceptance.rate

    @property
    def lookup_acceptance(self) -> float:
        """The running share of the lookup's tested tokens that the target accepted (or,
        for a match not drafted as is, that the round committed)."""
        return self._lookup_acceptance.rate

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        self.model.begin(prompt, sampling=sampling, rng=rng, features=features)
        self.lookup.begin(prompt, sampling=sampling, rng=rng)
        self._from_lookup, self._match = False, ()
        self._point_masses = not sampling.greedy and sampling.mode == "rejection"
        self._model_acceptance.smoothing = (
            GREEDY_ALPHA_SMOOTHING if sampling.greedy else SAMPLED_ALPHA_SMOOTHING
        )
        self._model_acceptance.reset()
        self._lookup_acceptance.reset()
        self._priced_out = 0

    def propose(self, k: int) -> Draft:
        # Priced at the history's length: after thousands of positions every verify row and
        # draft step attends over them all, and drafting may no longer pay.
        profile = self.costs().at_depth(self.model.cache.length)
        model_length, model_rate = self._model_round(k, profile)
        match = self.lookup.propose(k).tokens
        length = self._lookup_length(len(match), model_rate, profile)
        self._from_lookup, self._match = length > 0, ()
        if self._from_lookup:
            self.lookups += 1
            tokens = match[:length]
            self.lookup.adopt(tokens)
            if self._point_masses:
                # A lookup proposal is certain: as a draft distribution it is a point mass
                # on each token ([len, vocab] one-hot rows), with which rejection sampling
                # accepts a token with the target's probability of it and stays exact.
                q = np.zeros((len(tokens), self.model.vocab_size), np.float32)
                q[np.arange(len(tokens)), list(tokens)] = 1.0
                return Draft(tokens=tokens, q_draft=q)
            return Draft(tokens=tokens)
        self._match = match
        length = min(k, self._probed(model_length))  # a probe never exceeds the round's k
        # Drafting along costs one pass whatever the match's length, and the proposal stops
        # where the model parts from the match: the whole match is worth guessing, up to a
        # proposal of k tokens and the longest pass the verify curve prices.
        along = min(len(match), k - 1, len(profile.verify_cost) - 2) if length else 0
        if along:  # proposes 1 to along + 1 tokens
            self.along_rounds += 1
            draft = self.model.propose_along(match[:along])
        else:
            if length:
                self.model_rounds += 1
            draft = self.model.propose(length)
        self.lookup.adopt(draft.tokens)
        return draft

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        proposal = self.lookup.proposal
        if self._from_lookup:
            self._lookup_acceptance.update(len(proposal), n_accepted)
            self.model.catch_up(proposal[:n_accepted], next_token, features=features)
        else:
            self._model_acceptance.update(len(proposal), n_accepted)
            self._score_match([*proposal[:n_accepted], next_token])
            self.model.commit(n_accepted, next_token, features=features)
        self.lookup.commit(n_accepted, next_token)

    def close(self) -> None:
        self.model.close()

    def _score_match(self, committed: Sequence[int]) -> None:
        """Scores the round's undrafted match as if it had been drafted: its tokens up to the
        first that differs from the committed ones were accepted, that one was tested. The
        committed tokens are the target's own wherever the match would have been tested
        (greedy, or ``match`` sampling's keyed draws), so the count is the one a lookup round
        would have had."""
        known = min(len(self._match), len(committed))
        if not known:
            return
        agreed = next((i for i in range(known) if self._match[i] != committed[i]), known)
        self._lookup_acceptance.update(min(known, agreed + 1), agreed)

    def _model_round(self, k: int, profile: CostProfile) -> tuple[int, float]:
        """The model round's best length at its running acceptance (0: a plain step) and
        its expected tokens per target step."""
        curve, c, alpha = profile.verify_cost, profile.c, self.model_acceptance
        rates = [
            expected_tokens(alpha, j) / (j * c + curve[j])
            for j in range(min(self.model_k, k, len(curve) - 1) + 1)
        ]
        best = max(range(len(rates)), key=rates.__getitem__)
        return best, rates[best]

    def _lookup_length(self, matched: int, model_rate: float, profile: CostProfile) -> int:
        """How many of a ``matched``-token lookup proposal to draft: the length with the
        most expected tokens per target step, or 0 when the model's round pays more."""
        curve, beta = profile.verify_cost, self.lookup_acceptance
        lengths = range(1, min(matched, len(curve) - 1) + 1)
        if not lengths:
            return 0
        best = max(lengths, key=lambda j: expected_tokens(beta, j) / curve[j])
        return best if expected_tokens(beta, best) / curve[best] >= model_rate else 0

    def _probed(self, length: int) -> int:
        """A model round of ``length`` tokens, or a one-token probe after
        :data:`PROBE_EVERY` rounds priced at zero in a row."""
        if length:
            self._priced_out = 0
            return length
        self._priced_out += 1
        if self._priced_out >= PROBE_EVERY:
            self._priced_out = 0
            return 1
        return 0
