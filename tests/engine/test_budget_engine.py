"""Budgets on an exported tiny pair: admission, energy stats, the budget policy between
rounds, the soak, and the CLI (probes read fake /proc and /sys trees where figures matter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.config import BudgetConfig
from edgespec.errors import BudgetError
from edgespec.manifest import load_bundle
from edgespec.measure.soak import run_soak
from edgespec.telemetry.estimate import MIB, estimate_pair

from support.fake_sysfs import battery, orin_nx, write

pytestmark = pytest.mark.integration

PROMPT = "def fibonacci(n):\n    if n"
FAKE_RSS_MB = 100


def fake_process(root: Path) -> Path:
    """A process of FAKE_RSS_MB resident, so that estimates do not depend on this test run."""
    kib = FAKE_RSS_MB * 1024
    return write(
        root,
        {
            "/proc/self/status": f"VmHWM:\t{kib} kB\nVmRSS:\t{kib} kB",
            "/proc/meminfo": "MemTotal: 8000000 kB\nMemAvailable: 6000000 kB",
        },
    )


def test_admission_refuses_shrinks_or_loads(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = pair
    root = fake_process(tmp_path)
    estimate = estimate_pair(load_bundle(target), load_bundle(draft), base_bytes=FAKE_RSS_MB * MIB)
    half = estimate.at(estimate.context // 2) / MIB
    with pytest.raises(BudgetError) as raised:
        Engine.load(target=target, draft=draft, memory_budget_mb=half, telemetry_root=root)
    message = str(raised.value)
    assert f"estimated {estimate.total_mb:.0f} MB" in message
    assert f"memory budget of {half:.0f} MB" in message
    longest = estimate.longest_context(int(half * MIB))
    assert f"a max context of {longest} tokens" in message
    shrunk = Engine.load(
        target=target,
        draft=draft,
        memory_budget_mb=half,
        shrink_context=True,
        telemetry_root=root,
    )
    assert shrunk.max_length == longest < estimate.context
    assert shrunk.target.max_length == longest and shrunk.draft is not None
    assert shrunk.generate(PROMPT, max_new_tokens=8).stats.memory["shrunk_from"] == (
        estimate.context
    )
    roomy = Engine.load(
        target=target, draft=draft, memory_budget_mb=estimate.total_mb + 1, telemetry_root=root
    )
    assert roomy.max_length == estimate.context


def test_stats_carry_energy_from_a_power_sensor(pair: tuple[Path, Path], tmp_path: Path) -> None:
    target, draft = pair
    root = fake_process(orin_nx(tmp_path))
    engine = Engine.load(target=target, draft=draft, telemetry_root=root)
    stats = engine.generate(PROMPT, max_new_tokens=24, k=3).stats
    source = stats.energy_source
    assert source["name"] == "ina3221-hwmon" and source["scope"] == "board input (VDD_IN)"
    assert stats.energy_j == pytest.approx(6.0 * source["window_s"])
    assert stats.energy_j_per_token == pytest.approx(stats.energy_j / stats.new_tokens)
    assert stats.cpu_s_per_token > 0
    assert stats.memory["rss_mb"] == FAKE_RSS_MB
    assert stats.budget is None


def test_stats_without_a_source_are_null_with_the_reason(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    target, draft = pair
    engine = Engine.load(target=target, draft=draft, telemetry_root=fake_process(tmp_path))
    stats = engine.generate(PROMPT, max_new_tokens=8).stats
    assert stats.energy_j is None and stats.energy_j_per_token is None
    assert stats.energy_source["name"] is None
    assert "rapl: unavailable: not present" in stats.energy_source["reason"]
    assert json.loads(json.dumps(stats.to_dict()))["cpu_s_per_token"] > 0


@pytest.mark.parametrize(("percent", "k_max", "mode"), [(90, 2, "shrink"), (10, 0, "off")])
def test_budget_policy_caps_k_between_rounds_and_stays_lossless(
    pair: tuple[Path, Path], tmp_path: Path, percent: int, k_max: int, mode: str
) -> None:
    target, draft = pair
    root = fake_process(battery(tmp_path, power_uw=9_000_000, capacity=percent))
    engine = Engine.load(
        target=target,
        draft=draft,
        telemetry_root=root,
        budget=BudgetConfig(min_battery_pct=20),
    )
    expected = engine.generate(PROMPT, drafter="none", max_new_tokens=32)
    result = engine.generate(PROMPT, k=4, max_new_tokens=32)
    assert result.tokens == expected.tokens
    # (the decoder itself drafts fewer near the token budget)
    assert max(result.stats.k_values) == k_max
    budget = result.stats.budget
    assert budget["mode"] == mode and budget["decisions"][0]["round"] == 0
    assert budget["decisions"][-1]["reason"] in ("on battery", "battery at 10% < 20%")
    assert result.stats.energy_source["name"] == "battery"


def test_soak_stays_under_budget_without_growth(pair: tuple[Path, Path]) -> None:
    target, draft = pair
    estimate_mb = Engine.load(target=target, draft=draft).telemetry.admission.estimate.total_mb
    engine = Engine.load(target=target, draft=draft, memory_budget_mb=estimate_mb * 1.5)
    prompts = [PROMPT, "import os\nimport sys\n\nclass ", "for i in range(10):\n    "]
    report = run_soak(engine, generations=40, max_new_tokens=16, prompts=prompts)
    assert report.under_budget, report.summary()
    assert report.steady, report.summary()
    assert len(report.rss_mb) == 40 and report.tokens > 0


def test_cli_budget_refusal_json_stats_and_doctor(
    pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    target, draft = pair
    common = ["--target", str(target), "--draft", str(draft)]
    assert main(["generate", PROMPT, *common, "--memory-budget-mb", "1"]) == 1
    assert "over the memory budget of 1 MB" in capsys.readouterr().err
    assert main(["generate", PROMPT, *common, "--max-new-tokens", "8", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)["stats"]
    for key in ("cpu_s_per_token", "energy_j", "energy_j_per_token", "energy_source"):
        assert key in stats
    assert main(["doctor", *common, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    cpu = next(p for p in report["providers"] if p["name"] == "CPUExecutionProvider")
    assert cpu["creates_session"] is True
    assert report["pair"]["estimate"]["total_mb"] > 0
    k = report["pair"]["k"]["k"]
    assert k == "auto" or 0 <= k <= 8  # a draft without a recommended k: auto
    assert main(["doctor", *common, "--no-measure"]) == 0
    assert "estimate" in capsys.readouterr().out


def test_bench_reports_energy_per_token_for_both_modes(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from edgespec.measure.bench import BenchSettings, run_bench

    target, draft = pair
    root = fake_process(orin_nx(tmp_path))
    engine = Engine.load(target=target, draft=draft, telemetry_root=root)
    results = run_bench(
        engine, ["def add(a, b):\n", "class Point:\n"], BenchSettings(max_new_tokens=8)
    )
    energy = results["energy"]
    assert energy["measured_by"] == "energy_j"
    assert energy["target_energy_j_per_token"] > 0 and energy["speculative_cpu_s_per_token"] > 0
    assert energy["cheaper_per_token"] == (energy["energy_j_ratio"] < 1.0)
    assert results["idle_power_w"] == pytest.approx(6.0)
    assert energy["target_energy_j_net_per_token"] == pytest.approx(0.0, abs=1e-9)
    assert results["energy_source"]["used"] == "ina3221-hwmon"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\n")
    common = ["--target", str(target), "--draft", str(draft), "--prompts", str(prompts)]
    assert main(["bench", *common, "--max-new-tokens", "8"]) == 0
    assert "per token target" in capsys.readouterr().out


@pytest.mark.parametrize(("percent", "remote_rounds"), [(90, False), (10, True)])
def test_low_battery_moves_verification_to_the_remote_target(
    pair: tuple[Path, Path], local: Engine, tmp_path: Path, percent: int, remote_rounds: bool
) -> None:
    """remote_when="budget": local rounds on battery above min_battery_pct; below it the budget
    mode is "remote" and rounds go to the server. The output is the same either way."""
    from edgespec.server.app import create_app
    from edgespec.server.options import ServerOptions

    from support.servers import FAKE_PROFILE, ThreadServer

    target, draft = pair
    root = fake_process(battery(tmp_path, power_uw=9_000_000, capacity=percent))
    app = create_app(local, options=ServerOptions(), profile=FAKE_PROFILE)
    with ThreadServer(app) as server:
        engine = Engine.load(
            target=target,
            draft=draft,
            telemetry_root=root,
            budget=BudgetConfig(min_battery_pct=20),
            remote=server.url,
            remote_when="budget",
        )
        expected = local.generate(PROMPT, k=4, max_new_tokens=32)
        result = engine.generate(PROMPT, k=4, max_new_tokens=32)
    assert result.tokens == expected.tokens and result.error is None
    assert result.stats.budget["mode"] == ("remote" if remote_rounds else "shrink")
    assert (result.stats.remote_rounds == result.stats.rounds) is remote_rounds
    assert (result.stats.remote["round_trips"] > 0) is remote_rounds
    assert result.stats.remote_down is None


def test_an_unreachable_remote_keeps_a_budgeted_generation_local(
    pair: tuple[Path, Path], local: Engine, tmp_path: Path
) -> None:
    from edgespec.runtime.remote.edgespec_server import ServerTarget
    from edgespec.server.app import create_app
    from edgespec.server.options import ServerOptions

    from support.servers import FAKE_PROFILE, ThreadServer

    target, draft = pair
    root = fake_process(battery(tmp_path, power_uw=9_000_000, capacity=10))
    with ThreadServer(create_app(local, options=ServerOptions(), profile=FAKE_PROFILE)) as server:
        remote = ServerTarget(server.url, retries=1, backoff_s=0.01)
        engine = Engine.load(
            target=target,
            draft=draft,
            telemetry_root=root,
            budget=BudgetConfig(min_battery_pct=20),
            remote=remote,
            remote_when="budget",
        )
    # The server has stopped: every remote attempt fails, and the rounds stay local.
    result = engine.generate(PROMPT, k=4, max_new_tokens=32)
    assert result.error is None
    assert result.tokens == local.generate(PROMPT, k=4, max_new_tokens=32).tokens
    assert result.stats.remote_rounds == 0 and "did not answer" in result.stats.remote_down
