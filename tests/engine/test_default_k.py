"""Where a generation's k comes from: one decision (``engine.drafting``) over the device's
stored choice and its costs, the bundles' records and edgespec's defaults, reported the same
way by the API, ``edgespec doctor`` and ``edgespec pair``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.cli import main
from edgespec.engine import planning
from edgespec.engine.device_choice import DeviceChoice, load_choice
from edgespec.graph import kernels
from edgespec.runtime.k_policy import CostProfile


def test_a_stored_choice_without_usable_costs_keeps_its_fixed_k() -> None:
    """A choice stored before costs were kept, or with costs that make no sense, gives no
    profile: generation then drafts at the stored k instead of guessing costs."""
    measured = {"model": {"alpha": 0.8, "recommended_k": 3, "expected_speedup": 1.2}}
    choice = DeviceChoice(drafter="model", k=3, expected_speedup=1.2, measured=measured)
    assert choice.cost_profile() is None and choice.alpha == 0.8
    for costs in (
        {"target_step_s": "fast", "draft_step_s": 0.01, "verify_cost": [1.0, 1.2]},
        {"target_step_s": 0.0, "draft_step_s": 0.01, "verify_cost": [1.0, 1.2]},
        {"target_step_s": 0.05, "draft_step_s": 0.01, "verify_cost": [1.0]},
    ):
        assert dataclasses.replace(choice, costs=costs).cost_profile() is None
    good = {"target_step_s": 0.05, "draft_step_s": 0.01, "verify_cost": [1.0, 1.2, 1.4]}
    assert dataclasses.replace(choice, costs=good).cost_profile() == CostProfile(
        target_step_s=0.05, draft_step_s=0.01, verify_cost=(1.0, 1.2, 1.4)
    )


def test_the_pair_costs_are_measured_once_per_device_and_setting_then_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A first generation measures the pair's costs and keeps them in the cache: another
    engine on this device (another process, as the cache sees it) reads them instead of
    timing 45 passes again; other threads, or another build of the GGUF kernels, are another
    setting; a damaged file is measured again, never trusted."""
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))
    engine = Engine.load()
    engine.generate("def add(a, b):", drafter="combined", max_new_tokens=4)
    kept = sorted((tmp_path / "profiles").glob("*-costs2-*.json"))
    assert len(kept) == 1
    measured = engine.cost_profile()
    assert measured.target_step_s > 0 and measured.verify_cost[0] == 1.0

    def no_timing(*args: object, **kwargs: object) -> CostProfile:
        raise AssertionError("the kept costs should have been read")

    with monkeypatch.context() as patch:
        patch.setattr(planning, "measure_costs", no_timing)
        again = Engine.load()
        assert again.cost_profile() == measured
        again.generate("def add(a, b):", drafter="combined", max_new_tokens=4)
        with pytest.raises(AssertionError, match="kept costs"):
            Engine.load(threads=1).cost_profile()
        patch.setattr(kernels, "gguf_kernel_build", lambda: "another build")  # an upgrade
        with pytest.raises(AssertionError, match="kept costs"):
            Engine.load().cost_profile()
    kept[0].write_text("{damaged", encoding="utf-8")
    remeasured = Engine.load().cost_profile()
    assert remeasured.target_step_s > 0
    rewritten = json.loads(kept[0].read_text(encoding="utf-8"))
    assert rewritten["target_step_s"] == remeasured.target_step_s


def test_one_source_of_k(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("EDGESPEC_CACHE", str(tmp_path))  # where the measured choice is kept
    engine = Engine.load()
    assert main(["doctor", "--json"]) == 0
    k = json.loads(capsys.readouterr().out)["pair"]["k"]
    assert (k["k"], k["source"]) == (engine.default_k, engine.default_k_source)
    assert "pair's build record" in k["source"]
    assert main(["pair", "--profile", "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)["profile"]
    assert set(profile["by_drafter"]) == {"model", "combined", "ngram"}
    by_drafter = profile["by_drafter"]
    best = max(by_drafter, key=lambda name: by_drafter[name]["expected_speedup"])
    # Drafters expected alike were raced: the fastest of the race is the choice ("none":
    # target-only decoding won); else the best expectation, or none where nothing pays.
    race = profile["race_tok_s"]
    paying = by_drafter[best]["expected_speedup"] > 1.0
    chosen = max(race, key=lambda name: race[name]) if race else best if paying else "none"
    assert profile["drafter"] == chosen
    figures = by_drafter.get(chosen, by_drafter[best])
    assert profile["expected_speedup"] == max(figures["expected_speedup"], 1.0)
    # The choice measured here is what generation now uses without flags, and doctor says so:
    # its drafter, with k chosen round by round from the costs it measured (so a prompt whose
    # drafts stop paying falls back to plain steps), or no drafting where none paid.
    measured = Engine.load()
    drafting = profile["drafter"] != "none"
    assert (measured.default_drafter, measured.default_k) == (
        profile["drafter"],
        "auto" if drafting else 0,
    )
    assert "measured on this device by 'edgespec pair --profile'" in measured.default_k_source
    stored = load_choice(measured.target.bundle, measured.draft.bundle)  # type: ignore[union-attr]
    assert stored is not None and stored.k == profile["recommended_k"]
    costs = stored.cost_profile()
    assert costs is not None and costs.target_step_s > 0 and costs.verify_cost[0] == 1.0
    if drafting:
        assert stored.alpha == pytest.approx(profile["by_drafter"][stored.drafter]["alpha"])
    assert main(["doctor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pair"]["k"]["source"] == measured.default_k_source
    assert main(["pair", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "choice: " in out and "measured on 12 built-in prompts (code, chat-edit, chat)" in out
    assert "now use it by default on this device" in out
