"""Measuring a pair on this device: alpha by draft position, c, and the k they recommend.

The one source of measured k recommendations (``edgespec pair --profile`` and ``edgespec
doctor`` both report it); without one, generation uses the pair's recommended k from its build
record, else ``DEFAULT_K``.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.engine.device_choice import DeviceChoice, save_choice
from edgespec.engine.options import MAX_K
from edgespec.measure.bench import load_prompt_set
from edgespec.runtime.k_policy import CostProfile

PROFILE_PROMPTS = 12  # prompts the profile drafts on (k = MAX_K)
#: A pair with a draft model is profiled on code completions, chat edit requests and chat
#: questions in turn (4 of each): a choice raced on code alone can draft at a loss on chat
#: (measured: docs/runtime.md, "Choosing k"). A draft-free engine (prompt lookup only) is
#: profiled on chat, and a target without a chat template on code alone.
PROFILE_SETS = ("code", "chat-edit", "chat")
PROFILE_NEW_TOKENS = 64  # tokens generated per prompt (fewer when the context is short)
#: Drafters expected within this factor of the best are raced before one is chosen (and
#: target-only decoding with them while the best is): an expectation replays rounds run at
#: k = MAX_K and leaves out what a round costs besides its passes, so close expectations
#: can come out in either order (docs/runtime.md, "Choosing k").
RACE_WITHIN = 1.10
RACE_PROMPTS = 6  # the first profile prompts (2 of each set), each decoded by every contender


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def profile_pair(
    draft: Path | None,
    target: Path,
    *,
    save: bool = True,
    notify: Callable[[str], None] = _to_stderr,
    head: Path | None = None,
) -> dict[str, Any]:
    """Greedy speculation at k = MAX_K over the bench prompts with each drafter the pair can
    use (model, combined and prompt lookup with a draft; head, combined over it and prompt
    lookup with a head, and the model too when a draft is named beside it; prompt lookup
    alone without either): alpha by
    position, and the k with the best expected speedup given the measured verify curve and
    draft cost. The drafter and k with the best expected speedup are the pair's choice on this
    device; ``save`` keeps it, so that generation uses it without flags. ``notify`` gets a
    line per step (minutes for a real-size pair)."""
    started = time.perf_counter()
    loads: dict[str, Any] = {
        "target": target,
        "draft": draft,
        "head": head,
        "measure_energy": False,
    }
    if head is not None and draft is None:
        loads["drafter"] = "head"  # the head alone: no draft model beside it
    engine = Engine.load(**loads)
    names: tuple[str, ...] = PROFILE_SETS if draft is not None else ("chat",)
    if engine.chat_template is None:  # a target that formats no chats: completions only
        names = ("code",)
    sets = [load_prompt_set(name) for name in names]
    each = PROFILE_PROMPTS // len(sets)
    # In turn (code, chat edit, chat, code, ...), so that the race's first prompts hold each.
    prompts = [
        (prompt_set.prompts[index], prompt_set.chat) for index in range(each) for prompt_set in sets
    ]
    new_tokens = min(PROFILE_NEW_TOKENS, engine.max_length // 2)
    # Prompts keep their last tokens where the pair's context is short (a small export).
    room = engine.max_length - new_tokens
    encoded = [engine.encode(text, chat=chat)[-room:] for text, chat in prompts]
    notify("profile: the verify curve T(k)/T(1) and the draft's step cost ...")
    profile = engine.cost_profile()
    verify_cost = list(profile.verify_cost)
    drafters: tuple[str, ...] = ("model", "combined", "ngram") if draft is not None else ("ngram",)
    if head is not None:  # a head races its own drafters (the combined one drafts with it)
        drafters = ("head", "combined", "ngram") + (("model",) if draft is not None else ())
    measured = {}
    for drafter in drafters:
        results = []
        for index, ids in enumerate(encoded, 1):
            results.append(
                engine.generate(ids, k=MAX_K, drafter=drafter, max_new_tokens=new_tokens)
            )
            seconds = time.perf_counter() - started
            notify(f"profile: {drafter} drafter, prompt {index}/{len(encoded)} ({seconds:.0f} s)")
        # Prompt lookup drafts from a table: its draft step costs nothing next to a target's.
        c = 0.0 if drafter == "ngram" else draft_step_cost(results, profile)
        measured[drafter] = {**_acceptance(results, c=c, verify_cost=verify_cost), "c": c}
    expected_best = max(measured, key=lambda name: measured[name]["expected_speedup"])
    raced = contenders(measured)
    race = (
        _race(engine, encoded[:RACE_PROMPTS], raced, new_tokens, notify) if len(raced) > 1 else {}
    )
    best = max(race, key=lambda name: race[name]) if race else next(iter(raced))
    choice = measured[best if best in measured else expected_best]
    # Below 1.0 no drafter pays on this device: decoding target-only is the choice.
    drafter, k = (
        (best, int(choice["recommended_k"]))
        if best != "none" and choice["expected_speedup"] > 1.0
        else ("none", 0)
    )
    found = {
        **choice,
        "drafter": drafter,
        "recommended_k": k,
        "race_tok_s": race,
        "expected_speedup": max(choice["expected_speedup"], 1.0),
        "c": profile.c,
        "verify_cost": verify_cost,
        "by_drafter": {
            name: {key: m[key] for key in ("alpha", "c", "recommended_k", "expected_speedup")}
            for name, m in measured.items()
        },
        "measured_on": f"{len(prompts)} built-in prompts ({', '.join(names)}), "
        f"{new_tokens} tokens each, here",
    }
    if save and engine.target is not None:
        saved = save_choice(
            DeviceChoice(
                drafter=drafter,
                k=k,
                expected_speedup=found["expected_speedup"],
                measured=found["by_drafter"],
                costs={
                    "target_step_s": profile.target_step_s,
                    "draft_step_s": measured[drafter]["c"] * profile.target_step_s
                    if drafter in measured
                    else 0.0,
                    "verify_cost": verify_cost,
                },
            ),
            engine.target.bundle,
            _beside(engine),
        )
        found["saved_to"] = str(saved)
    reloaded = Engine.load(**loads)
    found["default_k"], found["default_k_source"] = reloaded.default_k, reloaded.default_k_source
    found["default_drafter"] = reloaded.default_drafter
    return found


def _beside(engine: Engine) -> Any:
    """The bundle that drafts beside the target, which keys the stored choice: its head when
    one is loaded, else its draft (None: prompt lookup alone)."""
    model = engine.pair.head or engine.draft
    return model.bundle if model is not None else None


def contenders(measured: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Drafter → k of the configurations worth racing: every drafter expected above 1.0x and
    within :data:`RACE_WITHIN` of the best, and target-only decoding ("none", k 0) while the
    best is within it of 1.0x. The best comes first."""
    ranked = sorted(measured, key=lambda name: -measured[name]["expected_speedup"])
    top = measured[ranked[0]]["expected_speedup"] if ranked else 1.0
    chosen = {
        name: int(measured[name]["recommended_k"])
        for name in ranked
        if measured[name]["expected_speedup"] > 1.0
        and measured[name]["expected_speedup"] * RACE_WITHIN >= top
    }
    if top < RACE_WITHIN:
        chosen["none"] = 0
    return chosen


def _race(
    engine: Engine,
    encoded: list[list[int]],
    raced: dict[str, int],
    new_tokens: int,
    notify: Callable[[str], None],
) -> dict[str, float]:
    """Decode tok/s of each drafter at its k over the same prompts, the drafters taking
    turns on every prompt (so that a slow stretch of the machine slows them alike)."""
    tokens = dict.fromkeys(raced, 0)
    seconds = dict.fromkeys(raced, 0.0)
    for index, ids in enumerate(encoded, 1):
        for name, k in raced.items():
            result = engine.generate(ids, drafter=name, k=k, max_new_tokens=new_tokens)
            tokens[name] += result.stats.new_tokens
            seconds[name] += result.stats.decode_ms / 1e3
        notify(f"profile: race of {', '.join(raced)}, prompt {index}/{len(encoded)}")
    return {name: tokens[name] / seconds[name] for name in raced if seconds[name] > 0}


def _acceptance(results: list[Any], *, c: float, verify_cost: list[float]) -> dict[str, Any]:
    """alpha overall and by draft position, and each k's expected speedup, from the rounds
    these generations ran at k = MAX_K, replayed as if drafts stopped at k."""
    tested = sum(r.stats.tested for r in results)
    alpha = sum(r.stats.accepted for r in results) / tested if tested else 0.0
    rounds: Counter[tuple[int, int, int]] = Counter()
    for result in results:
        for key, count in result.stats.round_outcomes.items():
            drafted, accepted, steps = (int(part) for part in key.split(","))
            rounds[drafted, accepted, steps] += count
    speedups = [
        replayed_speedup(rounds, c=c, verify_cost=verify_cost, k=k) for k in range(MAX_K + 1)
    ]
    best = max(range(MAX_K + 1), key=lambda k: speedups[k])
    return {
        "alpha": alpha,
        "alpha_by_position": alpha_by_position(rounds),
        "recommended_k": best,
        "expected_speedup": speedups[best],
        "expected_speedup_by_k": speedups,
    }


def draft_step_cost(results: list[Any], profile: CostProfile) -> float:
    """c as generation paid it: the drafter's time per draft model step in these runs (its
    forward pass plus what a bare pass leaves out: feeding the target's token back, picking
    from the logits), over a target step; the bare pass's c where no step ran."""
    steps = sum(r.stats.draft_steps for r in results)
    if not steps or profile.target_step_s <= 0:
        return profile.c
    return sum(r.stats.draft_ms for r in results) / 1e3 / steps / profile.target_step_s


def alpha_by_position(rounds: Counter[tuple[int, int, int]]) -> list[float]:
    """Position i's acceptance given the draft reached it and position i - 1 was accepted:
    over rounds that drafted more than i tokens, accepted past i / accepted past i - 1."""
    longest = max((drafted for drafted, _, _ in rounds), default=0)
    by_position = []
    for i in range(longest):
        reached = sum(n for (d, a, _), n in rounds.items() if d > i and a >= i)
        kept = sum(n for (d, a, _), n in rounds.items() if d > i and a > i)
        by_position.append(kept / reached if reached else 0.0)
    return by_position


def replayed_speedup(
    rounds: Counter[tuple[int, int, int]], *, c: float, verify_cost: list[float], k: int
) -> float:
    """Tokens per target step, had each round's draft stopped at k tokens: a round that
    drafted d in s draft passes and had a accepted yields min(a, k) + 1 tokens for
    min(s, k) draft steps (a model drafting step by step runs d; along a lookup match, one;
    prompt lookup, none) and a verify pass over min(d, k) + 1 positions. Rounds that drafted
    nothing (no lookup match) count as one target step for one token, which an estimate from
    alpha alone leaves out. (At a smaller k the text would fall into rounds differently: a
    replay, not a rerun.)"""
    tokens = cost = 0.0
    for (drafted, accepted, steps), n in rounds.items():
        width = min(drafted, k)
        tokens += n * (min(accepted, width) + 1)
        cost += n * (min(steps, width) * c + verify_cost[width])
    return tokens / cost if cost else 1.0
