"""The legacy completions ``logprobs``: the target's scores of a request's tokens, in slices.

A scoring pass runs the target over the prompt and the completion on a cache of its own,
``PREFILL_CHUNK`` positions per model turn, so that other requests' passes run between its
chunks; each chunk's logits are reduced at once (log-softmax over ``SOFTMAX_ROWS`` rows at a
time) to what the answer needs: each token's log-probability and its position's top tokens.
Full-width logits for every position (370 MB at 1,900 positions of a 49,152-token vocabulary,
twice that as float64) are never held. The work is bounded per request: at most
``ScoreLimits.max_positions`` positions, checked before anything runs, and at most
``max_seconds`` of model time, checked after each chunk.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgespec.engine.generation import ModelTurn
from edgespec.errors import ConfigError
from edgespec.runtime.model import PREFILL_CHUNK, OnnxModel
from edgespec.server.sessions import full_session_bytes

#: Rows of float64 log-softmax computed at once (about 12 MB each for a 49,152-token vocabulary).
SOFTMAX_ROWS = 32


@dataclass(frozen=True, kw_only=True)
class ScoreLimits:
    """The scoring work one request may ask for: ``max_positions`` tokens (prompt and
    completion) and ``max_seconds`` of model time."""

    max_positions: int = 1024
    max_seconds: float = 10.0

    def __post_init__(self) -> None:
        if self.max_positions < 1 or self.max_seconds <= 0:
            raise ConfigError(
                "--max-scored-positions and --max-score-seconds must be positive",
                fix="e.g. --max-scored-positions 1024 --max-score-seconds 10",
            )


class ScoreBudgetError(Exception):
    """A request's scoring ran past its time budget (answered with a 422)."""


@dataclass(frozen=True, kw_only=True)
class Scored:
    """One position's score: the log-probability of its token, and the ``top`` most likely
    tokens there (ids and log-probabilities, most likely first, ties by lower id)."""

    logprob: float
    top_ids: tuple[int, ...]
    top_logprobs: tuple[float, ...]


def peak_bytes(target: OnnxModel) -> int:
    """What one scoring pass holds at most beyond the server's steady state: a cache of the
    whole context, one chunk's float32 logits and three float64 slices of log-softmax."""
    vocab = target.vocab_size
    return full_session_bytes(target) + PREFILL_CHUNK * vocab * 4 + 3 * SOFTMAX_ROWS * vocab * 8


class Scorer:
    """Scores token sequences on ``target``, one scoring pass at a time (so that one pass's
    cache is the most scoring holds), each chunk in one ``turn`` of the model."""

    def __init__(self, target: OnnxModel, *, turn: ModelTurn, limits: ScoreLimits) -> None:
        self.target = target
        self.turn = turn
        self.limits = limits
        self._one_at_a_time = threading.Lock()

    def score(self, tokens: Sequence[int], *, first: int, top: int) -> list[Scored | None]:
        """Scores of ``tokens[first:]`` (None for token 0, which nothing predicts). Raises
        :class:`ScoreBudgetError` when the model time exceeds ``limits.max_seconds``."""
        target = self.target
        fed = list(tokens[:-1])  # row i predicts token i + 1: the last token predicts nothing
        scores: list[Scored | None] = [None] if first == 0 else []
        spent = 0.0
        with self._one_at_a_time:
            cache = target.new_cache()
            for begin in range(0, len(fed), PREFILL_CHUNK):
                end = min(begin + PREFILL_CHUNK, len(fed))
                if spent > self.limits.max_seconds:
                    raise ScoreBudgetError(
                        f"scoring stopped after {spent:.1f} s of model time, at position {begin} "
                        f"of {len(tokens)}"
                    )

                def chunk(begin: int = begin, end: int = end) -> list[Scored]:
                    logits = target.forward(fed[begin:end], cache)
                    # Rows before position first - 1 only fill the cache.
                    wanted = max(first - 1 - begin, 0)
                    return _reduce(logits[wanted:], tokens[begin + wanted + 1 : end + 1], top=top)

                started = time.perf_counter()
                scores += self.turn(chunk)
                spent += time.perf_counter() - started
        return scores


def _reduce(logits: np.ndarray, tokens: Sequence[int], *, top: int) -> list[Scored]:
    """Row i's log-softmax reduced to ``tokens[i]``'s log-probability and the top ``top``."""
    scores: list[Scored] = []
    top = min(top, logits.shape[-1])
    for begin in range(0, len(tokens), SOFTMAX_ROWS):
        rows = np.array(logits[begin : begin + SOFTMAX_ROWS], dtype=np.float64)
        rows -= rows.max(axis=-1, keepdims=True)
        rows -= np.log(np.exp(rows).sum(axis=-1, keepdims=True))
        for row, token in zip(rows, tokens[begin : begin + SOFTMAX_ROWS], strict=False):
            # The ``top`` largest without sorting the whole vocabulary.
            best = np.argpartition(-row, top - 1)[:top] if top else np.zeros(0, dtype=np.int64)
            best = best[np.lexsort((best, -row[best]))]  # most likely first, ties by lower id
            scores.append(
                Scored(
                    logprob=float(row[int(token)]),
                    top_ids=tuple(int(t) for t in best),
                    top_logprobs=tuple(float(row[t]) for t in best),
                )
            )
    return scores
