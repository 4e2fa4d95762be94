"""How ``edgespec pair --profile`` prices a drafter: the rounds it ran, replayed as if each
draft stopped at k, rather than an acceptance rate taken as the same at every position."""

from __future__ import annotations

from collections import Counter

import pytest

from edgespec.measure.profile import alpha_by_position, draft_step_cost, replayed_speedup
from edgespec.runtime.k_policy import CostProfile, expected_speedup

VERIFY_COST = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]


def test_rounds_without_a_draft_cost_a_step_for_one_token() -> None:
    """Prompt lookup drafts only where the context repeats: half its rounds here proposed
    nothing. Replayed at k 4, 10 empty rounds give 10 tokens for 10 steps and 10 full ones 50
    tokens for 10 five-token passes; alpha alone (every drafted token accepted) would promise
    5 tokens per 1.4-step round."""
    rounds = Counter({(0, 0, False): 10, (4, 4, False): 10})
    replayed = replayed_speedup(rounds, c=0.0, verify_cost=VERIFY_COST, k=4)
    assert replayed == pytest.approx(60 / (10 * 1.0 + 10 * 1.4))
    assert replayed < expected_speedup(1.0, 0.0, VERIFY_COST, 4)


def test_a_draft_model_round_stopped_at_k_pays_k_draft_steps() -> None:
    """Rounds drafted at k 8 by a model, replayed at k 2: min(accepted, 2) + 1 tokens for two
    draft steps (c each) and a 3-token pass; at k 0 every round is one plain step."""
    rounds = Counter({(8, 5, True): 3, (8, 0, True): 1})
    at_two = replayed_speedup(rounds, c=0.4, verify_cost=VERIFY_COST, k=2)
    assert at_two == pytest.approx((3 * 3 + 1 * 1) / (4 * (2 * 0.4 + 1.2)))
    assert replayed_speedup(rounds, c=0.4, verify_cost=VERIFY_COST, k=0) == pytest.approx(1.0)


def test_acceptance_by_position_is_a_share_of_the_rounds_that_reached_it() -> None:
    """Drafts of different lengths (prompt lookup's) never make a position's acceptance
    exceed 1: position i counts the rounds that drafted past i and accepted position i - 1."""
    rounds = Counter({(1, 1, False): 5, (4, 0, False): 5, (4, 4, False): 1})
    by_position = alpha_by_position(rounds)
    assert by_position == pytest.approx([6 / 11, 1.0, 1.0, 1.0])
    assert all(0.0 <= a <= 1.0 for a in by_position)


def test_c_is_what_generation_paid_per_draft_step() -> None:
    """A bare draft pass leaves out what a drafter does around it (feeding the target's token
    back, reading its logits): c comes from the drafter's time per step in the profile's own
    runs, and from the bare pass only where no draft step ran (prompt lookup)."""
    from types import SimpleNamespace

    profile = CostProfile(target_step_s=0.060, draft_step_s=0.024, verify_cost=(1.0, 1.1))
    runs = [SimpleNamespace(stats=SimpleNamespace(draft_steps=s, draft_ms=ms)) for s, ms in (
        (10, 300.0), (30, 900.0))]  # fmt: skip
    assert draft_step_cost(runs, profile) == pytest.approx(0.030 / 0.060)
    lookup = [SimpleNamespace(stats=SimpleNamespace(draft_steps=0, draft_ms=5.0))]
    assert draft_step_cost(lookup, profile) == pytest.approx(profile.c)
