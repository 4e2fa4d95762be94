"""The batch invariance check every exporter runs, on a scripted graph whose multi-token
passes differ from its single steps at known positions (no models)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.export.invariance import WidthTally, check_batch_invariance, invariance_result

VOCAB = 4


@dataclass
class _Cache:
    length: int = 0


class ScriptedGraph:
    """Position p's argmax is p % 3, except in passes of ``wrong_width`` tokens, whose last
    token's argmax is 3; every logit of a pass wider than one is off by ``drift``."""

    #: A graph without a ``features`` output (the check then compares logits alone).
    has_features = False

    def __init__(self, *, wrong_width: int, drift: float = 0.0) -> None:
        self.wrong_width = wrong_width
        self.drift = drift

    def new_cache(self) -> _Cache:
        return _Cache()

    def forward(self, token_ids: Sequence[int], cache: _Cache) -> np.ndarray:
        width = len(token_ids)
        logits = np.zeros((width, VOCAB), dtype=np.float32)
        for row in range(width):
            logits[row, (cache.length + row) % 3] = 1.0
        if width == self.wrong_width:
            logits[-1, 3] = 2.0
        if width > 1:
            logits += self.drift
        cache.length += width
        return logits


def test_each_width_is_counted_over_its_own_positions() -> None:
    """24 positions after the prefill: width 3 runs 8 passes with one wrong token each, so a
    third of its positions differ; widths 2 and 4 run the same positions without a miss."""
    stream = list(range(2 + 24))
    result = check_batch_invariance(
        ScriptedGraph(wrong_width=3, drift=0.25),  # type: ignore[arg-type]
        [stream],
        prefill=2,
        widths=(2, 3, 4),
    )
    assert result.mismatch_fraction_by_width == {"2": 0.0, "3": 8 / 24, "4": 0.0}
    assert result.positions == 72
    assert result.argmax_mismatch_fraction == 8 / 72
    assert result.max_abs_logit_diff == 2.25  # the wrong logit over its reference's zero
    assert result.widths == (2, 3, 4) and not result.passed


def test_streams_add_up_and_whole_passes_only_are_compared() -> None:
    """Two streams of 10 positions: width 4 fits two whole passes (8 positions) in each."""
    streams = [list(range(3 + 10)), list(range(100, 113))]
    result = check_batch_invariance(
        ScriptedGraph(wrong_width=4),  # type: ignore[arg-type]
        streams,
        prefill=3,
        widths=(2, 4),
    )
    assert result.mismatch_fraction_by_width == {"2": 0.0, "4": 4 / 16}
    assert result.positions == 20 + 16
    assert result.argmax_mismatch_fraction == 4 / 36


def test_an_invariant_graph_passes() -> None:
    result = check_batch_invariance(
        ScriptedGraph(wrong_width=0),  # type: ignore[arg-type]
        [list(range(20))],
        prefill=4,
    )
    assert result.passed and result.argmax_mismatch_fraction == 0.0
    assert set(result.mismatch_fraction_by_width.values()) == {0.0}


def test_the_result_divides_each_width_by_its_own_count() -> None:
    tallies = [
        WidthTally(width=2, mismatched=0, compared=10),
        WidthTally(width=3, mismatched=3, compared=9),
        WidthTally(width=4, mismatched=2, compared=8),
    ]
    result = invariance_result(tallies, max_abs_logit_diff=0.5)
    assert result.mismatch_fraction_by_width == {"2": 0.0, "3": 3 / 9, "4": 2 / 8}
    assert result.argmax_mismatch_fraction == 5 / 27 and result.positions == 27
