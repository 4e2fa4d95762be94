"""Passes cut at a graph's ``attention_boundaries``, shared by the runtime and the export's
checks: the totals (past + pass width) at which the graph's attention rounds differently
(:mod:`edgespec.export.gguf.regimes` says why and probes them). Token i of a pass after
``past`` belongs to the regime of its own single step's total, past + i + min_pass_width; a
pass holding tokens of two regimes is cut between them, so a position gets the same bits
whichever pass computes it."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence


def regime(total: int, boundaries: Sequence[int]) -> int:
    """How many boundaries lie at or below ``total``."""
    return bisect_right(boundaries, total)


def pass_pieces(
    past: int, count: int, min_width: int, boundaries: Sequence[int]
) -> list[tuple[int, int, int]]:
    """A pass of ``count`` tokens after ``past`` as (begin, end, width) pieces: tokens
    [begin, end) run as one pass padded to ``width`` positions. Token i (position past + i)
    belongs to the regime of its single step's total, past + i + min_width, and each piece
    holds the tokens of one regime."""
    step = max(min_width, 1)
    if not boundaries:
        return [(0, count, max(count, step))]
    pieces: list[tuple[int, int, int]] = []
    begin = 0
    while begin < count:
        wanted = regime(past + begin + step, boundaries)
        end = begin + 1
        while end < count and regime(past + end + step, boundaries) == wanted:
            end += 1
        # The piece's total, past + begin + width, lies between its first token's single-step
        # total and its last token's, so it falls in the same regime.
        pieces.append((begin, end, max(end - begin, step)))
        begin = end
    return pieces
