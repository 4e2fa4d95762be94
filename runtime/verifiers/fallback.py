"""A verifier that hands over to a second one when the first becomes unreachable."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import RemoteUnavailableError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.verifiers.base import Verdict, Verifier


class FallbackVerifier:
    """Verifies with ``primary`` until it raises :class:`RemoteUnavailableError`, then begins
    the verifier ``make_fallback`` builds on the committed history (prompt and every verdict's
    tokens) and continues with it. A failed remote round commits nothing and leaves the
    generator untouched, so a local target fallback stays lossless; a draft-model fallback
    does not (``fell_back`` and ``reason`` let the caller mark the result)."""

    def __init__(self, primary: Verifier, make_fallback: Callable[[], Verifier]) -> None:
        self.primary = primary
        self.active: Verifier = primary
        self.max_length = primary.max_length
        self.make_fallback = make_fallback
        self.fell_back = False
        self.reason = ""
        self._history: list[int] = []
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._history = list(prompt)
        self._sampling, self._rng = sampling, rng
        try:
            self.primary.begin(prompt, sampling=sampling, rng=rng)
        except RemoteUnavailableError as error:
            self._switch(error)

    def _switch(self, error: RemoteUnavailableError) -> None:
        self.fell_back, self.reason = True, str(error)
        self.active = self.make_fallback()
        self.active.begin(self._history, sampling=self._sampling, rng=self._rng)

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        try:
            verdict = self.active.verify(last_token, draft)
        except RemoteUnavailableError as error:
            if self.fell_back:
                raise
            self._switch(error)
            verdict = self.active.verify(last_token, draft)
        self._history.extend(verdict.tokens)
        return verdict

    def close(self) -> None:
        self.primary.close()
        if self.active is not self.primary:
            self.active.close()
