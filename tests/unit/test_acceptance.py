"""Unit tests for edgespec.runtime.acceptance: greedy, rejection sampling and keyed matching.

No models: target and draft rows are fixed random logits passed through ``probabilities``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.runtime.acceptance import Acceptance, accept_greedy, accept_match, accept_sampled
from edgespec.runtime.sampling import keyed_race, probabilities, sample

VOCAB = 8

#: Upper 1e-4 quantiles of the chi-square distribution, by degrees of freedom (computed with
#: mpmath: the x where the regularized upper incomplete gamma Q(df/2, x/2) = 1e-4).
CHI2_CRITICAL_1E4 = {
    1: 15.136705,
    2: 18.420681,
    3: 21.107513,
    4: 23.512742,
    5: 25.744832,
    6: 27.856341,
    7: 29.877504,
}


# --- accept_greedy -----------------------------------------------------------------------------


@pytest.mark.parametrize("j", range(5))
def test_greedy_accepts_exactly_the_matching_prefix(j: int) -> None:
    k = 4
    logits = np.random.default_rng(j).normal(size=(k + 1, VOCAB))  # [k + 1, vocab]
    best = [int(t) for t in np.argmax(logits, axis=-1)]  # [k + 1]
    draft = best[:j]
    if j < k:  # wrong at position j, then arbitrary (here: right again, which must not count)
        draft += [(best[j] + 1) % VOCAB, *best[j + 1 : k]]
    result = accept_greedy(draft, logits)
    assert result.n_accepted == j
    assert result.next_token == best[j]
    assert result.tokens == tuple(best[: j + 1])


def test_greedy_with_an_empty_draft_emits_the_target_argmax() -> None:
    logits = np.array([[0.0, 1.0, 5.0, 5.0]])
    assert accept_greedy([], logits) == Acceptance(n_accepted=0, next_token=2, tokens=(2,))


def test_rows_must_match_the_draft_length() -> None:
    with pytest.raises(ValueError, match=r"\[3, vocab\]"):
        accept_greedy([1, 2], np.zeros((2, VOCAB)))
    p = np.full((2, VOCAB), 1 / VOCAB)
    with pytest.raises(ValueError, match=r"q_draft must be \[1, vocab\]"):
        accept_sampled([1], p, p, np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"p_target must be \[3, vocab\]"):
        accept_match([1, 2], p, seed=0, position=0)


def test_acceptance_checks_its_fields() -> None:
    with pytest.raises(ValueError):
        Acceptance(n_accepted=1, next_token=3, tokens=(3,))
    with pytest.raises(ValueError):
        Acceptance(n_accepted=1, next_token=3, tokens=(3, 4))


# --- accept_match ------------------------------------------------------------------------------


def _fake_target(context: Sequence[int], sampling: SamplingConfig) -> np.ndarray:
    """A deterministic next-token distribution [vocab] that depends on the whole context."""
    logits = np.random.default_rng(np.random.SeedSequence(list(context))).normal(size=VOCAB)
    return probabilities(2.0 * logits, sampling)


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=1.0, seed=11, mode="match"),
        SamplingConfig(temperature=0.7, top_k=3, seed=12, mode="match"),
        SamplingConfig(temperature=1.2, top_p=0.8, seed=13, mode="match"),
    ],
)
def test_match_is_token_identical_to_plain_keyed_sampling(sampling: SamplingConfig) -> None:
    prompt, length = [3, 1, 4], 60
    plain = list(prompt)
    while len(plain) < length:
        p = _fake_target(plain, sampling)
        plain.append(keyed_race(p, sampling.seed, len(plain)))

    # Drafts mix right guesses (copied from the plain run) with random tokens, k from 0 to 5.
    chooser = np.random.default_rng(99)
    tokens, rounds_with_acceptance = list(prompt), 0
    while len(tokens) < length:
        k = int(chooser.integers(0, 6))
        position = len(tokens)
        draft = [
            plain[position + i]
            if position + i < length and chooser.random() < 0.7
            else int(chooser.integers(VOCAB))
            for i in range(k)
        ]
        p_target = np.stack([_fake_target(tokens + draft[:i], sampling) for i in range(k + 1)])
        result = accept_match(draft, p_target, seed=sampling.seed, position=position)
        assert result.tokens == (*draft[: result.n_accepted], result.next_token)
        rounds_with_acceptance += result.n_accepted > 0
        tokens += result.tokens
    assert tokens[:length] == plain
    assert rounds_with_acceptance > 3  # the test exercised multi-token rounds


def test_match_with_greedy_rows_is_greedy() -> None:
    logits = np.random.default_rng(5).normal(size=(4, VOCAB))
    p_target = probabilities(logits, SamplingConfig(temperature=0.0))
    best = [int(t) for t in np.argmax(logits, axis=-1)]
    result = accept_match([*best[:2], (best[2] + 1) % VOCAB], p_target, seed=1, position=40)
    assert result.tokens == tuple(best[:3])


# --- accept_sampled ----------------------------------------------------------------------------


def test_sampled_accepts_everything_when_draft_equals_target() -> None:
    p = probabilities(
        np.random.default_rng(6).normal(size=(4, VOCAB)), SamplingConfig(temperature=1.0)
    )
    rng = np.random.default_rng(0)
    for _ in range(200):
        draft = [int(rng.integers(VOCAB)) for _ in range(3)]
        assert accept_sampled(draft, p[:3], p, rng).n_accepted == 3


def test_sampled_rejects_a_token_the_target_excludes_and_is_reproducible() -> None:
    q = np.full((2, VOCAB), 1 / VOCAB)
    p = np.zeros((3, VOCAB))
    p[:, 5] = 1.0
    result = accept_sampled([2, 5], q, p, np.random.default_rng(0))
    assert result == Acceptance(n_accepted=0, next_token=5, tokens=(5,))
    draft = [5, 5]
    runs = [accept_sampled(draft, q, p, np.random.default_rng(seed)) for seed in (1, 1)]
    assert runs[0] == runs[1] == Acceptance(n_accepted=2, next_token=5, tokens=(5, 5, 5))


def _chi_square(observed: np.ndarray, expected_probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom over the categories with expected mass > 0.

    A category of expected mass 0 must never be observed (asserted here).
    """
    support = expected_probs > 0
    assert observed[~support].sum() == 0, "drew a token the target gives probability 0"
    expected = observed.sum() * expected_probs[support]
    assert expected.min() >= 5, "too few samples per category for the chi-square approximation"
    statistic = float((((observed[support] - expected) ** 2) / expected).sum())
    return statistic, int(support.sum()) - 1


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingConfig(temperature=0.8),
        SamplingConfig(temperature=1.0, top_k=4),
        SamplingConfig(temperature=1.2, top_p=0.8),
    ],
    ids=["temperature", "top_k", "top_p"],
)
def test_sampled_output_is_distributed_as_the_target(k: int, sampling: SamplingConfig) -> None:
    """Rejection sampling emits tokens distributed exactly as p_target (Leviathan et al. thm 1).

    20,000 rounds with draft tokens sampled from a deliberately different q_draft. Checked by
    Pearson chi-square goodness of fit at α = 1e-4 per check (critical values by degrees of
    freedom = tokens in the target's support - 1, from CHI2_CRITICAL_1E4): the first emitted
    token against p_target[0], and, in rounds that accepted the first draft token, the second
    emitted token against p_target[1]. Seeds are fixed, so the result cannot flake: with
    correct code a false failure of a given seed has probability ≤ 1e-4 per check.
    """
    rounds = 20_000
    rng = np.random.default_rng(2024 + k)
    p_target = probabilities(rng.normal(size=(k + 1, VOCAB)), sampling)  # [k + 1, vocab]
    q_draft = probabilities(1.5 * rng.normal(size=(k, VOCAB)), sampling)  # [k, vocab]
    # q_draft differs from p_target by at least 0.2 in total variation on every row, so
    # emitting the draft unchecked would fail the chi-square checks by far.
    assert (0.5 * np.abs(q_draft - p_target[:k]).sum(axis=-1) > 0.2).all()

    first = np.zeros(VOCAB, dtype=np.int64)
    second = np.zeros(VOCAB, dtype=np.int64)
    for _ in range(rounds):
        draft = [sample(q_draft[i], rng) for i in range(k)]
        result = accept_sampled(draft, q_draft, p_target, rng)
        first[result.tokens[0]] += 1
        if result.n_accepted >= 1:
            second[result.tokens[1]] += 1

    for observed, row in ((first, p_target[0]), (second, p_target[1])):
        statistic, dof = _chi_square(observed, row)
        assert statistic < CHI2_CRITICAL_1E4[dof], (statistic, dof, observed, row)


def test_auto_k_estimates_per_token_acceptance() -> None:
    """Rounds that accept 2 of 4 drafted tokens test 3 tokens: alpha tends to 2/3, not 1/2."""
    from edgespec.events import StepRecord
    from edgespec.runtime.k_policy import AutoK, CostProfile, expected_tokens

    policy = AutoK(
        CostProfile(target_step_s=1e-3, draft_step_s=1e-4, verify_cost=(1.0,) * 9), alpha=0.5
    )
    record = StepRecord(
        round=0,
        k=4,
        drafted=4,
        n_accepted=2,
        committed=(1, 2, 3),
        draft_s=4e-4,
        draft_steps=4,
        verify_s=1e-3,
    )
    for _ in range(200):
        policy.observe(record)
    assert abs(policy.alpha - 2 / 3) < 1e-6
    assert expected_tokens(1.0, 4) == 5.0
    assert 1 <= policy.next_k() <= 8


def _policy_speedup(policy: Any, alpha: float, seed: int) -> float:
    """Tokens per target step of ``policy`` over rounds whose drafted tokens are each accepted
    with probability ``alpha``, independently (as sampled acceptance is), at the 1.5B pair's
    measured costs: c 0.29, T(w)/T(1) below."""
    from edgespec.events import StepRecord

    verify = (1.0, 1.01, 1.21, 1.34, 1.43, 1.53, 1.65, 1.78, 1.92)
    rng = np.random.default_rng(seed)
    made, cost = 0, 0.0
    for index in range(1500):
        k = policy.next_k()
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        draft_s, verify_s = 0.29 * k, verify[k]
        policy.observe(
            StepRecord(
                round=index,
                k=k,
                drafted=k,
                n_accepted=accepted,
                committed=(),
                draft_s=draft_s,
                draft_steps=k,
                verify_s=verify_s,
            )
        )
        made, cost = made + accepted + 1, cost + draft_s + verify_s
    return made / cost


def test_sampled_rounds_follow_alpha_slowly_and_gain_by_it() -> None:
    """Sampled generations' AutoK blends α with the sampled weight (greedy ones keep the quick
    one), and on independent acceptance at α 0.72 that makes more tokens per target step than
    the quick weight, which chases each round's luck."""
    from edgespec.engine import assembly
    from edgespec.engine.options import GenerationOptions
    from edgespec.runtime.k_policy import (
        GREEDY_ALPHA_SMOOTHING,
        SAMPLED_ALPHA_SMOOTHING,
        AutoK,
        CostProfile,
    )

    costs = (1.0, 1.01, 1.21, 1.34, 1.43, 1.53, 1.65, 1.78, 1.92)
    profile = CostProfile(target_step_s=1.0, draft_step_s=0.29, verify_cost=costs)
    policies = {
        temperature: assembly.k_policy(
            GenerationOptions(temperature=temperature, k="auto"),
            drafter_name="model",
            k="auto",
            profile=lambda: profile,
            cap=None,
            alpha=0.83,
        )
        for temperature in (0.0, 0.7)
    }
    assert isinstance(policies[0.0], AutoK) and isinstance(policies[0.7], AutoK)
    assert policies[0.0].alpha_smoothing == GREEDY_ALPHA_SMOOTHING
    assert policies[0.7].alpha_smoothing == SAMPLED_ALPHA_SMOOTHING < GREEDY_ALPHA_SMOOTHING
    assert policies[0.7].smoothing == GREEDY_ALPHA_SMOOTHING  # round times still follow fast

    quick = [
        _policy_speedup(AutoK(profile, alpha=0.83, alpha_smoothing=GREEDY_ALPHA_SMOOTHING), 0.72, s)
        for s in range(3)
    ]
    slow = [
        _policy_speedup(
            AutoK(profile, alpha=0.83, alpha_smoothing=SAMPLED_ALPHA_SMOOTHING), 0.72, s
        )
        for s in range(3)
    ]
    assert sum(slow) > sum(quick) * 1.02, (slow, quick)
