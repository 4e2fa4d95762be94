"""What the engine consults around a generation: energy meter, memory, the budget policy.

:class:`Telemetry` belongs to an engine (discovery runs once, lazily); :meth:`Telemetry.watch`
gives one generation a :class:`Watch`, whose ``k_policy`` the engine hands to the decoder in
place of its own and whose ``stats`` join ``Result.stats``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from edgespec.config import BudgetConfig
from edgespec.events import KPolicy
from edgespec.telemetry.budget import BudgetedK, BudgetPolicy, Conditions
from edgespec.telemetry.discover import Discovery, discover
from edgespec.telemetry.energy import EnergyMeter, measure_idle_power
from edgespec.telemetry.estimate import MIB, Admission
from edgespec.telemetry.memory import MemoryProbe
from edgespec.telemetry.sources import battery_state
from edgespec.telemetry.sysfs import Tree

#: Power is averaged over this window for the budget policy.
POWER_WINDOW_S = 1.0


class Telemetry:
    """Probes of one device (``tree``) and the budgets an engine stays inside."""

    def __init__(
        self,
        *,
        tree: Tree | None = None,
        budget: BudgetConfig | None = None,
        admission: Admission | None = None,
        measure_energy: bool = True,
        remote_available: bool = False,
        clock: Callable[[], float] = time.monotonic,
        sample_interval_s: float = 0.05,
    ) -> None:
        self.tree = tree or Tree()
        self.budget = budget
        self.admission = admission
        self.measure_energy = measure_energy
        self.remote_available = remote_available
        self.clock = clock
        self.sample_interval_s = sample_interval_s
        self.memory = MemoryProbe(self.tree)
        self.baseline_w: float | None = None
        self._discovery: Discovery | None = None

    @property
    def discovery(self) -> Discovery:
        if self._discovery is None:
            self._discovery = discover(self.tree)
        return self._discovery

    def measure_idle(self, seconds: float = 2.0) -> float | None:
        """Measures the idle baseline (subtracted for ``energy_j_net``); None without a source."""
        source = self.discovery.best if self.measure_energy else None
        if source is not None:
            self.baseline_w = measure_idle_power(source, seconds=seconds)
        return self.baseline_w

    def watch(self, k_policy: KPolicy) -> Watch:
        source = self.discovery.best if self.measure_energy else None
        meter = EnergyMeter(
            source,
            unavailable_reason=(
                self.discovery.reason() if self.measure_energy else "energy measurement off"
            ),
            baseline_w=self.baseline_w,
            clock=self.clock,
            interval_s=self.sample_interval_s,
        )
        return Watch(self, meter, k_policy)


class Watch:
    """One generation: start, (the decoder runs with ``k_policy``), stop, stats."""

    def __init__(self, telemetry: Telemetry, meter: EnergyMeter, k_policy: KPolicy) -> None:
        self.telemetry = telemetry
        self.meter = meter
        budget = telemetry.budget
        self.budgeted = (
            BudgetedK(
                k_policy,
                BudgetPolicy(budget, remote_available=telemetry.remote_available),
                conditions=self.conditions,
                clock=telemetry.clock,
            )
            if budget is not None and budget.watches_anything
            else None
        )
        self.k_policy: KPolicy = self.budgeted or k_policy
        self._stopped = False

    @property
    def mode(self) -> str:
        """The budget policy's mode now ("full" without a budget)."""
        return self.budgeted.policy.mode if self.budgeted is not None else "full"

    def conditions(self, tokens: int) -> Conditions:
        telemetry = self.telemetry
        snapshot = telemetry.memory.snapshot()
        battery = battery_state(telemetry.tree)
        sampler = self.meter.sampler
        energy = sampler.energy_j if sampler is not None else None
        # On Jetson, GPU allocations (NvMap) do not show in RSS: count them too (system-wide,
        # so an upper bound for this process).
        used = (
            None
            if snapshot.rss_bytes is None
            else snapshot.rss_bytes + (snapshot.nvmap_used_bytes or 0)
        )
        return Conditions(
            time_s=telemetry.clock(),
            plugged=battery.plugged,
            battery_pct=battery.percent,
            power_w=self.meter.recent_power_w(POWER_WINDOW_S),
            rss_mb=None if used is None else used / MIB,
            mem_available_mb=(
                None if snapshot.mem_available_bytes is None else snapshot.mem_available_bytes / MIB
            ),
            energy_per_token_j=energy / tokens if energy is not None and tokens else None,
        )

    def start(self) -> None:
        self.meter.start()

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.meter.stop()

    def stats(self, tokens: int) -> dict[str, Any]:
        """Energy keys, ``memory`` (RSS now and peak, the admission) and ``budget``."""
        self.stop()
        stats = self.meter.as_stats(tokens)
        memory: dict[str, Any] = dict(self.telemetry.memory.snapshot().as_dict())
        admission = self.telemetry.admission
        if admission is not None:
            memory.update(admission.as_dict())
        stats["memory"] = memory
        stats["budget"] = self.budgeted.as_stats() if self.budgeted is not None else None
        return stats
