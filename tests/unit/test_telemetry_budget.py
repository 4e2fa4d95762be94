"""The budget policy on scripted readings and a fake clock: battery → low battery → plugged in,
over and under the power budget, memory, hysteresis and the k it lets the decoder use."""

from __future__ import annotations

import pytest

from edgespec.config import BudgetConfig
from edgespec.errors import ConfigError
from edgespec.events import StepRecord
from edgespec.telemetry.budget import BudgetedK, BudgetPolicy, Conditions


def drive(policy: BudgetPolicy, script: list[Conditions]) -> list[str]:
    """The mode after each reading."""
    modes = []
    for index, seen in enumerate(script):
        policy.update(seen, round=index)
        modes.append(policy.mode)
    return modes


def test_battery_then_low_battery_then_plugged_in() -> None:
    policy = BudgetPolicy(BudgetConfig(min_battery_pct=20))
    script = [
        Conditions(time_s=0, plugged=True, battery_pct=90),
        Conditions(time_s=1, plugged=False, battery_pct=90),
        Conditions(time_s=2, plugged=False, battery_pct=19),
        Conditions(time_s=3, plugged=False, battery_pct=22),  # above 20 but inside the margin
        Conditions(time_s=4, plugged=False, battery_pct=19.5),
        Conditions(time_s=5, plugged=False, battery_pct=26),  # 5 points above: floor lifts
        Conditions(time_s=6, plugged=True, battery_pct=26),
        Conditions(time_s=7, plugged=True, battery_pct=27),
    ]
    assert drive(policy, script) == [
        "full",
        "shrink",
        "off",
        "off",
        "off",
        "shrink",
        "full",
        "full",
    ]
    assert [(d.round, d.mode, d.reason) for d in policy.decisions] == [
        (1, "shrink", "on battery"),
        (2, "off", "battery at 19% < 20%"),
        (5, "shrink", "recovered (conditions back within budget); still on battery"),
        (6, "full", "recovered (plugged in)"),
    ]


def test_low_battery_moves_verification_remote_when_configured() -> None:
    policy = BudgetPolicy(BudgetConfig(min_battery_pct=20), remote_available=True)
    policy.update(Conditions(time_s=0, plugged=False, battery_pct=10), round=0)
    assert policy.mode == "remote"
    assert policy.cap(4) == 4  # remote verification keeps drafting


def test_power_budget_steps_with_hold_time_and_hysteresis_band() -> None:
    policy = BudgetPolicy(BudgetConfig(power_w=10.0, hold_s=2.0, hysteresis=0.15))
    script = [
        Conditions(time_s=0.0, power_w=5.0),
        Conditions(time_s=10.0, power_w=12.0),  # over: one step up at once
        Conditions(time_s=10.5, power_w=12.0),  # still over, but within hold_s of the step
        Conditions(time_s=12.1, power_w=12.0),  # a second step
        Conditions(time_s=13.0, power_w=9.5),  # under budget but inside the band: hold
        Conditions(time_s=14.0, power_w=8.0),  # under the band from here
        Conditions(time_s=15.0, power_w=8.0),  # ... only 1 s
        Conditions(time_s=16.0, power_w=8.0),  # 2 s under: one step down
        Conditions(time_s=17.0, power_w=8.0),
        Conditions(time_s=18.0, power_w=8.0),  # 2 s more: back to full
    ]
    assert drive(policy, script) == [
        "full",
        "shrink",
        "shrink",
        "off",
        "off",
        "off",
        "off",
        "shrink",
        "shrink",
        "full",
    ]
    assert policy.decisions[0].reason == "power 12.0 W over the 10.0 W budget"
    assert policy.decisions[-1].reason == "recovered (conditions back within budget)"


def test_power_near_the_budget_does_not_flap() -> None:
    policy = BudgetPolicy(BudgetConfig(power_w=10.0, hold_s=1.0))
    readings = [10.5, 9.9, 10.2, 9.6, 10.1, 9.0, 10.4] * 5
    script = [Conditions(time_s=t * 0.5, power_w=w) for t, w in enumerate(readings)]
    drive(policy, script)
    # It climbs (over budget repeatedly) and never comes back down inside the band.
    assert [d.mode for d in policy.decisions] == ["shrink", "off"]


def test_energy_per_token_budget() -> None:
    policy = BudgetPolicy(BudgetConfig(energy_per_token_j=0.5))
    policy.update(Conditions(time_s=0, energy_per_token_j=0.7), round=0)
    assert policy.mode == "shrink"
    assert "J/token over" in policy.decisions[0].reason


def test_memory_near_budget_stops_speculation_until_well_below() -> None:
    policy = BudgetPolicy(BudgetConfig(memory_mb=500.0, hysteresis=0.15))
    modes = drive(
        policy,
        [
            Conditions(time_s=0, rss_mb=300),
            Conditions(time_s=1, rss_mb=480),  # ≥ 95 %
            Conditions(time_s=2, rss_mb=440),  # below 95 % but above 85 %: stays off
            Conditions(time_s=3, rss_mb=420),
        ],
    )
    assert modes == ["full", "off", "off", "full"]
    assert policy.decisions[0].reason == "RSS 480 MB near the 500 MB budget"


def test_short_of_available_memory_without_a_budget() -> None:
    policy = BudgetPolicy(BudgetConfig(power_w=5.0))
    policy.update(Conditions(time_s=0, mem_available_mb=50), round=0)
    assert policy.mode == "off" and "MemAvailable" in policy.decisions[0].reason


def test_caps() -> None:
    policy = BudgetPolicy(BudgetConfig(power_w=1.0))
    assert policy.cap(6) == 6
    policy.update(Conditions(time_s=0, power_w=2.0), round=0)
    assert (policy.cap(6), policy.cap(1), policy.cap(0)) == (3, 1, 0)


class Scripted:
    def __init__(self, k: int) -> None:
        self.k, self.seen = k, 0

    def next_k(self) -> int:
        return self.k

    def observe(self, record: StepRecord) -> None:
        self.seen += 1


def record(tokens: int) -> StepRecord:
    return StepRecord(
        round=0,
        k=4,
        drafted=4,
        n_accepted=tokens - 1,
        committed=tuple(range(tokens)),
        draft_s=0.0,
        draft_steps=4,
        verify_s=0.0,
    )


def test_budgeted_k_reads_conditions_at_most_every_interval_and_caps_k() -> None:
    now = [0.0]
    reads: list[int] = []

    def conditions(tokens: int) -> Conditions:
        reads.append(tokens)
        return Conditions(time_s=now[0], plugged=now[0] >= 1.0)

    inner = Scripted(4)
    config = BudgetConfig(min_battery_pct=10, check_every_s=0.5)
    budgeted = BudgetedK(inner, BudgetPolicy(config), conditions=conditions, clock=lambda: now[0])
    ks = []
    for step in range(6):
        now[0] = step * 0.3
        ks.append(budgeted.next_k())
        budgeted.observe(record(3))
    assert reads == [0, 6, 12]  # at t = 0, 0.6, 1.2
    assert ks[0] == 2 and ks[-1] == 4  # shrunk on battery, full once plugged
    assert inner.seen == 6 and budgeted.tokens == 18
    assert budgeted.as_stats()["capped_rounds"] == 4


def test_budget_config_validation() -> None:
    with pytest.raises(ConfigError):
        BudgetConfig(power_w=0)
    with pytest.raises(ConfigError):
        BudgetConfig(min_battery_pct=120)
    assert not BudgetConfig().watches_anything


def test_watch_reads_conditions_from_the_probes(tmp_path) -> None:
    from edgespec.telemetry.sysfs import Tree
    from edgespec.telemetry.watch import Telemetry

    from support.fake_sysfs import orin_nx, write

    write(orin_nx(tmp_path), {"/proc/self/status": "VmRSS:\t102400 kB\nVmHWM:\t102400 kB"})
    telemetry = Telemetry(
        tree=Tree(tmp_path), budget=BudgetConfig(memory_mb=700.0), clock=lambda: 5.0
    )
    watch = telemetry.watch(Scripted(4))
    watch.start()
    assert isinstance(watch.k_policy, BudgetedK)
    seen = watch.conditions(10)
    assert seen.rss_mb == pytest.approx(100 + 512)  # RSS + NvMapMemUsed on Jetson
    assert seen.mem_available_mb == pytest.approx(11_000_000 / 1024)
    assert seen.plugged is None and seen.time_s == 5.0
    assert watch.k_policy.next_k() == 4  # 612 MB < 95 % of 700 MB
    stats = watch.stats(tokens=0)
    assert stats["budget"]["mode"] == "full" and stats["memory"]["nvmap_used_mb"] == 512.0
    assert stats["energy_source"]["name"] == "ina3221-hwmon"


def test_watch_without_a_budget_passes_the_k_policy_through(tmp_path) -> None:
    from edgespec.telemetry.sysfs import Tree
    from edgespec.telemetry.watch import Telemetry

    inner = Scripted(3)
    watch = Telemetry(tree=Tree(tmp_path), budget=BudgetConfig()).watch(inner)
    assert watch.k_policy is inner
    assert watch.stats(tokens=0)["budget"] is None
