"""Per-generation statistics, collected by an observer the engine injects into the decoder."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from edgespec.events import StepRecord


class StatsCollector:
    """A :class:`~edgespec.events.DecodeObserver` that turns step records into the decode part of
    ``Result.stats``.

    Times are wall-clock (``time.perf_counter``). ``decode_ms`` sums the rounds (from the start
    of a round to its step record), so time the caller spends between rounds is excluded;
    ``overhead_ms`` is the part of it that was neither drafting nor verifying: the loop's cost.
    """

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.finish_reason = ""
        self._started = self._prefilled = self._first_token = self._round_started = 0.0
        #: Time inside rounds only: what the consumer does between rounds is not counted.
        self._loop_s = 0.0
        self.prompt_tokens = 0

    def on_start(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self._started = time.perf_counter()

    def on_prefilled(self) -> None:
        self._prefilled = time.perf_counter()

    def on_step(self, record: StepRecord) -> None:
        now = time.perf_counter()
        if not self.records:
            self._first_token = now
        self._loop_s += now - self._round_started
        self.records.append(record)

    def on_round_start(self) -> None:
        self._round_started = time.perf_counter()

    def on_finish(self, reason: str) -> None:
        """Keeps the first reason, except that a stop string found in the final text wins."""
        if not self.finish_reason or reason == "stop_string":
            self.finish_reason = reason

    def as_dict(self) -> dict[str, Any]:
        records = self.records
        new_tokens = sum(len(r.committed) for r in records)
        drafted = sum(r.drafted for r in records)
        accepted = sum(r.n_accepted for r in records)
        # Draft tokens the target actually judged: all accepted ones plus the first rejected.
        tested = sum(r.n_accepted + (r.n_accepted < r.drafted) for r in records)
        draft_s = sum(r.draft_s for r in records)
        verify_s = sum(r.verify_s for r in records)
        draft_steps = sum(r.draft_steps for r in records)
        decode_s = self._loop_s
        longest = max((r.drafted for r in records), default=0)
        by_position = []
        for position in range(longest):
            offered = [r for r in records if r.drafted > position]
            by_position.append(sum(r.n_accepted > position for r in offered) / len(offered))
        k_counts = Counter(r.k for r in records)
        # "drafted,accepted,model" per round (model 1 when a draft model ran): what the
        # profile replays to price each k without assuming tokens are accepted independently.
        outcomes = Counter(f"{r.drafted},{r.n_accepted},{r.draft_steps}" for r in records)
        overhead_s = max(decode_s - draft_s - verify_s, 0.0)
        return {
            "new_tokens": new_tokens,
            "prompt_tokens": self.prompt_tokens,
            "rounds": len(records),
            "drafted": drafted,
            "accepted": accepted,
            "tested": tested,
            "alpha": accepted / tested if tested else None,
            "mean_accepted": new_tokens / len(records) if records else 0.0,
            "acceptance_by_position": by_position,
            "draft_ms": draft_s * 1e3,
            "draft_steps": draft_steps,
            "verify_ms": verify_s * 1e3,
            "overhead_ms": overhead_s * 1e3,
            "overhead_ms_per_round": overhead_s * 1e3 / len(records) if records else 0.0,
            "prefill_ms": (self._prefilled - self._started) * 1e3 if self._prefilled else 0.0,
            "time_to_first_token_ms": (
                (self._first_token - self._started) * 1e3 if self._first_token else None
            ),
            "decode_ms": decode_s * 1e3,
            "tokens_per_s": new_tokens / decode_s if decode_s > 0 else None,
            "k_values": sorted(k_counts),
            "k_counts": {str(k): n for k, n in sorted(k_counts.items())},
            "round_outcomes": dict(sorted(outcomes.items())),
            "finish_reason": self.finish_reason,
        }
