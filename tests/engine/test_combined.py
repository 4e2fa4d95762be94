"""The combined drafter: prompt lookup when the context's tail matches, the draft model
otherwise; both sides follow every committed token whichever side drafted."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.manifest import load_bundle
from edgespec.runtime.drafters.combined import PROBE_EVERY, CombinedDrafter
from edgespec.runtime.drafters.model import ModelDrafter
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.model import OnnxModel

from support.toy_pair import TOY_PAIR

#: A draft step at 0.2 of a target step, a verify pass of 2 positions as one of 1.
COSTS = CostProfile(
    target_step_s=0.1, draft_step_s=0.02, verify_cost=(1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)
)


def _drafter() -> CombinedDrafter:
    bundle = load_bundle(TOY_PAIR / "draft")
    model = ModelDrafter(OnnxModel(bundle), vocab_size=bundle.manifest.model.vocab_size)
    return CombinedDrafter(model, costs=lambda: COSTS)


def test_lookup_and_model_rounds_keep_both_sides_in_step() -> None:
    drafter = _drafter()
    prompt = [5, 6, 7, 8, 9, 10, 11, 5, 6]  # its tail (5, 6) occurred before: lookup drafts
    drafter.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    context = list(prompt)
    rng = np.random.default_rng(1)
    for _ in range(12):
        draft = drafter.propose(4)
        accepted = int(rng.integers(0, len(draft.tokens) + 1))
        next_token = int(rng.integers(3, 40))
        drafter.commit(accepted, next_token)
        context += [*draft.tokens[:accepted], next_token]
        assert list(drafter.lookup.context) == context
        # The draft model's cache holds the context but the tokens it has still to feed.
        pending = drafter.model._pending
        assert drafter.model.cache.length + len(pending) == len(context)
        assert context[len(context) - len(pending) :] == pending
    assert drafter.lookups > 0 and drafter.model_rounds > 0


def test_model_rounds_are_priced_down_to_plain_steps_while_the_model_is_rejected() -> None:
    """Rejected drafts lower the model's acceptance until no draft length pays for its draft
    steps: the rounds then draft nothing (plain target steps), except a one-token probe after
    PROBE_EVERY of them; the draft model still follows every committed token."""
    drafter = _drafter()
    drafter.begin([3, 4, 5], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    context = [3, 4, 5]
    lengths = []
    for index in range(8 + PROBE_EVERY):
        draft = drafter.propose(6)
        lengths.append(len(draft.tokens))
        next_token = 7 + 3 * index  # nothing accepted; no repeats to look up
        drafter.commit(0, next_token)
        context.append(next_token)
        pending = drafter.model._pending
        assert drafter.model.cache.length + len(pending) == len(context)
    assert lengths[0] > 0 and drafter.model_acceptance < 0.3
    first_zero = lengths.index(0)
    assert lengths[first_zero : first_zero + PROBE_EVERY - 1] == [0] * (PROBE_EVERY - 1)
    assert lengths[first_zero + PROBE_EVERY - 1] == 1
    assert drafter.model_rounds == len(lengths) - lengths.count(0)


def test_model_rounds_draft_longer_while_the_model_is_accepted() -> None:
    """Every drafted token accepted: the model's rounds go to their longest, model_k, and
    never past the round's k."""
    drafter = _drafter()
    drafter.begin([3, 4, 5], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    lengths = []
    for index in range(8):
        draft = drafter.propose(2 if index == 7 else 6)
        lengths.append(len(draft.tokens))
        drafter.commit(len(draft.tokens), 50 + index)
    assert drafter.model_acceptance > 0.9
    assert lengths[-2] == drafter.model_k and lengths[-1] == 2


def test_lookup_rounds_are_point_masses_for_rejection_sampling() -> None:
    """Rejection sampling needs each draft token's distribution: a lookup proposal is
    certain, so its rows are one-hot (accepted with the target's probability: exact)."""
    drafter = _drafter()
    sampling = SamplingConfig(temperature=0.7, mode="rejection")
    drafter.begin([5, 6, 7, 8, 5, 6], sampling=sampling, rng=np.random.default_rng(0))
    draft = drafter.propose(3)
    assert draft.tokens == (7, 8, 5) and draft.q_draft is not None
    assert draft.q_draft.shape == (3, drafter.model.vocab_size)
    assert (draft.q_draft.sum(1) == 1).all() and (draft.q_draft[[0, 1, 2], [7, 8, 5]] == 1).all()
    drafter.commit(1, 30)
    model_draft = drafter.propose(3)  # (7, 30) never occurred before: the model drafts
    assert drafter.model_rounds == 1 and model_draft.q_draft is not None
    assert np.allclose(model_draft.q_draft.sum(1), 1, atol=1e-4)


@pytest.mark.parametrize("proposed", [0, 7], ids=["likely token", "unlikely token"])
def test_a_point_mass_draft_keeps_the_target_distribution(proposed: int) -> None:
    """Rejection sampling of a certain (lookup) token: accepted with p(token), else a draw
    from the residual; the emitted token is distributed as p (chi-square, 20,000 draws)."""
    from edgespec.runtime.acceptance import accept_sampled

    from support.statistics_checks import chi_square, chi_square_critical

    p = np.random.default_rng(3).dirichlet(np.ones(12))
    p[0], p[7] = 0.5, 0.01
    p /= p.sum()
    p_rows = np.stack([p, p])  # [k + 1, vocab] for a one-token draft
    q = np.zeros((1, 12))
    q[0, proposed] = 1.0
    rng = np.random.default_rng(11)
    counts = np.zeros(12, np.int64)
    for _ in range(20_000):
        counts[accept_sampled((proposed,), q, p_rows, rng).tokens[0]] += 1
    statistic, df = chi_square(counts, p)
    assert statistic < chi_square_critical(df), (statistic, df)


def _set_acceptance(drafter: CombinedDrafter, *, model: float, lookup: float) -> None:
    drafter._model_acceptance._accepted, drafter._model_acceptance._tested = model, 1.0
    drafter._lookup_acceptance._accepted, drafter._lookup_acceptance._tested = lookup, 1.0


def test_rejected_copies_lower_the_lookups_acceptance_alone() -> None:
    drafter = _drafter()
    drafter.begin([5, 6, 7, 8, 5, 6], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    model_before, lookup_before = drafter.model_acceptance, drafter.lookup_acceptance
    draft = drafter.propose(3)
    assert drafter.lookups == 1 and draft.tokens == (7, 8, 5)
    drafter.commit(0, 30)
    assert drafter.lookup_acceptance < lookup_before
    assert drafter.model_acceptance == model_before


def test_a_lookup_is_cut_to_its_best_length() -> None:
    """At a middling lookup acceptance a longer proposal costs more verify than it returns:
    the round drafts the best length of the match, and commit takes its tokens from it."""
    drafter = _drafter()
    prompt = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6]
    drafter.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    _set_acceptance(drafter, model=0.0, lookup=0.5)  # the model's best round: a plain step
    draft = drafter.propose(6)
    # E(0.5, j) / T(j + 1) with COSTS: 1.50, 1.59, 1.56, 1.49 for j = 1..4.
    assert draft.tokens == (7, 8) and drafter.lookup.proposal == (7, 8)
    drafter.commit(2, 40)
    assert list(drafter.lookup.context)[-3:] == [7, 8, 40]


def _model_drafter() -> ModelDrafter:
    bundle = load_bundle(TOY_PAIR / "draft")
    return ModelDrafter(OnnxModel(bundle), vocab_size=bundle.manifest.model.vocab_size)


@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(), SamplingConfig(temperature=0.8, seed=3, mode="match")],
    ids=["greedy", "match"],
)
@pytest.mark.parametrize("parts_at", [0, 1, 2, None])
@pytest.mark.parametrize("accept_all", [False, True])
def test_drafting_along_a_match_gives_the_models_own_tokens(
    sampling: SamplingConfig, parts_at: int | None, accept_all: bool
) -> None:
    """One pass over a guess proposes what step-by-step drafting proposes, up to and
    including the first token where the model parts from the guess (all 4 when it never
    does), and leaves the draft's cache where step-by-step drafting leaves it: the next
    rounds of both drafters agree."""
    prompt = [3, 9, 14, 5, 22, 7]
    stepwise, along = _model_drafter(), _model_drafter()
    for drafter in (stepwise, along):
        drafter.begin(prompt, sampling=sampling, rng=np.random.default_rng(0))
    own = stepwise.propose(4).tokens
    guess = list(own[:3])
    if parts_at is not None:
        guess[parts_at] = (guess[parts_at] + 1) % 40  # a copy that goes wrong there
    proposal = along.propose_along(guess)
    expected = own[: 4 if parts_at is None else parts_at + 1]
    assert proposal.tokens == expected
    assert (proposal.q_draft is None) == sampling.greedy
    # Both commit the same tokens; their next proposals are then the same.
    accepted = len(expected) if accept_all else min(len(expected) - 1, 1)
    for drafter in (stepwise, along):
        drafter.commit(accepted, 11)
    assert along.propose(3).tokens == stepwise.propose(3).tokens


def test_a_match_below_the_models_round_is_drafted_along_and_scored() -> None:
    """With the lookup priced below the model's round, a match is drafted along by the
    model (one pass), and the lookup's acceptance is still scored from what the round
    committed: a match the target would have accepted raises it."""
    drafter = _drafter()
    drafter.begin([5, 6, 7, 8, 5, 6], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    _set_acceptance(drafter, model=0.95, lookup=0.1)
    draft = drafter.propose(4)
    assert drafter.along_rounds == 1 and drafter.lookups == 0 and 1 <= len(draft.tokens) <= 4
    before = drafter.lookup_acceptance
    committed = [7, 8]  # what the lookup's match (7, 8, 5) begins with: two would have passed
    accepted = 1 if draft.tokens[0] == 7 else 0
    drafter.commit(accepted, committed[accepted])
    if accepted:  # the target's tokens are (7, 8): the match's first two tokens
        assert drafter.lookup_acceptance > before


def test_auto_k_leaves_the_combined_drafter_to_price_its_rounds() -> None:
    """k "auto" with the combined drafter hands it the most tokens a round may verify (its
    own pricing picks each round's length); a fixed k stays a cap, and so does a server's."""
    from edgespec.engine import assembly
    from edgespec.engine.options import MAX_K, GenerationOptions
    from edgespec.events import KPolicy
    from edgespec.runtime.k_policy import AutoK

    def policy(k: int | str, drafter: str, cap: int | None = None) -> KPolicy:
        return assembly.k_policy(
            GenerationOptions(k=k),
            drafter_name=drafter,
            k=k,
            profile=lambda: COSTS,
            cap=None if cap is None else (lambda: cap),
        )

    assert policy("auto", "combined").next_k() == MAX_K
    assert policy("auto", "combined", cap=3).next_k() == 3
    assert policy(2, "combined").next_k() == 2
    assert isinstance(policy("auto", "model"), AutoK)


def test_a_round_of_k_0_drafts_nothing_even_when_a_probe_is_due() -> None:
    """k 0 (a server's suggested k, the end of the context) is a plain step: neither a
    lookup match nor the model's one-token probe drafts past it."""
    drafter = _drafter()
    drafter.begin([5, 6, 5, 6], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    for index in range(2 * PROBE_EVERY):
        assert drafter.propose(0).tokens == ()
        drafter.commit(0, [5, 6][index % 2])
