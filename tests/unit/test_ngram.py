"""Prompt-lookup drafter and the no-op drafter: proposals and commit bookkeeping (no models)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.runtime.drafters.base import Draft, Drafter
from edgespec.runtime.drafters.ngram import PromptLookupDrafter
from edgespec.runtime.drafters.none import NoDrafter


def started(
    prompt: Sequence[int], *, max_ngram: int = 3, min_ngram: int = 1
) -> PromptLookupDrafter:
    drafter = PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
    drafter.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    return drafter


def reference_proposal(
    context: Sequence[int], k: int, *, max_ngram: int, min_ngram: int
) -> tuple[int, ...]:
    """The definition, by brute force: latest non-overlapping copy of the longest tail."""
    if k == 0:
        return ()
    length = len(context)
    for n in range(max_ngram, min_ngram - 1, -1):
        tail = list(context[length - n :])
        for start in range(length - 2 * n, -1, -1):
            if list(context[start : start + n]) == tail:
                return tuple(context[start + n : start + n + k])
    return ()


def test_longest_ngram_wins() -> None:
    # Tail (1, 2, 3) occurred at 0 (followed by 10, 11); tail (3,) last occurred at 6 (then 20).
    prompt = [1, 2, 3, 10, 11, 7, 3, 20, 21, 1, 2, 3]
    assert started(prompt).propose(4) == Draft(tokens=(10, 11, 7, 3))
    assert started(prompt, max_ngram=1).propose(4) == Draft(tokens=(20, 21, 1, 2))


def test_most_recent_occurrence_and_fewer_than_k_at_the_end() -> None:
    drafter = started([5, 1, 5, 2, 5, 3, 5], max_ngram=1)
    draft = drafter.propose(5)
    assert draft.tokens == (3, 5)  # the copy at 4, not at 0 or 2; only two tokens follow it
    assert draft.q_draft is None


def test_match_may_not_overlap_the_tail() -> None:
    assert started([7, 7, 7], max_ngram=2, min_ngram=2).propose(3) == Draft(tokens=())
    assert started([7, 7, 7], max_ngram=2, min_ngram=1).propose(3) == Draft(tokens=(7,))
    assert started([7, 7, 7, 7], max_ngram=2, min_ngram=2).propose(3) == Draft(tokens=(7, 7))


@pytest.mark.parametrize("prompt", [[], [4], [1, 2, 3, 4, 5]])
def test_no_match_gives_an_empty_draft(prompt: list[int]) -> None:
    assert started(prompt).propose(4) == Draft(tokens=())


def test_k_zero_gives_an_empty_draft() -> None:
    drafter = started([1, 2, 1, 2])
    assert drafter.propose(0) == Draft(tokens=())
    drafter.commit(0, 9)
    assert drafter.context == (1, 2, 1, 2, 9)
    with pytest.raises(ValueError, match="k must be"):
        drafter.propose(-1)


def test_commit_over_rounds_with_full_and_zero_acceptance() -> None:
    drafter = started([1, 2, 3, 4, 1, 2])
    assert drafter.propose(3).tokens == (3, 4, 1)
    drafter.commit(3, 5)  # full acceptance, then the target's own token
    assert drafter.context == (1, 2, 3, 4, 1, 2, 3, 4, 1, 5)
    assert drafter.propose(2).tokens == ()  # 5 never occurred before
    drafter.commit(0, 2)
    assert drafter.context == (1, 2, 3, 4, 1, 2, 3, 4, 1, 5, 2)
    assert drafter.propose(2).tokens == (3, 4)  # tail (2,): latest copy at 5
    drafter.commit(0, 8)  # zero acceptance: only the target's token is kept
    assert drafter.context == (1, 2, 3, 4, 1, 2, 3, 4, 1, 5, 2, 8)
    drafter.propose(2)
    drafter.commit(0, 1)
    assert drafter.propose(4).tokens == (5, 2, 8, 1)  # tail (8, 1) is new; (1,) last at 8


def test_cold_k_caps_proposals_until_one_is_accepted_whole() -> None:
    drafter = PromptLookupDrafter(cold_k=2)
    drafter.begin([1, 2, 3, 4, 5, 6, 7, 1], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    assert drafter.propose(5).tokens == (2, 3)  # a fresh match: at most cold_k
    drafter.commit(2, 4)  # accepted whole: the copy runs on
    assert drafter.propose(5).tokens == (5, 6, 7, 1, 2)  # up to k
    drafter.commit(1, 9)  # a miss
    assert drafter.propose(5).tokens == ()  # (5, 9) and (9,) never occurred
    drafter.commit(0, 1)
    assert drafter.propose(5).tokens == (2, 3)  # cold again after the miss
    assert drafter.propose(1).tokens == (2,)  # k below cold_k wins
    drafter.begin([1, 2, 1], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    drafter.propose(1)
    drafter.commit(1, 3)  # accepted whole, then a new generation starts cold
    drafter.begin([1, 2, 3, 4, 1], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    assert drafter.propose(3).tokens == (2, 3)
    with pytest.raises(ConfigError, match="cold_k"):
        PromptLookupDrafter(cold_k=0)


def test_invalid_n_accepted() -> None:
    drafter = started([1, 2, 1])
    assert drafter.propose(3).tokens == (2, 1)
    with pytest.raises(ValueError, match="n_accepted"):
        drafter.commit(3, 0)
    with pytest.raises(ValueError, match="n_accepted"):
        drafter.commit(-1, 0)
    drafter.commit(2, 0)
    with pytest.raises(ValueError, match="n_accepted"):
        drafter.commit(1, 0)  # the proposal was already committed


def test_begin_resets_and_is_required() -> None:
    drafter = PromptLookupDrafter()
    with pytest.raises(RuntimeError, match="begin"):
        drafter.propose(2)
    drafter.begin([1, 2, 1], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    drafter.propose(2)
    drafter.commit(1, 1)
    drafter.begin([3, 4, 3], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    assert drafter.context == (3, 4, 3)
    assert drafter.propose(2).tokens == (4, 3)


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 0), (2, 3), (0, 0)])
def test_invalid_ngram_sizes(max_ngram: int, min_ngram: int) -> None:
    with pytest.raises(ConfigError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(3, 1), (4, 2), (1, 1)])
def test_incremental_index_matches_brute_force(max_ngram: int, min_ngram: int) -> None:
    rng = np.random.default_rng(max_ngram * 10 + min_ngram)
    for _ in range(20):
        prompt = rng.integers(0, 4, size=int(rng.integers(0, 30))).tolist()
        drafter = started(prompt, max_ngram=max_ngram, min_ngram=min_ngram)
        context = list(prompt)
        for _ in range(40):
            k = int(rng.integers(0, 6))
            draft = drafter.propose(k)
            expected = reference_proposal(context, k, max_ngram=max_ngram, min_ngram=min_ngram)
            assert draft.tokens == expected
            n_accepted = int(rng.integers(0, len(draft.tokens) + 1))
            next_token = int(rng.integers(0, 4))
            drafter.commit(n_accepted, next_token)
            context += [*draft.tokens[:n_accepted], next_token]
            assert drafter.context == tuple(context)


def test_no_drafter_proposes_nothing() -> None:
    drafter: Drafter = NoDrafter()
    drafter.begin([1, 2, 3], sampling=SamplingConfig(), rng=np.random.default_rng(0))
    for k in (0, 1, 8):
        draft = drafter.propose(k)
        assert draft == Draft(tokens=())
        assert draft.q_draft is None
        drafter.commit(0, 4)
    with pytest.raises(ValueError, match="n_accepted"):
        drafter.commit(1, 4)
