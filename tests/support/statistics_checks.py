"""The chi-square test the sampling tests share: draws against a distribution."""

from __future__ import annotations

import numpy as np

Z_1E4 = 3.7190  # standard normal quantile at 1 - 1e-4


def chi_square_critical(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at 1 - 1e-4."""
    return df * (1 - 2 / (9 * df) + Z_1E4 * np.sqrt(2 / (9 * df))) ** 3


def chi_square(counts: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    expected = p * counts.sum()
    big = expected >= 5
    observed_bins = [*counts[big].tolist(), counts[~big].sum()]
    expected_bins = [*expected[big].tolist(), expected[~big].sum()]
    if expected_bins[-1] < 5:  # pool a too-small remainder into the smallest category
        observed_bins[-2] += observed_bins.pop()
        expected_bins[-2] += expected_bins.pop()
    observed_array, expected_array = np.array(observed_bins), np.array(expected_bins)
    statistic = float(np.sum((observed_array - expected_array) ** 2 / expected_array))
    return statistic, len(expected_array) - 1
