"""tests/vectors/policy_v1.json replayed against the Python policies (the JVM port in
android_bridge replays the same file), so neither side can drift from the vectors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgespec.engine.remote import remote_profile
from edgespec.events import StepRecord
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.k_policy import AutoK, CostProfile, expected_tokens

VECTORS = json.loads((Path(__file__).parents[1] / "vectors" / "policy_v1.json").read_text())


def test_expected_tokens() -> None:
    for case in VECTORS["expected_tokens"]:
        assert expected_tokens(case["alpha"], case["k"]) == pytest.approx(case["expected"])


@pytest.mark.parametrize("case", VECTORS["remote_profile"], ids=lambda c: f"rtt {c['rtt_s']}")
def test_remote_profile(case: dict[str, Any]) -> None:
    info = ServerInfo(
        vocab_size=8,
        max_length=64,
        eos_token_ids=(),
        tokenizer_sha256="",
        max_k=8,
        target_step_s=case["info"]["target_step_s"],
        verify_cost=tuple(case["info"]["verify_cost"]),
    )
    got = remote_profile(info, rtt_s=case["rtt_s"], draft_step_s=case["draft_step_s"])
    expected = case["expected"]
    assert got.target_step_s == pytest.approx(expected["target_step_s"], abs=1e-15)
    assert got.draft_step_s == expected["draft_step_s"]
    assert got.verify_cost == pytest.approx(expected["verify_cost"], abs=1e-12)


def test_longer_round_trips_make_longer_drafts_pay() -> None:
    first_k = [s["steps"][0]["next_k"] for s in VECTORS["auto_k"] if "[8, 6, 8, 7]" in s["name"]]
    assert first_k == sorted(first_k) and first_k[0] < first_k[-1]


@pytest.mark.parametrize("scenario", VECTORS["auto_k"], ids=lambda s: s["name"])
def test_auto_k_scenarios(scenario: dict[str, Any]) -> None:
    profile = scenario["profile"]
    policy = AutoK(
        CostProfile(
            target_step_s=profile["target_step_s"],
            draft_step_s=profile["draft_step_s"],
            verify_cost=tuple(profile["verify_cost"]),
        ),
        k_max=scenario["k_max"],
        alpha=scenario["alpha"],
        smoothing=scenario["smoothing"],
        probe_every=scenario["probe_every"],
    )
    for index, step in enumerate(scenario["steps"]):
        if "next_k" in step:
            assert policy.next_k() == step["next_k"], index
            continue
        record = step["observe"]
        policy.observe(
            StepRecord(
                round=index // 2,
                k=record["drafted"],
                committed=(0,) * (record["n_accepted"] + 1),
                draft_steps=record["drafted"],
                **record,
            )
        )
        assert policy.alpha == pytest.approx(step["alpha"], abs=1e-12), index


@pytest.mark.parametrize("scenario", VECTORS["budget"], ids=lambda s: s["name"])
def test_budget_scenarios(scenario: dict[str, Any]) -> None:
    budget = pytest.importorskip(
        "edgespec.telemetry.budget", reason="the budget policy lands with issue 6 (telemetry)"
    )
    from edgespec.config import BudgetConfig  # type: ignore[attr-defined,unused-ignore]

    policy = budget.BudgetPolicy(
        BudgetConfig(**scenario["config"]), remote_available=scenario["remote_available"]
    )
    for step in scenario["steps"]:
        decision = policy.update(budget.Conditions(**step["conditions"]), round=step["round"])
        assert (decision.reason if decision else None) == step["decision"], step
        assert policy.mode == step["mode"]
        assert [[k, policy.cap(k)] for k, _ in step["cap"]] == step["cap"]
