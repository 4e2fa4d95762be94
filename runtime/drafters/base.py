"""The drafter protocol and the record a proposal travels in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgespec.config import SamplingConfig


@dataclass(frozen=True, kw_only=True)
class Draft:
    """Up to k proposed tokens.

    ``q_draft`` is [len(tokens), vocab]: the (temperature/top-k/top-p transformed) draft
    distribution each token was sampled from; None when the drafter has no distribution
    (greedy drafting, prompt lookup), in which case rejection sampling cannot be used and the
    ``match`` mode verifies instead. ``tokens`` may be shorter than asked (early stop, no
    n-gram match), and empty. ``elapsed_s`` and ``steps`` report the time and the number of
    model calls the proposal took (0 for drafters without a model).
    """

    tokens: tuple[int, ...]
    q_draft: np.ndarray | None = None
    elapsed_s: float = 0.0
    steps: int = 0


class Drafter(Protocol):
    """``begin`` once per generation, then ``propose``/``commit`` once per round.

    ``commit(n_accepted, next_token)`` tells the drafter that the first ``n_accepted`` tokens of
    its last proposal were kept and ``next_token`` (the target's own) follows them.
    """

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None: ...

    def propose(self, k: int) -> Draft: ...

    def commit(self, n_accepted: int, next_token: int) -> None: ...
