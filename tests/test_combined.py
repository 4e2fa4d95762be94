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

from conftest import TOY_PAIR

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
    from test_distribution import chi_square, chi_square_critical

    from edgespec.runtime.acceptance import accept_sampled

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
