"""Measuring a pair on this device: alpha by draft position, c, and the k they recommend.

The one source of measured k recommendations (``edgespec pair --profile`` and ``edgespec
doctor`` both report it); without one, generation uses the pair's recommended k from its build
record, else ``DEFAULT_K``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.engine.options import MAX_K
from edgespec.measure.bench import load_prompt_set
from edgespec.runtime.k_policy import expected_speedup

PROFILE_PROMPTS = 12  # code prompts the profile drafts on (k = MAX_K)
PROFILE_NEW_TOKENS = 64  # tokens generated per prompt (fewer when the context is short)


def profile_pair(draft: Path | None, target: Path) -> dict[str, Any]:
    """Greedy speculation at k = MAX_K over the bench prompts: alpha by position, c, and the
    k with the best expected speedup (and that speedup). Without a draft, the prompt-lookup
    drafter on the chat prompts (through the target's chat template)."""
    engine = Engine.load(target=target, draft=draft, measure_energy=False)
    drafter = engine.default_drafter
    prompt_set = load_prompt_set("code" if draft is not None else "chat")
    prompts = prompt_set.prompts[:PROFILE_PROMPTS]
    new_tokens = min(PROFILE_NEW_TOKENS, engine.max_length // 2)
    # Prompts keep their last tokens where the pair's context is short (a small export).
    room = engine.max_length - new_tokens
    results = [
        engine.generate(
            engine.encode(p, chat=prompt_set.chat)[-room:],
            k=MAX_K,
            drafter=drafter,
            max_new_tokens=new_tokens,
        )
        for p in prompts
    ]
    tested = sum(r.stats.tested for r in results)
    alpha = sum(r.stats.accepted for r in results) / tested if tested else 0.0
    offered = [0] * MAX_K
    kept = [0.0] * MAX_K
    for result in results:
        for record_position, rate in enumerate(result.stats.acceptance_by_position):
            offered[record_position] += 1
            kept[record_position] += rate
    # reached[i]: share of rounds whose draft position i was accepted (0 = first token);
    # alpha at position i is that share given position i - 1 was accepted.
    reached = [kept[i] / offered[i] for i in range(MAX_K) if offered[i]]
    by_position = [
        reached[i] / reached[i - 1] if i and reached[i - 1] else reached[i]
        for i in range(len(reached))
    ]
    profile = engine.cost_profile()
    verify_cost = list(profile.verify_cost)
    speedups = [expected_speedup(alpha, profile.c, verify_cost, k) for k in range(MAX_K + 1)]
    best = max(range(MAX_K + 1), key=lambda k: speedups[k])
    return {
        "alpha": alpha,
        "alpha_by_position": by_position,
        "accepted_through_position": reached,
        "c": profile.c,
        "verify_cost": verify_cost,
        "recommended_k": best,
        "expected_speedup": speedups[best],
        "drafter": drafter,
        "measured_on": f"{len(prompts)} built-in {'chat' if prompt_set.chat else 'code'} "
        f"prompts, {new_tokens} tokens each, here",
        "default_k": engine.default_k,
        "default_k_source": engine.default_k_source,
    }
