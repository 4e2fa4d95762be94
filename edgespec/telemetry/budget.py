"""The budget policy: between rounds, shrink k, stop speculating or verify remotely.

Two kinds of condition decide the mode (``full`` < ``shrink`` < ``off``/``remote``):

* floors, applied at once: on battery at least ``shrink``; below ``min_battery_pct`` on
  battery, or RSS at 95 % of the memory budget, or ``MemAvailable`` under
  ``LOW_AVAILABLE_MB``: ``off`` (``remote`` when a remote target is configured, for the battery
  and power conditions). A floor is lifted only past a margin: plugged in, or the battery
  ``BATTERY_MARGIN_PCT`` points above its minimum; RSS ``hysteresis`` below the budget.
* a stepping controller for power and energy per token: over budget, one step up; under
  ``(1 - hysteresis)`` × budget for ``hold_s``, one step down; at most one step per ``hold_s``.

Every change of mode is a :class:`Decision` with its reason. The policy never touches the
decoder: :class:`BudgetedK` wraps the engine's k policy, and the decoder asks it for k.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from edgespec.config import BudgetConfig
from edgespec.events import KPolicy, StepRecord

MODES = ("full", "shrink", "off")
#: Below this much ``MemAvailable`` the device is short of memory whatever the budget.
LOW_AVAILABLE_MB = 100.0
#: Points above ``min_battery_pct`` the battery must reach before the low-battery floor lifts.
BATTERY_MARGIN_PCT = 5.0
#: RSS above this fraction of the memory budget stops speculation (the draft's work).
MEMORY_HIGH_FRACTION = 0.95


@dataclass(frozen=True, kw_only=True)
class Conditions:
    """What the probes saw at ``time_s`` (None: not known)."""

    time_s: float
    plugged: bool | None = None
    battery_pct: float | None = None
    power_w: float | None = None
    rss_mb: float | None = None
    mem_available_mb: float | None = None
    energy_per_token_j: float | None = None


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The mode from round ``round`` on, and why."""

    time_s: float
    round: int
    mode: str
    reason: str


class BudgetPolicy:
    """Decides the mode from a stream of :class:`Conditions` (see the module docstring)."""

    def __init__(self, config: BudgetConfig, *, remote_available: bool = False) -> None:
        self.config = config
        self.remote_available = remote_available
        self.level = 0
        self.decisions: list[Decision] = []
        self._controller = 0
        self._controller_reason = ""
        self._stepped_at: float | None = None
        self._under_since: float | None = None
        self._battery_low = False
        self._memory_high = False

    @property
    def mode(self) -> str:
        if self.level == 2 and self.remote_available and not self._memory_high:
            return "remote"
        return MODES[self.level]

    def cap(self, k: int) -> int:
        """The k to use instead of ``k`` in the current mode (remote keeps k)."""
        if self.mode == "shrink":
            return min(k, max(1, k // 2))
        return 0 if self.mode == "off" else k

    def _floor(self, seen: Conditions) -> tuple[int, str]:
        config = self.config
        floor, reason = 0, ""
        on_battery = seen.plugged is False
        if config.min_battery_pct is not None and seen.battery_pct is not None and on_battery:
            limit = config.min_battery_pct + (BATTERY_MARGIN_PCT if self._battery_low else 0.0)
            self._battery_low = seen.battery_pct < limit
        else:
            self._battery_low = False
        if on_battery:
            floor, reason = 1, "on battery"
        if self._battery_low:
            floor = 2
            reason = f"battery at {seen.battery_pct:.0f}% < {config.min_battery_pct:.0f}%"
        if config.memory_mb is not None and seen.rss_mb is not None:
            limit = config.memory_mb * (
                1.0 - config.hysteresis if self._memory_high else MEMORY_HIGH_FRACTION
            )
            self._memory_high = seen.rss_mb >= limit
        short = seen.mem_available_mb is not None and seen.mem_available_mb < LOW_AVAILABLE_MB
        if self._memory_high or short:
            floor = 2
            reason = (
                f"RSS {seen.rss_mb:.0f} MB near the {config.memory_mb:.0f} MB budget"
                if self._memory_high
                else f"MemAvailable {seen.mem_available_mb:.0f} MB"
            )
        return floor, reason

    def _over(self, seen: Conditions, scale: float) -> str:
        """Why a watched figure is above ``scale`` × its budget ("" when none is)."""
        config = self.config
        power = seen.power_w
        if config.power_w is not None and power is not None and power > config.power_w * scale:
            return f"power {power:.1f} W over the {config.power_w:.1f} W budget"
        budget_j = config.energy_per_token_j
        per_token = seen.energy_per_token_j
        if budget_j is not None and per_token is not None and per_token > budget_j * scale:
            return f"{per_token:.3f} J/token over the {budget_j:.3f} J budget"
        return ""

    def _step_controller(self, seen: Conditions) -> None:
        now, hold = seen.time_s, self.config.hold_s
        settled = self._stepped_at is None or now - self._stepped_at >= hold
        over = self._over(seen, 1.0)
        if over:
            self._under_since = None
            if settled and self._controller < 2:
                self._controller += 1
                self._controller_reason = over
                self._stepped_at = now
            return
        if self._over(seen, 1.0 - self.config.hysteresis):
            self._under_since = None  # inside the band: hold
            return
        if self._under_since is None:
            self._under_since = now
        if self._controller > 0 and settled and now - self._under_since >= hold:
            self._controller -= 1
            self._under_since = self._stepped_at = now

    def update(self, seen: Conditions, *, round: int) -> Decision | None:
        """Takes new readings; returns the decision when the mode changes."""
        floor, floor_reason = self._floor(seen)
        self._step_controller(seen)
        level = max(floor, self._controller)
        if level == self.level:
            return None
        if level > self.level:
            reason = floor_reason if floor >= self._controller else self._controller_reason
        else:
            cause = "plugged in" if seen.plugged else "conditions back within budget"
            still = f"; still {floor_reason}" if floor == level and floor > 0 else ""
            reason = f"recovered ({cause}){still}"
        self.level = level
        decision = Decision(time_s=seen.time_s, round=round, mode=self.mode, reason=reason)
        self.decisions.append(decision)
        return decision

    def as_stats(self) -> dict[str, Any]:
        return {"mode": self.mode, "decisions": [asdict(d) for d in self.decisions]}


class BudgetedK:
    """A k policy that asks ``inner`` for k and the budget policy for the cap; it reads the
    conditions at most every ``check_every_s`` of ``clock``."""

    def __init__(
        self,
        inner: KPolicy,
        policy: BudgetPolicy,
        *,
        conditions: Callable[[int], Conditions],
        clock: Callable[[], float],
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.conditions = conditions
        self.clock = clock
        self.tokens = 0
        self.round = 0
        self.capped_rounds = 0
        self._checked_at: float | None = None

    def next_k(self) -> int:
        now = self.clock()
        every = self.policy.config.check_every_s
        if self._checked_at is None or now - self._checked_at >= every:
            self._checked_at = now
            self.policy.update(self.conditions(self.tokens), round=self.round)
        wanted = self.inner.next_k()
        k = self.policy.cap(wanted)
        self.capped_rounds += k < wanted
        return k

    def observe(self, record: StepRecord) -> None:
        self.inner.observe(record)
        self.tokens += len(record.committed)
        self.round += 1

    def as_stats(self) -> dict[str, Any]:
        return {**self.policy.as_stats(), "capped_rounds": self.capped_rounds}
