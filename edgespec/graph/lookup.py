"""Prompt lookup's index: a growing token sequence and, for each n-gram of it, the start of
its latest earlier occurrence. Shared by the runtime's lookup drafter and a head's data
collection (which decodes the target's greedy answers with lookup passes), which may not
import each other.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """A sequence's tail looked up among its earlier positions.

    ``continuation(k)`` tries n-gram sizes from ``max_ngram`` down to ``min_ngram``: the
    last n tokens are looked up, and the first size with a match wins, so a longer (more
    specific) match is always preferred. A match must end at or before the start of the tail
    it matches (it may not overlap it), which also guarantees at least n continuation tokens
    before the end of the sequence. Up to k of the tokens that followed the match come back;
    fewer when the sequence ends sooner, none when nothing matches.

    The index is a dictionary from n-gram to the start of its latest eligible occurrence,
    extended on every :meth:`extend` by the starts that became eligible, so a lookup costs
    O(max_ngram - min_ngram + 1) probes plus O(tokens added) index updates instead of a rescan.
    """

    def __init__(self, *, max_ngram: int, min_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.reset(())

    def reset(self, tokens: Sequence[int]) -> None:
        """Starts over from ``tokens``."""
        self.tokens: list[int] = [int(token) for token in tokens]
        # One dictionary serves every size: tuples of different lengths never compare equal.
        self._latest: dict[tuple[int, ...], int] = {}
        # For each size n, how many start positions (0, 1, ...) have been indexed so far.
        self._indexed = dict.fromkeys(range(self.min_ngram, self.max_ngram + 1), 0)
        self._index_eligible()

    def extend(self, tokens: Sequence[int]) -> None:
        """Appends ``tokens`` to the sequence."""
        self.tokens.extend(int(token) for token in tokens)
        self._index_eligible()

    def continuation(self, k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens that followed the latest earlier copy of the longest matching
        tail; empty if none."""
        tokens, length = self.tokens, len(self.tokens)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if length < 2 * n:
                continue  # no room for a tail and a non-overlapping earlier copy of it
            start = self._latest.get(tuple(tokens[length - n :]))
            if start is not None:
                # The index only holds non-overlapping starts, so start + n < length here.
                return tuple(tokens[start + n : start + n + k])
        return ()

    def _index_eligible(self) -> None:
        """Indexes every n-gram start that became eligible since the last call.

        The n-gram at start s is eligible for size n once it ends at or before the start of
        the current length-n tail (s + n <= length - n). The sequence only grows, so an
        eligible start stays eligible, and later starts overwrite earlier ones: the index
        always holds the most recent eligible occurrence.
        """
        tokens, length = self.tokens, len(self.tokens)
        for n, indexed in self._indexed.items():
            eligible = length - 2 * n + 1
            for start in range(indexed, eligible):
                self._latest[tuple(tokens[start : start + n])] = start
            self._indexed[n] = max(indexed, eligible)
