"""Batch invariance, checked by every exporter: positions computed in one pass of width w
against the same positions computed one at a time. Greedy speculative output equals the
target's own greedy output only if no argmax differs, because a verify pass of k drafted
tokens is a pass of width k + 1 while target-only decoding runs one token per pass.

The graph is driven by :class:`~edgespec.graph.driver.GraphDriver`, as the runtime drives it
(in-place graphs padded to their narrowest pass and cut at their attention boundaries)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgespec.events import ProgressEvent, ProgressObserver, ignore_progress
from edgespec.graph.driver import GraphDriver
from edgespec.graph.kv_cache import KVCache
from edgespec.verification import BatchInvarianceResult

#: Pass widths checked: k + 1 verify positions for k = 1..8.
WIDTHS = tuple(range(2, 10))


@dataclass(frozen=True, kw_only=True)
class WidthTally:
    """One width's count: ``mismatched`` of ``compared`` positions picked another argmax."""

    width: int
    mismatched: int
    compared: int


def check_batch_invariance(
    driver: GraphDriver,
    streams: Sequence[Sequence[int]],
    *,
    prefill: int,
    widths: Sequence[int] = WIDTHS,
    observe: ProgressObserver = ignore_progress,
) -> BatchInvarianceResult:
    """Each stream's first ``prefill`` tokens are fed in one pass; every later position's
    logits are computed once one token at a time (the reference) and, for each width w, in
    consecutive passes of w tokens (as a verify pass of k = w - 1 drafted tokens would), as far
    as whole passes reach."""
    references = [(list(tokens), *_single_steps(driver, tokens, prefill)) for tokens in streams]
    tallies = []
    max_diff = 0.0
    feature_diff = 0.0
    for step, width in enumerate(widths):
        mismatched = compared = 0
        for tokens, single, single_features in references:
            cache = driver.new_cache()
            driver.forward(tokens[:prefill], cache)
            for offset in range(0, len(single) - width + 1, width):
                start = prefill + offset
                logits, features = _pass(driver, tokens[start : start + width], cache)
                reference = single[offset : offset + width]
                mismatched += int(np.sum(logits.argmax(-1) != reference.argmax(-1)))
                max_diff = max(max_diff, float(np.max(np.abs(logits - reference))))
                if features is not None and single_features is not None:
                    expected = single_features[offset : offset + width]
                    feature_diff = max(feature_diff, float(np.max(np.abs(features - expected))))
                compared += width
        tallies.append(WidthTally(width=width, mismatched=mismatched, compared=compared))
        observe(
            ProgressEvent(
                stage="verify",
                message=f"batch invariance, width {width}",
                step=step + 1,
                total=len(widths),
            )
        )
    result = invariance_result(tallies, max_abs_logit_diff=max_diff)
    return replace(result, max_abs_feature_diff=feature_diff) if driver.has_features else result


def invariance_result(
    tallies: Sequence[WidthTally], *, max_abs_logit_diff: float
) -> BatchInvarianceResult:
    """The manifest's record of the widths' tallies: each width's fraction over its own
    positions, the overall one over all of them."""
    mismatched = sum(t.mismatched for t in tallies)
    compared = sum(t.compared for t in tallies)
    return BatchInvarianceResult(
        widths=tuple(t.width for t in tallies),
        positions=compared,
        argmax_mismatch_fraction=mismatched / max(compared, 1),
        max_abs_logit_diff=max_abs_logit_diff,
        mismatch_fraction_by_width={
            str(t.width): t.mismatched / max(t.compared, 1) for t in tallies
        },
        passed=mismatched == 0,
    )


def _pass(
    driver: GraphDriver, tokens: Sequence[int], cache: KVCache
) -> tuple[np.ndarray, np.ndarray | None]:
    """One pass's logits [n, vocab] (a copy), and its features [n, hidden] when the graph
    returns them (else None)."""
    if driver.has_features:
        logits, features = driver.forward_features(tokens, cache)
        return np.array(logits), features
    return np.array(driver.forward(tokens, cache)), None


def _single_steps(
    driver: GraphDriver, tokens: Sequence[int], prefill: int
) -> tuple[np.ndarray, np.ndarray | None]:
    """Logits [len(tokens) - prefill, vocab] computed one position at a time after a prefill,
    and the features [len(tokens) - prefill, hidden] of those steps (None without them)."""
    cache = driver.new_cache()
    driver.forward(tokens[:prefill], cache)
    steps = [_pass(driver, [token], cache) for token in tokens[prefill:]]
    logits = np.concatenate([step[0] for step in steps])
    features = [step[1] for step in steps]
    return logits, None if features[0] is None else np.concatenate(features)  # type: ignore[arg-type]
