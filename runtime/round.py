"""The contract of one speculative round, in one place: what a drafter proposes (``Draft``),
what a verifier answers (``Verdict``), the two protocols, and the records the loop hands its
k policy and observers (``StepRecord``, ``KPolicy``, ``DecodeObserver``, defined with the
events everything else observes).

A round: ``drafter.propose(k) -> Draft``; ``verifier.verify(last, draft) -> Verdict``;
``drafter.commit(n_accepted, next_token, features=verdict.features)``. The one thing that
flows from the verifier to the drafter is the target's features: ``verifier.begin`` returns
those of the prompt it prefilled, and each ``Verdict`` carries those of ``last`` and the
accepted tokens, which a head on the target drafts from. A verifier that computes none (a
remote engine, or a local one not asked for them) returns None, and drafters that do not
read them ignore them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.events import DecodeObserver, KPolicy, StepRecord

__all__ = ["DecodeObserver", "Draft", "Drafter", "KPolicy", "StepRecord", "Verdict", "Verifier"]


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


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """``tokens`` = the accepted draft tokens then the target's own token (n_accepted + 1).

    ``features`` [n_accepted + 1, hidden]: the target's features of ``last`` and the accepted
    tokens (the rows of the verify pass that stay in its cache), when the verifier was asked
    for them; None otherwise."""

    tokens: tuple[int, ...]
    n_accepted: int
    elapsed_s: float = 0.0
    features: np.ndarray | None = None


class Drafter(Protocol):
    """``begin`` once per generation, then ``propose``/``commit`` once per round, ``close``
    at its end.

    ``begin`` gets the target's features of the prompt's tokens but the last ([len - 1,
    hidden]) when the verifier has them. ``commit(n_accepted, next_token, features=...)``
    tells the drafter that the first ``n_accepted`` tokens of its last proposal were kept and
    ``next_token`` (the target's own) follows them, with the verdict's features.
    """

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None: ...

    def propose(self, k: int) -> Draft: ...

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None: ...

    def close(self) -> None:
        """The generation is over: a model drafter gives its cache back to its model."""
        ...


class Verifier(Protocol):
    """``begin`` prefills the prompt without its last token (and returns the target's
    features of those tokens when it computes them); ``verify`` runs one target pass over
    ``[last_token] + draft.tokens`` and keeps the accepted prefix in its cache."""

    max_length: int

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> np.ndarray | None: ...

    def verify(self, last_token: int, draft: Draft) -> Verdict: ...

    def close(self) -> None: ...
