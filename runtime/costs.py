"""Measures the costs speculation trades: T(w) of target passes over w positions, and c."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from edgespec.graph.kv_cache import KVCache
from edgespec.graph.window import SINK
from edgespec.runtime.k_policy import CostProfile
from edgespec.runtime.model import OnnxModel


def pass_times(
    model: OnnxModel, cache: KVCache, tokens: Sequence[int], *, length: int, passes: int
) -> list[float]:
    """The seconds of each of ``passes`` passes of ``tokens`` over ``cache``, which is
    cropped back to ``length`` after every pass, so that each pass reads the same cache."""
    found = []
    for _ in range(passes):
        started = time.perf_counter()
        _forward(model, tokens, cache)
        found.append(time.perf_counter() - started)
        cache.crop(length)
    return found


def width_times(
    model: OnnxModel, context: Sequence[int], widths: Sequence[int], repeats: int
) -> list[list[float]]:
    """Every pass's seconds for each of ``widths`` new tokens after ``context``: ``repeats``
    passes each (one cache, prefilled once and cropped back after every pass).

    The widths take turns within each repeat, so that a slow stretch of a busy machine slows
    every width alike rather than the few measured during it."""
    cache = model.new_cache()
    # The last row's logits only: every row's would hold context × vocab floats for nothing.
    _forward(model, context, cache, last_only=True)
    found: list[list[float]] = [[] for _ in widths]
    for _ in range(repeats):
        for times, width in zip(found, widths, strict=True):
            times += pass_times(model, cache, [context[-1]] * width, length=len(context), passes=1)
    return found


def _forward(
    model: OnnxModel, tokens: Sequence[int], cache: KVCache, *, last_only: bool = False
) -> None:
    """One pass; a head's graph is fed zero features (its cost does not depend on them)."""
    if model.graph.feature_input is None:
        model.forward(tokens, cache, last_only=last_only)
        return
    zeros = np.zeros((len(tokens), model.model.hidden_size), np.float32)
    model.forward_features(tokens, cache, last_only=last_only, feature_input=zeros)


def _best_times(
    model: OnnxModel, context: Sequence[int], widths: Sequence[int], repeats: int
) -> list[float]:
    """The fastest of ``repeats`` passes over each of ``widths`` new tokens after ``context``
    (:func:`width_times`). Noise only adds time, and a pass over more positions does more
    work, so a width's time is at most any wider one's: each keeps the least of its own and
    the wider widths' times (``widths`` ascending)."""
    best = [min(times) for times in width_times(model, context, widths, repeats)]
    for index in range(len(best) - 2, -1, -1):
        best[index] = min(best[index], best[index + 1])
    return best


#: The history after which what a position adds to a pass is timed (the cache is not filled:
#: attention costs the same over any values, so the positions are only counted as written).
DEEP_POSITIONS = 2048


def position_cost(
    model: OnnxModel, context: Sequence[int], width: int, shallow_s: float, *, repeats: int
) -> float:
    """Seconds one row of a pass spends per position of history: a pass of ``width`` rows
    timed after :data:`DEEP_POSITIONS` positions (or as many as the context allows, or as a
    windowed draft reads: :func:`read_positions`) against ``shallow_s``, its time after
    ``context``. 0 for a graph whose cache cannot be deepened without computing it (a concat
    graph's), or where the context leaves no room."""
    depth = min(
        DEEP_POSITIONS, model.max_length - width - 1, read_positions(model) or DEEP_POSITIONS
    )
    if not model.shared_kv or depth <= 2 * len(context):
        return 0.0
    cache = model.new_cache()
    _forward(model, context, cache, last_only=True)
    # An in-place cache (SharedKVCache) counts positions as written without computing them.
    advance = getattr(cache, "advance")  # noqa: B009 (not on the KVCache protocol)
    advance(depth - cache.length)
    deep = min(pass_times(model, cache, [context[-1]] * width, length=depth, passes=repeats))
    return max(deep - shallow_s, 0.0) / (width * (depth - len(context)))


def read_positions(model: OnnxModel | None) -> int:
    """The most positions a pass of ``model`` reads per row: its window and sink when it
    attends over a window of its history (:mod:`edgespec.graph.window`), else 0 (all)."""
    window = getattr(model, "attention_window", 0) if model is not None else 0
    return window + SINK if window else 0


def measure_costs(
    target: OnnxModel,
    draft: OnnxModel | None,
    *,
    max_width: int = 9,
    context_tokens: int = 64,
    repeats: int = 5,
) -> CostProfile:
    """Times target passes of width 1..max_width and a draft step after a short context, and
    what a position of history adds to a row of each (:func:`position_cost`)."""
    limit = min(target.max_length, draft.max_length if draft else target.max_length)
    context = list(range(1, 1 + min(context_tokens, limit - max_width - 1)))
    widths = _best_times(target, context, range(1, max_width + 1), repeats)
    draft_step = _best_times(draft, context, [1], repeats)[0] if draft is not None else 0.0
    return CostProfile(
        target_step_s=widths[0],
        draft_step_s=draft_step,
        verify_cost=tuple(t / widths[0] for t in widths),
        target_position_s=position_cost(target, context, max_width, widths[-1], repeats=repeats),
        draft_position_s=position_cost(draft, context, 1, draft_step, repeats=repeats)
        if draft is not None
        else 0.0,
        draft_window=read_positions(draft),
    )
