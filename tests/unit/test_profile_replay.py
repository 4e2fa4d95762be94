"""How ``edgespec pair --profile`` prices a drafter: the rounds it ran, replayed as if each
draft stopped at k, rather than an acceptance rate taken as the same at every position."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from edgespec.measure.profile import alpha_by_position, draft_step_cost, replayed_speedup
from edgespec.runtime.k_policy import CostProfile, expected_speedup


@dataclass(frozen=True)
class GraphSpecFields:
    """The graph record's fields the cost measurement reads."""

    feature_input: str | None


VERIFY_COST = [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8]


def test_rounds_without_a_draft_cost_a_step_for_one_token() -> None:
    """Prompt lookup drafts only where the context repeats: half its rounds here proposed
    nothing. Replayed at k 4, 10 empty rounds give 10 tokens for 10 steps and 10 full ones 50
    tokens for 10 five-token passes; alpha alone (every drafted token accepted) would promise
    5 tokens per 1.4-step round."""
    rounds = Counter({(0, 0, 0): 10, (4, 4, 0): 10})
    replayed = replayed_speedup(rounds, c=0.0, verify_cost=VERIFY_COST, k=4)
    assert replayed == pytest.approx(60 / (10 * 1.0 + 10 * 1.4))
    assert replayed < expected_speedup(1.0, 0.0, VERIFY_COST, 4)


def test_a_draft_model_round_stopped_at_k_pays_k_draft_steps() -> None:
    """Rounds drafted at k 8 by a model, replayed at k 2: min(accepted, 2) + 1 tokens for two
    draft steps (c each) and a 3-token pass; at k 0 every round is one plain step."""
    rounds = Counter({(8, 5, 8): 3, (8, 0, 8): 1})
    at_two = replayed_speedup(rounds, c=0.4, verify_cost=VERIFY_COST, k=2)
    assert at_two == pytest.approx((3 * 3 + 1 * 1) / (4 * (2 * 0.4 + 1.2)))
    assert replayed_speedup(rounds, c=0.4, verify_cost=VERIFY_COST, k=0) == pytest.approx(1.0)


def test_a_round_drafted_along_a_match_pays_one_draft_pass() -> None:
    """The combined drafter's rounds along a lookup match propose several tokens from one
    draft pass: replayed at any k they cost one draft step, not one per token."""
    rounds = Counter({(4, 4, 1): 2})
    at_three = replayed_speedup(rounds, c=0.4, verify_cost=VERIFY_COST, k=3)
    assert at_three == pytest.approx((2 * 4) / (2 * (1 * 0.4 + 1.3)))


def test_acceptance_by_position_is_a_share_of_the_rounds_that_reached_it() -> None:
    """Drafts of different lengths (prompt lookup's) never make a position's acceptance
    exceed 1: position i counts the rounds that drafted past i and accepted position i - 1."""
    rounds = Counter({(1, 1, 0): 5, (4, 0, 0): 5, (4, 4, 0): 1})
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


class ScriptedPasses:
    """A model whose pass over w positions takes ``times[w][repeat]`` on a fake clock (a
    target's graph: it takes no features)."""

    graph = GraphSpecFields(feature_input=None)

    def __init__(self, times: dict[int, list[float]]) -> None:
        self.times = times
        self.clock = 0.0
        self.calls: Counter[int] = Counter()

    def new_cache(self) -> object:
        return self

    def crop(self, length: int) -> None:
        """The fake keeps no cache."""

    def forward(self, tokens: list[int], cache: object, *, last_only: bool = False) -> None:
        width = len(tokens)
        if width in self.times:  # the prefill takes no time
            self.clock += self.times[width][self.calls[width]]
            self.calls[width] += 1


def test_the_verify_curve_takes_each_widths_best_and_never_falls_with_width(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A slow stretch during one repeat of width 2 is outrun by its other repeats; width 3,
    slow in every repeat here, is timed at no more than the wider width 4."""
    from edgespec.runtime import costs

    model = ScriptedPasses({1: [1.0, 1.0], 2: [3.0, 1.1], 3: [2.0, 2.0], 4: [1.5, 1.6]})
    monkeypatch.setattr(costs.time, "perf_counter", lambda: model.clock)
    times = costs._best_times(model, list(range(100, 200)), [1, 2, 3, 4], repeats=2)  # type: ignore[arg-type]
    assert times == pytest.approx([1.0, 1.1, 1.5, 1.5])
    assert model.calls == Counter({1: 2, 2: 2, 3: 2, 4: 2})


def test_drafters_expected_alike_are_raced_with_target_only_decoding_near_one() -> None:
    """The combined drafter expected at 1.08x and prompt lookup at 1.07x race each other,
    with target-only decoding (1.08x is within the race margin of 1.0x); a model drafter
    expected at 0.95x does not run."""
    from edgespec.measure.profile import RACE_WITHIN, contenders

    def drafter(expected: float, k: int) -> dict[str, float]:
        return {"expected_speedup": expected, "recommended_k": k}

    measured = {"model": drafter(0.95, 1), "combined": drafter(1.08, 2), "ngram": drafter(1.07, 5)}
    assert contenders(measured) == {"combined": 2, "ngram": 5, "none": 0}
    # A clear winner, far above 1.0x, runs alone: there is nothing to race.
    measured = {"combined": drafter(1.6, 3), "ngram": drafter(1.6 / RACE_WITHIN - 0.01, 4)}
    assert contenders(measured) == {"combined": 3}
    # No drafter pays: target-only decoding alone.
    assert contenders({"ngram": drafter(0.9, 1)}) == {"none": 0}
