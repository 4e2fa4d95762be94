"""Energy of a window: counters read at both ends, power sensors integrated over time.

A :class:`Sampler` reads one source on a background thread every ``interval_s`` of a monotonic
clock (and once at start and stop). For a power source the energy is the trapezoid rule over
the samples; for a counter it is the last reading minus the first (intermediate readings keep
the wrap-around bookkeeping of RAPL counters current). :class:`EnergyMeter` adds process
CPU-seconds, always available, as a portable proxy on CPU-only devices.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.telemetry.sources import EnergySource

Clock = Callable[[], float]
#: A window shorter than this many sensor updates is flagged ``too_short``.
MIN_UPDATES_PER_WINDOW = 5


@dataclass(frozen=True, kw_only=True)
class Sample:
    time_s: float
    value: float


def trapezoid(samples: Sequence[Sample]) -> float:
    """∫ value dt over the samples (watts × seconds = joules)."""
    return sum(
        (b.time_s - a.time_s) * (a.value + b.value) / 2.0 for a, b in itertools.pairwise(samples)
    )


class Sampler:
    """Samples ``source`` between :meth:`start` and :meth:`stop`; a read error ends sampling
    and is kept in ``error``."""

    def __init__(
        self, source: EnergySource, *, clock: Clock = time.monotonic, interval_s: float = 0.05
    ) -> None:
        self.source = source
        self.clock = clock
        self.interval_s = interval_s
        self.samples: list[Sample] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        if self.error is not None:
            return
        try:
            value = self.source.read()
        except (OSError, ValueError) as error:
            self.error = f"read failed: {error}"
            return
        self.samples.append(Sample(time_s=self.clock(), value=value))

    def start(self, *, background: bool = True) -> None:
        self.sample()
        if background:
            self._thread = threading.Thread(target=self._run, name="edgespec-power", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def halt(self) -> None:
        """Ends the background thread without a final sample."""
        self._stop.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()

    @property
    def window_s(self) -> float:
        samples = list(self.samples)
        return samples[-1].time_s - samples[0].time_s if len(samples) > 1 else 0.0

    @property
    def energy_j(self) -> float | None:
        samples = list(self.samples)
        if len(samples) < 2:
            return None
        if self.source.info.kind == "counter":
            return samples[-1].value - samples[0].value
        return trapezoid(samples)

    def recent_power_w(self, window_s: float) -> float | None:
        """Mean power over the last ``window_s`` seconds of samples (None: too few yet)."""
        samples = list(self.samples)
        if len(samples) < 2:
            return None
        end = samples[-1].time_s
        recent = [s for s in samples if s.time_s >= end - window_s]
        if len(recent) < 2:
            recent = samples[-2:]
        span = recent[-1].time_s - recent[0].time_s
        if span <= 0:
            return None
        if self.source.info.kind == "counter":
            return (recent[-1].value - recent[0].value) / span
        return trapezoid(recent) / span


def measure_idle_power(
    source: EnergySource,
    *,
    seconds: float = 2.0,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    interval_s: float = 0.05,
) -> float | None:
    """Mean power while this process waits: the baseline subtracted for net energy."""
    sampler = Sampler(source, clock=clock, interval_s=interval_s)
    sampler.start(background=False)
    started = clock()
    while clock() - started < seconds:
        sleep(interval_s)
        sampler.sample()
    energy, window = sampler.energy_j, sampler.window_s
    return energy / window if energy is not None and window > 0 else None


class EnergyMeter:
    """One generation's energy and CPU time. ``process_time`` counts every thread of the
    process (ONNX Runtime's pool included)."""

    def __init__(
        self,
        source: EnergySource | None,
        *,
        unavailable_reason: str = "",
        baseline_w: float | None = None,
        clock: Clock = time.monotonic,
        cpu_clock: Clock = time.process_time,
        interval_s: float = 0.05,
    ) -> None:
        self.sampler = (
            Sampler(source, clock=clock, interval_s=interval_s) if source is not None else None
        )
        if self.sampler is not None:
            # A generation abandoned mid-way never calls stop(): end the thread with the meter.
            weakref.finalize(self, self.sampler.halt)
        self.unavailable_reason = unavailable_reason
        self.baseline_w = baseline_w
        self.cpu_clock = cpu_clock
        self._cpu_started = 0.0
        self._cpu_s = 0.0

    def start(self, *, background: bool = True) -> None:
        self._cpu_started = self.cpu_clock()
        if self.sampler is not None:
            self.sampler.start(background=background)

    def stop(self) -> None:
        self._cpu_s = self.cpu_clock() - self._cpu_started
        if self.sampler is not None:
            self.sampler.stop()

    def recent_power_w(self, window_s: float = 1.0) -> float | None:
        return self.sampler.recent_power_w(window_s) if self.sampler is not None else None

    def as_stats(self, tokens: int) -> dict[str, Any]:
        """The stats keys: ``cpu_s``, ``cpu_s_per_token``, ``energy_j``, ``energy_j_net``,
        ``energy_j_per_token`` and ``energy_source`` (null figures, with a reason, when no
        source could measure this window)."""
        stats: dict[str, Any] = {
            "cpu_s": self._cpu_s,
            "cpu_s_per_token": self._cpu_s / tokens if tokens else None,
            "energy_j": None,
            "energy_j_net": None,
            "energy_j_per_token": None,
        }
        sampler = self.sampler
        energy = sampler.energy_j if sampler is not None else None
        if sampler is None or sampler.error is not None or energy is None:
            reason = self.unavailable_reason if sampler is None else sampler.error
            stats["energy_source"] = {"name": None, "reason": reason or "too few samples"}
            return stats
        info = sampler.source.info
        window = sampler.window_s
        stats["energy_j"] = energy
        if self.baseline_w is not None:
            stats["energy_j_net"] = energy - self.baseline_w * window
        stats["energy_j_per_token"] = energy / tokens if tokens else None
        stats["energy_source"] = {
            "name": info.name,
            "kind": info.kind,
            "scope": info.scope,
            "detail": info.detail,
            "samples": len(sampler.samples),
            "window_s": window,
            "baseline_w": self.baseline_w,
            "too_short": window < MIN_UPDATES_PER_WINDOW * info.update_interval_s,
            "reason": None,
        }
        return stats
