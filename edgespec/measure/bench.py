"""The bench harness: target-only vs speculative decoding, measured in one process.

Runs alternate (target-only, speculative, target-only, ...) after a warm-up so that both see
the same machine state; ratios are computed from the summed tokens and decode times.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from edgespec.api import Engine, Result
from edgespec.errors import ConfigError
from edgespec.runtime.k_policy import expected_speedup

PROMPT_SETS_DIR = Path(__file__).resolve().parent.parent / "data" / "prompts"
PROMPT_SETS = ("code", "edit", "chat", "chat-edit")


@dataclass(frozen=True, kw_only=True)
class PromptSet:
    """Prompts, and whether they are chat messages (sent through the chat template)."""

    prompts: list[str]
    chat: bool = False


def load_prompt_set(source: str | Path = "code") -> PromptSet:
    """A named prompt set (``code``, ``edit``, ``chat``, ``chat-edit``: see
    ``tools/make_prompts.py``) or a file: a JSON list of strings or of ``{"prompt": ...,
    "chat": bool}`` objects, or one prompt per line with ``\\n`` for newlines."""
    path = PROMPT_SETS_DIR / f"{source}.json" if source in PROMPT_SETS else Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"cannot read prompts file {path} ({error.strerror})",
            fix=f"give a readable file or one of the sets {', '.join(PROMPT_SETS)}",
        ) from error
    chat = False
    if text.lstrip().startswith("["):
        items = json.loads(text)
        prompts = [item["prompt"] if isinstance(item, dict) else item for item in items]
        chat = bool(items) and all(isinstance(i, dict) and i.get("chat") is True for i in items)
    else:
        prompts = [line.replace("\\n", "\n") for line in text.splitlines() if line.strip()]
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError(f"{path} holds no prompts", fix="one prompt per line, or a JSON list")
    return PromptSet(prompts=prompts, chat=chat)


def load_prompts(source: str | Path = "code") -> list[str]:
    """The prompts of :func:`load_prompt_set`."""
    return load_prompt_set(source).prompts


@dataclass(frozen=True, kw_only=True)
class BenchSettings:
    max_new_tokens: int = 64
    k: int | str | None = None  # None: the engine's default_k
    drafter: str | None = None  # None: the engine's (model with a draft, else ngram)
    temperature: float = 0.7
    repeats: int = 1
    chat: bool = False  # prompts are user messages, sent through the chat template


def _totals(results: Sequence[Result]) -> tuple[int, float]:
    tokens = sum(r.stats.new_tokens for r in results)
    seconds = sum(r.stats.decode_ms for r in results) / 1e3
    return tokens, seconds


def _per_token(results: Sequence[Result], key: str) -> float | None:
    """Summed ``key`` (energy_j, energy_j_net, cpu_s) per committed token; None if any run
    lacks it."""
    values = [getattr(r.stats, key) for r in results]
    tokens = sum(r.stats.new_tokens for r in results)
    if not tokens or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / tokens


def _energy(baseline: Sequence[Result], speculative: Sequence[Result]) -> dict[str, Any]:
    """Is speculation cheaper per token, not only faster? Energy when a source measured it,
    CPU-seconds always."""
    figures: dict[str, Any] = {}
    for key in ("cpu_s", "energy_j", "energy_j_net"):
        target, spec = _per_token(baseline, key), _per_token(speculative, key)
        figures[f"target_{key}_per_token"] = target
        figures[f"speculative_{key}_per_token"] = spec
        figures[f"{key}_ratio"] = spec / target if target and spec is not None else None
    ratio = figures["energy_j_ratio"] or figures["cpu_s_ratio"]
    figures["cheaper_per_token"] = None if ratio is None else ratio < 1.0
    figures["measured_by"] = "energy_j" if figures["energy_j_ratio"] else "cpu_s"
    figures["too_short_windows"] = sum(
        bool(r.stats.energy_source.get("too_short")) for r in (*baseline, *speculative)
    )
    return figures


def _compare(
    engine: Engine,
    prompts: Sequence[str],
    settings: BenchSettings,
    sampling: dict[str, Any],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    baseline: list[Result] = []
    speculative: list[Result] = []
    mode = "greedy" if not sampling else f"sampling at T={sampling['temperature']:g}"
    for repeat in range(settings.repeats):
        for index, prompt in enumerate(prompts):
            common = dict(max_new_tokens=settings.max_new_tokens, chat=settings.chat, **sampling)
            baseline.append(engine.generate(prompt, drafter="none", **common))
            speculative.append(
                engine.generate(prompt, drafter=settings.drafter, k=settings.k, **common)
            )
            passes = f", pass {repeat + 1}/{settings.repeats}" if settings.repeats > 1 else ""
            progress(f"{mode}: prompt {index + 1}/{len(prompts)}{passes}")
    base_tokens, base_s = _totals(baseline)
    spec_tokens, spec_s = _totals(speculative)
    tested = sum(r.stats.tested for r in speculative)
    accepted = sum(r.stats.accepted for r in speculative)
    rounds = sum(r.stats.rounds for r in speculative)
    overhead_ms = sum(r.stats.overhead_ms for r in speculative)
    # Costs as the loop really paid them (a draft step right after a target pass runs with
    # cold caches, so it costs more than in isolation): one target step from the baseline,
    # one draft step and one verify pass from the speculative runs.
    target_step_ms = sum(r.stats.verify_ms for r in baseline) / sum(
        r.stats.rounds for r in baseline
    )
    draft_steps = sum(r.stats.draft_steps for r in speculative)
    draft_step_ms = sum(r.stats.draft_ms for r in speculative) / draft_steps if draft_steps else 0.0
    model_ms = sum(r.stats.draft_ms + r.stats.verify_ms for r in speculative)
    return {
        "target_tokens_per_s": base_tokens / base_s,
        "speculative_tokens_per_s": spec_tokens / spec_s,
        "speedup": (spec_tokens / spec_s) / (base_tokens / base_s),
        # Per-token acceptance: accepted / tested (accepted / drafted is biased low for k > 1).
        "alpha": accepted / tested if tested else None,
        "mean_accepted": spec_tokens / rounds if rounds else None,
        "overhead_ms_per_round": overhead_ms / rounds if rounds else None,
        "target_step_ms": target_step_ms,
        "draft_step_ms": draft_step_ms,
        "verify_round_ms": sum(r.stats.verify_ms for r in speculative) / rounds,
        "loop_efficiency": model_ms / (model_ms + overhead_ms) if model_ms else None,
        "identical_output": all(
            b.tokens == s.tokens for b, s in zip(baseline, speculative, strict=True)
        ),
        "new_tokens": spec_tokens,
        "energy": _energy(baseline, speculative),
        **_traffic(baseline, speculative),
    }


def _traffic(baseline: Sequence[Result], speculative: Sequence[Result]) -> dict[str, Any]:
    """Round trips and bytes per committed token of remote runs (nothing for local ones)."""
    if speculative[0].stats.remote is None:
        return {}
    found: dict[str, Any] = {}
    for name, results in (("target", baseline), ("speculative", speculative)):
        tokens = sum(r.stats.new_tokens for r in results) or 1
        remote = [r.stats.remote or {} for r in results]
        found[f"{name}_round_trips_per_token"] = sum(t["round_trips"] for t in remote) / tokens
        found[f"{name}_bytes_per_token"] = (
            sum(t["bytes_sent"] + t["bytes_received"] for t in remote) / tokens
        )
        shares = [t["rtt_share"] for t in remote if t["rtt_share"] is not None]
        found[f"{name}_rtt_share"] = sum(shares) / len(shares) if shares else None
    return found


def _theoretical_speedup(
    greedy: dict[str, Any], *, c: float, verify_cost: list[float], k: int | str | None
) -> float | None:
    """Leviathan's speedup with the measured alpha, c and verify pass cost at this k (None for
    auto k, or when nothing was drafted)."""
    if not isinstance(k, int) or greedy["alpha"] is None:
        return None
    in_loop_cost = verify_cost.copy()
    in_loop_cost[k] = greedy["verify_round_ms"] / greedy["target_step_ms"]
    return expected_speedup(greedy["alpha"], c, in_loop_cost, k)


def run_bench(
    engine: Engine,
    prompts: Sequence[str],
    settings: BenchSettings = BenchSettings(),
    *,
    progress: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Greedy and sampled (T = ``settings.temperature``) comparisons plus the cost profile."""
    progress("idle power baseline (when an energy source exists)")
    idle_w = engine.telemetry.measure_idle(seconds=2.0)
    if settings.k is None:
        settings = replace(settings, k=engine.default_k)
    if settings.drafter is None:
        settings = replace(settings, drafter=engine.default_drafter)
    progress("warm-up and cost profile")
    engine.generate(prompts[0], drafter="none", max_new_tokens=8, chat=settings.chat)
    engine.generate(prompts[0], drafter=settings.drafter, k=1, max_new_tokens=8, chat=settings.chat)
    profile = engine.cost_profile()
    greedy = _compare(engine, prompts, settings, {}, progress)
    # An OpenAI-compatible engine verifies greedy drafts only: no sampled comparison there.
    sampling = {"temperature": settings.temperature, "seed": 0}
    sampled = (
        None if engine.greedy_only else _compare(engine, prompts, settings, sampling, progress)
    )
    verify_cost = list(profile.verify_cost)
    # Remote runs compare against remote per-token decoding: the local build ratio does not apply.
    selection = engine.build_record.get("selection", {}) if engine.remote is None else {}
    c = greedy["draft_step_ms"] / greedy["target_step_ms"]
    theoretical = _theoretical_speedup(greedy, c=c, verify_cost=verify_cost, k=settings.k)
    return {
        "greedy": greedy,
        "sampling": sampled,
        "tokens_per_s": {
            "target": greedy["target_tokens_per_s"],
            "speculative": greedy["speculative_tokens_per_s"],
        },
        "speedup": greedy["speedup"],
        "alpha": greedy["alpha"],
        "mean_accepted": greedy["mean_accepted"],
        "c": c,
        "c_isolated": profile.c,
        "verify_cost": verify_cost,
        "theoretical_speedup": theoretical,
        "efficiency": greedy["speedup"] / theoretical if theoretical else None,
        # The build measured the shipped target's target-only speed against the fastest
        # target-only quantization of the same weights in one process; scaling by that ratio
        # compares speculation with the best plain decoding a user could pick instead.
        "best_target_only": selection.get("best_target_only"),
        "speedup_vs_best_target_only": (
            greedy["speedup"] * selection["shipped_vs_best_target_only"]
            if "shipped_vs_best_target_only" in selection
            else None
        ),
        "settings": {**dataclasses.asdict(settings), "prompts": len(prompts)},
        "providers": engine.providers,
        "energy": greedy["energy"],
        "idle_power_w": idle_w,
        "energy_source": engine.telemetry.discovery.as_dict(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
