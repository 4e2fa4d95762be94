"""The tokens a cache holds, so that a prompt that starts like the cache's last text is
prefilled from where the two part, not from the start (a chat's next turn, a file asked about
again): llama.cpp's server does the same per slot (``cache_prompt``).

A cache's positions are computed the same whatever pass computed them (the graph's batch
invariance, which the export checks), so a reused prefix gives the bits a fresh prefill would.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

from edgespec.graph.kv_cache import KVCache


class HeldTokens:
    """The token ids at positions 0 .. length - 1 of each cache a model ran passes on.

    A pass of ``tokens`` after ``cache.length`` records them there (what a crop dropped is
    overwritten); a cache whose positions came otherwise (a head's passes, which also take
    features) is marked unknown and never reused."""

    def __init__(self) -> None:
        self._held: weakref.WeakKeyDictionary[KVCache, list[int] | None] = (
            weakref.WeakKeyDictionary()
        )

    def record(self, cache: KVCache, position: int, tokens: Sequence[int]) -> None:
        """``tokens`` written at ``position`` (the cache's length before the pass)."""
        held = [] if position == 0 else self._held.get(cache)
        if held is None or len(held) < position:
            self._held[cache] = None
            return
        del held[position:]
        held.extend(int(t) for t in tokens)
        self._held[cache] = held

    def forget(self, cache: KVCache) -> None:
        self._held[cache] = None

    def reusable(self, cache: KVCache, tokens: Sequence[int]) -> int:
        """How many of ``tokens`` the cache already holds at their positions: the length of
        the common prefix of what it holds (after any crop) and ``tokens``."""
        held = self._held.get(cache)
        if held is None or len(held) < cache.length:
            return 0
        same = 0
        for mine, theirs in zip(held[: cache.length], tokens, strict=False):
            if mine != theirs:
                break
            same += 1
        return same
