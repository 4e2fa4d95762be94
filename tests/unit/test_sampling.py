"""Unit tests for edgespec.runtime.sampling: transforms, draws and keyed races. No models."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.runtime.sampling import (
    RACE_FLOOR,
    greedy_token,
    keyed_exponentials,
    keyed_race,
    probabilities,
    residual,
    sample,
    sample_at,
)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logits(rows: int, vocab: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(rows, vocab))


# --- probabilities -----------------------------------------------------------------------------


def test_greedy_is_one_hot_at_argmax_with_ties_to_lowest_id() -> None:
    logits = np.array([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 5.0]], dtype=np.float32)
    probs = probabilities(logits, SamplingConfig(temperature=0.0))
    assert probs.dtype == np.float64
    np.testing.assert_array_equal(probs, [[0, 1, 0, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_temperature_matches_softmax(temperature: float, dtype: type) -> None:
    logits: np.ndarray = _logits(3, 11).astype(dtype)
    probs = probabilities(logits, SamplingConfig(temperature=temperature))
    assert probs.dtype == np.float64
    expected = _softmax(logits.astype(np.float64) / temperature)
    # float32 arithmetic: a scaled score of 30 carries ~2e-6 of absolute error into its exp.
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-12)
    # ...normalised in float64, so every row sums to 1 as closely as float64 allows.
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=0, atol=1e-14)


def test_a_tiny_temperature_keeps_float64_and_the_top_token() -> None:
    logits = np.array([[3.0, 3.0 - 1e-9, -1.0]])
    probs = probabilities(logits, SamplingConfig(temperature=1e-12))
    np.testing.assert_array_equal(probs, [[1.0, 0.0, 0.0]])


def test_large_logits_are_stable() -> None:
    probs = probabilities(np.array([1e4, 1e4 - 1.0, -np.inf]), SamplingConfig(temperature=1.0))
    np.testing.assert_allclose(probs, [1 / (1 + math.exp(-1)), 1 - 1 / (1 + math.exp(-1)), 0.0])


@pytest.mark.parametrize("top_k", [1, 3, 7])
def test_top_k_keeps_exactly_the_k_highest(top_k: int) -> None:
    logits = _logits(4, 10, seed=1)
    probs = probabilities(logits, SamplingConfig(temperature=0.7, top_k=top_k))
    for row_logits, row in zip(logits, probs, strict=True):
        kept = set(np.flatnonzero(row))
        assert kept == set(np.argsort(row_logits)[-top_k:])
        expected = _softmax(row_logits[sorted(kept)] / 0.7)
        np.testing.assert_allclose(row[sorted(kept)], expected, rtol=1e-5)


def test_top_k_keeps_ties_with_the_kth_and_is_off_at_or_above_vocab() -> None:
    logits = np.array([3.0, 1.0, 3.0, 3.0, 0.0])
    tied = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert set(np.flatnonzero(tied)) == {0, 2, 3}
    plain = probabilities(logits, SamplingConfig(temperature=1.0))
    for top_k in (5, 50):
        np.testing.assert_array_equal(
            probabilities(logits, SamplingConfig(temperature=1.0, top_k=top_k)), plain
        )


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [(0.01, {1}), (0.35, {1}), (0.65, {1, 2}), (0.75, {1, 2, 3}), (0.9, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_minimal_nucleus(top_p: float, kept: set[int]) -> None:
    base = np.array([0.1, 0.4, 0.3, 0.15, 0.05])
    probs = probabilities(np.log(base), SamplingConfig(temperature=1.0, top_p=top_p))
    assert set(np.flatnonzero(probs)) == kept
    ids = sorted(kept)
    np.testing.assert_allclose(probs[ids], base[ids] / base[ids].sum(), rtol=1e-5)


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.8, 0.95, 0.999])
def test_top_p_nucleus_is_minimal_on_random_rows(top_p: float) -> None:
    logits = _logits(20, 16, seed=2)
    full = probabilities(logits, SamplingConfig(temperature=1.3))
    probs = probabilities(logits, SamplingConfig(temperature=1.3, top_p=top_p))
    for full_row, row in zip(full, probs, strict=True):
        kept = np.flatnonzero(row)
        assert len(kept) >= 1
        # The kept tokens are the most probable ones...
        assert full_row[kept].min() >= np.delete(full_row, kept).max(initial=0.0)
        # ...their mass reaches top_p, and dropping the least probable of them would not.
        assert full_row[kept].sum() >= top_p
        assert full_row[kept].sum() - full_row[kept].min() < top_p


def test_top_k_applies_before_top_p() -> None:
    # After top-k = 2 the row is [0.625, 0.375, 0]: top-p 0.6 keeps token 0 alone. Applied to
    # the raw row [0.5, 0.3, 0.2], top-p 0.6 would keep two tokens.
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    probs = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2, top_p=0.6))
    np.testing.assert_array_equal(probs, [1.0, 0.0, 0.0])


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(temperature=0.0),
        SamplingConfig(temperature=0.9),
        SamplingConfig(temperature=1.1, top_k=5),
        SamplingConfig(temperature=0.8, top_p=0.7),
        SamplingConfig(temperature=1.5, top_k=6, top_p=0.9),
    ],
)
def test_rows_sum_to_one_and_2d_is_row_wise(config: SamplingConfig) -> None:
    logits = _logits(6, 32, seed=3)
    probs = probabilities(logits, config)
    assert probs.shape == logits.shape
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, rtol=1e-12)
    assert (probs >= 0).all()
    for row_logits, row in zip(logits, probs, strict=True):
        np.testing.assert_array_equal(probabilities(row_logits, config), row)
    np.testing.assert_array_equal(probabilities(logits, config), probs)  # deterministic


# --- greedy_token, sample_at, sample ----------------------------------------------------------


def test_greedy_token() -> None:
    assert greedy_token(np.array([0.1, 3.0, 3.0, -1.0])) == 1
    with pytest.raises(ValueError, match="one row"):
        greedy_token(np.zeros((2, 3)))


def test_sample_at_is_the_inverse_cdf() -> None:
    probs = np.array([0.2, 0.3, 0.5])
    assert [sample_at(probs, u) for u in (0.0, 0.19, 0.2, 0.49, 0.5, 0.99)] == [0, 0, 1, 1, 2, 2]
    assert sample_at(probs, np.nextafter(1.0, 0.0)) == 2
    # A grid of uniforms reproduces the row exactly (to the grid's resolution).
    grid = (np.arange(10_000) + 0.5) / 10_000
    counts = np.bincount([sample_at(probs, u) for u in grid], minlength=3)
    np.testing.assert_array_equal(counts, [2000, 3000, 5000])


def test_sample_at_never_draws_a_zero_probability_token() -> None:
    probs = np.array([0.0, 0.5, 0.0, 0.5, 0.0])
    assert [sample_at(probs, u) for u in (0.0, 0.4999, 0.5, np.nextafter(1.0, 0.0))] == [1, 1, 3, 3]
    # A cumulative sum ending below (or above) 1 is rescaled, never runs off the end.
    low = probs * (1 - 1e-9)
    assert sample_at(low, np.nextafter(1.0, 0.0)) == 3
    assert sample_at(probs * (1 + 1e-9), 0.49999999) == 1
    with pytest.raises(ValueError, match="one row"):
        sample_at(np.full((2, 2), 0.25), 0.5)


def test_sample_at_over_blocks_is_the_inverse_cdf_of_a_long_row() -> None:
    """Rows longer than one block: the draw is the full cumulative sum's, zeros are skipped
    across block edges, and the end of the row clamps to the last token with mass."""
    from edgespec.runtime.sampling import CDF_BLOCK

    rng = np.random.default_rng(7)
    for size in (CDF_BLOCK + 1, 3 * CDF_BLOCK, 5 * CDF_BLOCK + 17):
        probs = rng.random(size) ** 6
        probs[rng.random(size) < 0.6] = 0.0
        probs /= probs.sum()
        cdf = np.cumsum(probs)
        for u in rng.random(200):
            drawn = sample_at(probs, u)
            assert probs[drawn] > 0 and cdf[drawn] - probs[drawn] <= u + 1e-12 < cdf[drawn] + 2e-12
        assert sample_at(probs, np.nextafter(1.0, 0.0)) == np.flatnonzero(probs)[-1]
    # Mass only in the first and the last block: everything between is skipped.
    sparse = np.zeros(4 * CDF_BLOCK + 3)
    last = 4 * CDF_BLOCK + 1
    sparse[[5, last]] = [0.25, 0.75]
    assert [sample_at(sparse, u) for u in (0.0, 0.2499, 0.25, 0.99)] == [5, 5, last, last]
    assert sample_at(sparse * (1 - 1e-9), np.nextafter(1.0, 0.0)) == last


def test_sample_is_reproducible_and_uses_one_uniform() -> None:
    probs = probabilities(_logits(1, 9, seed=4)[0], SamplingConfig(temperature=1.0))
    first_rng = np.random.default_rng(7)
    first = [sample(probs, first_rng) for _ in range(50)]
    rng = np.random.default_rng(7)
    again = [sample(probs, rng) for _ in range(50)]
    assert first == again
    mirror = np.random.default_rng(7)
    assert again == [sample_at(probs, mirror.random()) for _ in range(50)]
    assert rng.random() == mirror.random()  # both consumed exactly 50 uniforms


# --- keyed_race --------------------------------------------------------------------------------


def test_keyed_exponentials_depend_on_seed_position_and_id_alone() -> None:
    ids = np.arange(200)
    e = keyed_exponentials(3, 17, ids)
    assert np.array_equal(e, keyed_exponentials(3, 17, ids))
    assert np.array_equal(e[[5, 150]], keyed_exponentials(3, 17, np.array([5, 150])))
    assert len(set(e)) == 200
    assert not np.array_equal(e, keyed_exponentials(3, 18, ids))
    assert not np.array_equal(e, keyed_exponentials(4, 17, ids))
    assert not np.array_equal(e, keyed_exponentials(3 + 2**64, 17, ids))  # the seed's high bits
    assert (e >= RACE_FLOOR).all()


def test_keyed_exponentials_are_exponential() -> None:
    """Kolmogorov–Smirnov of 1 - exp(-E) against uniform over 20,000 (position, id) keys at
    α = 1e-4 (fixed seed: it cannot flake). Critical value sqrt(ln(2 / α) / (2 n)) ≈ 0.01573."""
    n = 20_000
    e = np.concatenate(
        [keyed_exponentials(12345, position, np.arange(100)) for position in range(200)]
    )
    u = np.sort(1.0 - np.exp(-e))
    ks = max((np.arange(1, n + 1) / n - u).max(), (u - np.arange(n) / n).max())
    assert ks < math.sqrt(math.log(2 / 1e-4) / (2 * n))


def test_keyed_race_is_the_full_race_over_every_token() -> None:
    """Keying only the tokens that can win gives the index of the largest probs / E over the
    whole row, on rows with long tails of tiny probabilities and with zeros."""
    rng = np.random.default_rng(8)
    for trial in range(200):
        logits = rng.normal(scale=rng.uniform(1.0, 6.0), size=3000)
        probs = _softmax(logits)
        probs[rng.integers(0, 3000, 50)] = 0.0
        full = int(np.argmax(probs / keyed_exponentials(9, trial, np.arange(3000))))
        assert keyed_race(probs, 9, trial) == full


def test_keyed_race_over_a_subset_keys_its_token_ids() -> None:
    """A row over some ids (a reduced draft head) draws the token the full row draws when the
    full row has no mass elsewhere: the variables follow the ids, not the row's indices."""
    rng = np.random.default_rng(10)
    ids = np.sort(rng.choice(5000, 400, replace=False))
    for position in range(100):
        sub = _softmax(rng.normal(scale=3.0, size=400))
        full = np.zeros(5000)
        full[ids] = sub
        assert ids[keyed_race(sub, 2, position, ids)] == keyed_race(full, 2, position)


def test_keyed_race_draws_the_rows_distribution() -> None:
    """Chi-square over 20,000 positions at α = 1e-4: a draw per position from one row."""
    probs = np.array([0.5, 0.2, 0.15, 0.1, 0.04, 0.01, 0.0])
    n = 20_000
    counts = np.bincount([keyed_race(probs, 77, position) for position in range(n)], minlength=7)
    assert counts[6] == 0
    expected = probs[:6] * n
    statistic = float(((counts[:6] - expected) ** 2 / expected).sum())
    assert statistic < 25.74  # chi-square, 5 degrees of freedom, α = 1e-4


def test_keyed_race_rejects_rows_it_cannot_draw_from() -> None:
    with pytest.raises(ValueError, match="one row"):
        keyed_race(np.ones((2, 3)) / 3, 0, 0)
    with pytest.raises(ValueError, match="positive mass"):
        keyed_race(np.zeros(4), 0, 0)


# --- residual ----------------------------------------------------------------------------------


def test_residual_is_normalised_positive_part() -> None:
    p = np.array([0.5, 0.2, 0.3, 0.0])
    q = np.array([0.2, 0.4, 0.1, 0.3])
    np.testing.assert_allclose(residual(p, q), [0.6, 0.0, 0.4, 0.0])


def test_residual_of_equal_rows_is_the_target() -> None:
    p = np.array([0.25, 0.25, 0.5])
    np.testing.assert_array_equal(residual(p, p.copy()), p)
    rows = np.array([[0.5, 0.2, 0.3], [0.25, 0.25, 0.5]])
    draft = np.array([[0.2, 0.5, 0.3], [0.25, 0.25, 0.5]])
    np.testing.assert_allclose(residual(rows, draft), [[1.0, 0.0, 0.0], [0.25, 0.25, 0.5]])


def test_a_vanishing_temperature_gives_the_argmax_not_nan() -> None:
    """Found by the server's fuzzing: logits / 1e-300 overflowed to inf - inf = NaN."""
    logits = np.array([[1.0, 3.0, -2.0, 2.5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        probs = probabilities(logits, SamplingConfig(temperature=1e-300))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]
