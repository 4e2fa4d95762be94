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
from edgespec.runtime.drafters.base import Draft

_EMPTY = Draft(tokens=())


class PromptLookupDrafter:
    """Proposes the continuation of the latest earlier occurrence of the context's tail.

    The context is the prompt plus every committed token. ``propose(k)`` tries n-gram sizes
    from ``max_ngram`` down to ``min_ngram``: the last n tokens are looked up, and the first
    size with a match wins, so a longer (more specific) match is always preferred. A match
    must end at or before the start of the tail it matches (it may not overlap it), which
    also guarantees at least n continuation tokens before the end of the context. Up to k of
    the tokens that followed the match are proposed; fewer when the context ends sooner, none
    when nothing matches. There is no distribution, so ``q_draft`` is always None.

    With ``cold_k``, a proposal is at most ``cold_k`` tokens long unless the previous one was
    accepted whole (the context is copying its source, and the next tokens of the same copy
    are likely right too). A verify pass costs more with every position it checks and a fresh
    match is more often wrong than a running copy, so short proposals after a miss and long
    ones inside a copy beat any fixed k (measured by ``benchmarks/lookup_policy.py`` on edit
    requests: docs/benchmarks/prompt-lookup.md, "Prompt lookup: how long a proposal").

    Lookup is a dictionary from n-gram to the start of its latest eligible occurrence,
    extended on every commit by the starts that became eligible, so a round costs
    O(max_ngram - min_ngram + 1) lookups plus O(tokens committed) index updates instead of a
    rescan of the context.
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
        self._context: list[int] = []
        # One dictionary serves every size: tuples of different lengths never compare equal.
        self._latest: dict[tuple[int, ...], int] = {}
        # For each size n, how many start positions (0, 1, ...) have been indexed so far.
        self._indexed: dict[int, int] = {}
        self._proposal: tuple[int, ...] = ()
        self._begun = False

    @property
    def context(self) -> tuple[int, ...]:
        """The prompt and every committed token, in order (a copy)."""
        return tuple(self._context)

    def begin(
        self,
        prompt: Sequence[int],
        *,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        features: np.ndarray | None = None,
    ) -> None:
        """Starts a generation from ``prompt``; ``sampling`` and ``rng`` are unused (no model)."""
        self._context = [int(token) for token in prompt]
        self._latest = {}
        self._indexed = dict.fromkeys(range(self.min_ngram, self.max_ngram + 1), 0)
        self._proposal = ()
        self._streak = False
        self._begun = True
        self._extend_index()

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
        length = len(self._context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length < 2 * n:
                continue  # no room for a tail and a non-overlapping earlier copy of it
            start = self._latest.get(tuple(self._context[length - n :]))
            if start is not None:
                # The index only holds non-overlapping starts, so start + n < length here.
                self._proposal = tuple(self._context[start + n : start + n + k])
                return Draft(tokens=self._proposal)
        return _EMPTY

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
        self._context.extend(self._proposal[:n_accepted])
        self._context.append(int(next_token))
        # A proposal is committed once: a second commit must not re-append its tokens.
        self._proposal = ()
        self._extend_index()

    def close(self) -> None:
        """Nothing to give back: the lookup keeps no model state."""

    def _extend_index(self) -> None:
        """Indexes every n-gram start that became eligible since the last call.

        The n-gram at start s is eligible for size n once it ends at or before the start of
        the current length-n tail (s + n <= length - n). The context only grows, so an
        eligible start stays eligible, and later starts overwrite earlier ones: the index
        always holds the most recent eligible occurrence.
        """
        context = self._context
        length = len(context)
        for n, indexed in self._indexed.items():
            eligible = length - 2 * n + 1
            for start in range(indexed, eligible):
                self._latest[tuple(context[start : start + n])] = start
            self._indexed[n] = max(indexed, eligible)

    def _require_begun(self) -> None:
        if not self._begun:
            raise RuntimeError("call begin(prompt, ...) before propose or commit")
