"""Prompt-lookup drafting: no model, the context's own history is the draft.

The tail of the context (its last n tokens) is looked up among earlier positions of the same
context; the tokens that followed the most recent earlier copy are proposed. This is the idea
behind prompt lookup decoding (transformers' prompt-lookup candidates, llama.cpp's n-gram
lookup) and it pays off where outputs repeat their input: summaries, code edits, extraction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError
from edgespec.graph.lookup import NgramIndex
from edgespec.runtime.drafters.base import Draft

_EMPTY = Draft(tokens=())


class PromptLookupDrafter:
    """Proposes the continuation of the latest earlier occurrence of the context's tail.

    The context is the prompt plus every committed token. ``propose(k)`` looks the context's
    last ``max_ngram`` down to ``min_ngram`` tokens up among its earlier positions
    (:class:`~edgespec.graph.lookup.NgramIndex`: the longest match wins, a match may not
    overlap the tail it matches) and proposes up to k of the tokens that followed it; none
    when nothing matches. There is no distribution, so ``q_draft`` is always None.

    With ``cold_k``, a proposal is at most ``cold_k`` tokens long unless the previous one was
    accepted whole (the context is copying its source, and the next tokens of the same copy
    are likely right too). A verify pass costs more with every position it checks and a fresh
    match is more often wrong than a running copy, so short proposals after a miss and long
    ones inside a copy beat any fixed k (measured by ``benchmarks/lookup_policy.py`` on edit
    requests: docs/benchmarks/prompt-lookup.md, "Prompt lookup: how long a proposal").
    """

    def __init__(
        self, *, max_ngram: int = 3, min_ngram: int = 1, cold_k: int | None = None
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ConfigError(
                f"n-gram sizes min_ngram={min_ngram}, max_ngram={max_ngram} are invalid",
                fix="use 1 <= min_ngram <= max_ngram, e.g. min_ngram=1, max_ngram=3",
            )
        if cold_k is not None and cold_k < 1:
            raise ConfigError(f"cold_k={cold_k} is invalid", fix="use cold_k >= 1, or None")
        self.cold_k = cold_k
        # Was the last proposal accepted whole? (Then the next may be up to k long.)
        self._streak = False
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._index = NgramIndex(max_ngram=max_ngram, min_ngram=min_ngram)
        self._proposal: tuple[int, ...] = ()
        self._begun = False

    @property
    def context(self) -> tuple[int, ...]:
        """The prompt and every committed token, in order (a copy)."""
        return tuple(self._index.tokens)

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        """Starts a generation from ``prompt``; ``sampling`` and ``rng`` are unused (no model)."""
        self._index.reset(prompt)
        self._proposal = ()
        self._streak = False
        self._begun = True

    def propose(self, k: int) -> Draft:
        """Up to ``k`` tokens that followed the longest matching n-gram; empty if none."""
        self._require_begun()
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self._proposal = ()
        if k == 0:
            return _EMPTY
        if self.cold_k is not None and not self._streak:
            k = min(k, self.cold_k)
        self._proposal = self._index.continuation(k)
        return Draft(tokens=self._proposal) if self._proposal else _EMPTY

    @property
    def proposal(self) -> tuple[int, ...]:
        """The last proposal (until it is committed)."""
        return self._proposal

    def adopt(self, tokens: Sequence[int]) -> None:
        """Makes ``tokens`` (another drafter's proposal) the proposal the next ``commit``
        takes its accepted tokens from, so the context follows what was verified."""
        self._require_begun()
        self._proposal = tuple(int(t) for t in tokens)

    def commit(
        self, n_accepted: int, next_token: int, *, features: np.ndarray | None = None
    ) -> None:
        """Appends the first ``n_accepted`` proposed tokens and then ``next_token``."""
        self._require_begun()
        if not 0 <= n_accepted <= len(self._proposal):
            raise ValueError(
                f"n_accepted={n_accepted} is outside [0, {len(self._proposal)}], "
                "the length of the last proposal"
            )
        self._streak = bool(self._proposal) and n_accepted == len(self._proposal)
        self._index.extend((*self._proposal[:n_accepted], int(next_token)))
        # A proposal is committed once: a second commit must not re-append its tokens.
        self._proposal = ()

    def close(self) -> None:
        """Nothing to give back: the lookup keeps no model state."""

    def _require_begun(self) -> None:
        if not self._begun:
            raise RuntimeError("call begin(prompt, ...) before propose or commit")
