"""The verifier protocol and its answer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.runtime.drafters.base import Draft


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """``tokens`` = the accepted draft tokens then the target's own token (n_accepted + 1)."""

    tokens: tuple[int, ...]
    n_accepted: int
    elapsed_s: float = 0.0


class Verifier(Protocol):
    """``begin`` prefills the prompt without its last token; ``verify`` runs one target pass
    over ``[last_token] + draft.tokens`` and keeps the accepted prefix in its cache."""

    max_length: int

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None: ...

    def verify(self, last_token: int, draft: Draft) -> Verdict: ...

    def close(self) -> None: ...
