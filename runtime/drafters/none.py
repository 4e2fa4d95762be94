"""The drafter that never drafts: the target-only baseline through the same engine."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.drafters.base import Draft

_EMPTY = Draft(tokens=())


class NoDrafter:
    """Proposes nothing, so every round is one plain target step.

    Running the baseline through the speculative loop (instead of a separate plain loop)
    keeps both measurements on the same code path, so a benchmark compares drafting alone.
    """

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        """Nothing to prepare: there is no model and no history to keep."""

    def propose(self, k: int) -> Draft:
        """Always the empty draft, whatever ``k`` is."""
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        return _EMPTY

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        """Accepts only ``n_accepted == 0``: nothing was proposed."""
        if n_accepted != 0:
            raise ValueError(f"n_accepted={n_accepted} but NoDrafter proposes no tokens")

    def close(self) -> None:
        """Nothing to give back."""
