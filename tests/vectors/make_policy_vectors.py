"""Writes ``policy_v1.json``: k-policy and budget-policy scenarios, computed by the Python
implementations, that the JVM port (android_bridge) must reproduce step for step.

Run from the repository root with the package installed:
``python tests/vectors/make_policy_vectors.py``.
``tests/unit/test_policy_vectors.py`` replays the file against the Python code, so the vectors and
the Python side cannot drift either.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from edgespec.config import BudgetConfig
from edgespec.events import StepRecord
from edgespec.runtime.k_policy import AutoK, CostProfile, expected_tokens
from edgespec.telemetry.budget import BudgetPolicy, Conditions

OUT = Path(__file__).with_name("policy_v1.json")
#: (target_step_s, verify_cost) of a made-up server, and round trips from loopback to cellular
SERVER = {"target_step_s": 0.004, "verify_cost": [1.0 + 0.12 * w for w in range(9)]}
RTTS = (0.0, 0.005, 0.05, 0.3)


def remote_profile(rtt_s: float, draft_step_s: float) -> CostProfile:
    """The formula of ``edgespec.engine.remote.remote_profile`` (replayed against it in the
    test)."""
    step = rtt_s + SERVER["target_step_s"]
    costs = tuple((rtt_s + SERVER["target_step_s"] * c) / step for c in SERVER["verify_cost"])
    return CostProfile(target_step_s=step, draft_step_s=draft_step_s, verify_cost=costs)


def auto_k_scenario(name: str, profile: CostProfile, accept: list[int]) -> dict[str, Any]:
    """Rounds where the draft is right for ``accept[i % len]`` tokens; round times follow
    the profile's cost model with a 10 % overhead."""
    policy = AutoK(profile, k_max=8)
    steps: list[dict[str, Any]] = []
    for index in range(40):
        k = policy.next_k()
        steps.append({"next_k": k})
        n_accepted = min(k, accept[index % len(accept)])
        record = {
            "drafted": k,
            "n_accepted": n_accepted,
            "draft_s": k * profile.draft_step_s * 1.1,
            "verify_s": profile.verify_cost[k] * profile.target_step_s * 1.1,
        }
        policy.observe(
            StepRecord(round=index, k=k, committed=(0,) * (n_accepted + 1), draft_steps=k, **record)
        )
        steps.append({"observe": record, "alpha": policy.alpha})
    return {
        "name": name,
        "profile": asdict(profile),
        "k_max": 8,
        "alpha": 0.6,
        "smoothing": 0.2,
        "probe_every": 16,
        "steps": steps,
    }


def seen(time_s: float, **values: Any) -> dict[str, Any]:
    return {"time_s": time_s, **values}


BUDGET_SCENARIOS: list[tuple[str, dict[str, Any], bool, list[dict[str, Any]]]] = [
    (
        "battery: unplugged, low, margin, recovered, plugged in",
        {"min_battery_pct": 20.0},
        False,
        [
            seen(0.0, plugged=True, battery_pct=60.0),
            seen(1.0, plugged=False, battery_pct=60.0),
            seen(2.0, plugged=False, battery_pct=19.0),
            seen(3.0, plugged=False, battery_pct=22.0),
            seen(4.0, plugged=False, battery_pct=26.0),
            seen(5.0, plugged=True, battery_pct=26.0),
        ],
    ),
    (
        "battery low with a remote target: remote mode keeps k",
        {"min_battery_pct": 30.0},
        True,
        [
            seen(0.0, plugged=False, battery_pct=25.0),
            seen(1.0, plugged=True, battery_pct=25.0),
        ],
    ),
    (
        "power: step up twice over the budget, down after the hold",
        {"power_w": 2.0, "hold_s": 2.0, "hysteresis": 0.15},
        False,
        [
            seen(0.0, power_w=1.0),
            seen(1.0, power_w=2.6),
            seen(2.0, power_w=2.6),
            seen(3.2, power_w=2.4),
            seen(4.0, power_w=1.9),
            seen(5.0, power_w=1.2),
            seen(6.0, power_w=1.2),
            seen(7.5, power_w=1.2),
            seen(9.0, power_w=1.2),
            seen(10.0, power_w=1.2),
            seen(11.6, power_w=1.2),
        ],
    ),
    (
        "energy per token over its budget",
        {"energy_per_token_j": 0.5, "hold_s": 1.0},
        False,
        [
            seen(0.0, energy_per_token_j=0.2),
            seen(1.0, energy_per_token_j=0.7),
            seen(1.5, energy_per_token_j=0.7),
            seen(3.0, energy_per_token_j=0.3),
            seen(4.5, energy_per_token_j=0.3),
        ],
    ),
    (
        "memory: RSS near the budget, hysteresis, MemAvailable low",
        {"memory_mb": 1000.0, "hysteresis": 0.15},
        False,
        [
            seen(0.0, rss_mb=800.0),
            seen(1.0, rss_mb=960.0),
            seen(2.0, rss_mb=900.0),
            seen(3.0, rss_mb=840.0),
            seen(4.0, rss_mb=840.0, mem_available_mb=80.0),
            seen(5.0, rss_mb=840.0, mem_available_mb=300.0),
        ],
    ),
]


def budget_scenario(
    name: str, config: dict[str, Any], remote: bool, readings: list[dict[str, Any]]
) -> dict[str, Any]:
    policy = BudgetPolicy(BudgetConfig(**config), remote_available=remote)
    steps = []
    for round_index, reading in enumerate(readings):
        decision = policy.update(Conditions(**reading), round=round_index)
        steps.append(
            {
                "conditions": reading,
                "round": round_index,
                "decision": None if decision is None else decision.reason,
                "mode": policy.mode,
                "cap": [[k, policy.cap(k)] for k in (0, 1, 2, 5, 8)],
            }
        )
    return {
        "name": name,
        "config": asdict(BudgetConfig(**config)),
        "remote_available": remote,
        "steps": steps,
    }


def vectors() -> dict[str, Any]:
    profiles = [remote_profile(rtt, 0.0015) for rtt in RTTS]
    return {
        "version": 1,
        "expected_tokens": [
            {"alpha": alpha, "k": k, "expected": expected_tokens(alpha, k)}
            for alpha in (0.0, 0.3, 0.75, 1.0)
            for k in (0, 1, 4, 8)
        ],
        "remote_profile": [
            {
                "info": SERVER,
                "rtt_s": rtt,
                "draft_step_s": 0.0015,
                "expected": asdict(profile),
            }
            for rtt, profile in zip(RTTS, profiles, strict=True)
        ],
        "auto_k": [
            auto_k_scenario(f"rtt {rtt * 1e3:g} ms, draft right for {accept}", profile, accept)
            for rtt, profile in zip(RTTS, profiles, strict=True)
            for accept in ([8, 6, 8, 7], [1, 0, 2, 0, 0])
        ]
        + [
            auto_k_scenario(
                "local: cheap draft, the draft stops being right (k falls to 0, then probes)",
                CostProfile(target_step_s=0.004, draft_step_s=0.002, verify_cost=(1.0,) * 9),
                [5, 5, 5, 5, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0] + [0] * 20,
            )
        ],
        "budget": [budget_scenario(*scenario) for scenario in BUDGET_SCENARIOS],
    }


if __name__ == "__main__":
    OUT.write_text(json.dumps(vectors(), indent=1) + "\n")
    print(f"wrote {OUT}")
