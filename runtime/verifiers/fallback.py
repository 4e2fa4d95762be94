"""Verifiers that hand a generation from one verifier to another between rounds.

Both keep the committed history (the prompt and every verdict's tokens) and begin the verifier
taking over on it, so no token is lost or repeated; the generator is shared, so sampling stays
where it was. :class:`FallbackVerifier` hands over when the remote target stays unreachable;
:class:`SwitchingVerifier` moves between a local and a remote target as a budget decides.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import RemoteUnavailableError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.verifiers.base import Verdict, Verifier


class _Handover:
    """The committed history, and taking over on it."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._history: list[int] = []
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)

    def _remember(
        self, prompt: Sequence[int], sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._history = list(prompt)
        self._sampling, self._rng = sampling, rng

    def _take_over(self, verifier: Verifier) -> Verifier:
        verifier.begin(self._history, sampling=self._sampling, rng=self._rng)
        return verifier

    def _committed(self, verdict: Verdict) -> Verdict:
        self._history.extend(verdict.tokens)
        return verdict


class FallbackVerifier(_Handover):
    """Verifies with ``primary`` until it raises :class:`RemoteUnavailableError`, then begins
    the verifier ``make_fallback`` builds on the committed history and continues with it. A
    failed remote round commits nothing and leaves the generator untouched, so a local target
    fallback stays lossless; a draft-model fallback does not (``fell_back`` and ``reason`` let
    the caller mark the result; ``on_fall_back`` hears the reason, once)."""

    def __init__(
        self,
        primary: Verifier,
        make_fallback: Callable[[], Verifier],
        *,
        on_fall_back: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(primary.max_length)
        self.primary = primary
        self.active: Verifier = primary
        self.make_fallback = make_fallback
        self.on_fall_back = on_fall_back
        self.fell_back = False
        self.reason = ""

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._remember(prompt, sampling, rng)
        try:
            self.primary.begin(prompt, sampling=sampling, rng=rng)
        except RemoteUnavailableError as error:
            self._switch(error)

    def _switch(self, error: RemoteUnavailableError) -> None:
        # The problem alone: its fix ("use a fallback") is what is happening now.
        self.fell_back, self.reason = True, error.problem
        if self.on_fall_back is not None:
            self.on_fall_back(self.reason)
        self.active = self._take_over(self.make_fallback())

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        try:
            verdict = self.active.verify(last_token, draft)
        except RemoteUnavailableError as error:
            if self.fell_back:
                raise
            self._switch(error)
            verdict = self.active.verify(last_token, draft)
        return self._committed(verdict)

    def close(self) -> None:
        self.primary.close()
        if self.active is not self.primary:
            self.active.close()


class SwitchingVerifier(_Handover):
    """Verifies each round with ``remote`` while ``use_remote()`` says so, else with
    ``local``; both verify the same target's way, so the output does not depend on where a
    round ran. When the remote target stays unreachable, the generation stays local
    (``remote_down`` holds the reason; ``on_down`` hears it)."""

    def __init__(
        self,
        local: Verifier,
        remote: Verifier,
        *,
        use_remote: Callable[[], bool],
        on_down: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(min(local.max_length, remote.max_length))
        self.local, self.remote = local, remote
        self._use_remote = use_remote
        self.on_down = on_down
        self.active: Verifier | None = None
        self.remote_rounds = 0
        self.remote_down = ""

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._remember(prompt, sampling, rng)
        self.active = None  # the first round begins whichever verifier it needs

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        wanted = self.remote if self._use_remote() and not self.remote_down else self.local
        if wanted is self.remote:
            try:
                if self.active is not self.remote:
                    self.active = self._take_over(self.remote)
                verdict = self.remote.verify(last_token, draft)
            except RemoteUnavailableError as error:
                self.remote_down = error.problem  # nothing of the round was committed
                if self.on_down is not None:
                    self.on_down(self.remote_down)
            else:
                self.remote_rounds += 1
                return self._committed(verdict)
        if self.active is not self.local:
            self.active = self._take_over(self.local)
        return self._committed(self.local.verify(last_token, draft))

    def close(self) -> None:
        self.local.close()
        self.remote.close()
