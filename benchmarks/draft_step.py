"""What a draft step costs, and what each of the runtime's draft levers takes off it.

    python benchmarks/draft_step.py DRAFT_BUNDLE [HEAD_BUNDLE] [--threads 1]
    python benchmarks/draft_step.py --pair qwen2.5-coder-1.5b [--prompts 3] [--tokens 48]

First form: one-token draft steps after 64 tokens of context, each cropped back, in
alternating blocks of 12 (the first 2 of a block dropped), median of 60: the bundle with
its steps padded as a target's are, the same unpadded (as the runtime runs a draft), and
``HEAD_BUNDLE`` unpadded (the same draft with a reduced head, ``catalog.draft_bundle``).

Second form: the catalog pair drafting with its model at k 3, the draft on one thread, on
the target's threads, and on the target's threads spinning, alternating over the code
prompts; tok/s and the draft's step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel


def alternating_steps(models: dict[str, OnnxModel], positions: int) -> dict[str, list[float]]:
    """Milliseconds of one-token steps after ``positions`` tokens of context, each cropped
    back, the models in turn in blocks of 12 (the first 2 of a block dropped), six blocks."""
    context = list(range(1000, 1000 + positions))
    caches = {}
    for name, runner in models.items():
        caches[name] = runner.new_cache()
        runner.forward(context, caches[name])
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(6):
        for name, runner in models.items():
            for index in range(12):
                started = time.perf_counter()
                runner.forward([1000 + index], caches[name])
                elapsed = time.perf_counter() - started
                caches[name].crop(positions)
                if index >= 2:
                    times[name].append(elapsed * 1e3)
    return times


def step_costs(draft: Path, head: Path | None, threads: int) -> None:
    def model(path: Path, exact: bool) -> OnnxModel:
        options = ModelOptions(intra_op_threads=threads, exact_passes=exact)
        return OnnxModel(load_bundle(path), options=options)

    models = {"padded": model(draft, True), "unpadded": model(draft, False)}
    if head is not None:
        models["reduced head, unpadded"] = model(head, False)
    for name, found in alternating_steps(models, 64).items():
        line = {"draft": name, "step_ms": round(statistics.median(found), 1), "steps": len(found)}
        print(json.dumps({**line, "threads": threads}), flush=True)


def pair_threads(name: str, prompts: int, tokens: int) -> None:
    import edgespec.engine.loading as loading
    from edgespec.api import Engine
    from edgespec.measure.bench import load_prompts

    chosen = loading.session_options

    def forced(threads: int, spinning: bool) -> Any:
        def options(request: Any, **kwargs: Any) -> Any:
            target, draft = chosen(request, **kwargs)
            return target, dataclasses.replace(draft, intra_op_threads=threads, spinning=spinning)

        return options

    configs = {"1 thread": (1, False), "2 threads": (2, False), "2 threads, spinning": (2, True)}
    engines = {}
    for label, (threads, spinning) in configs.items():
        loading.session_options = forced(threads, spinning)
        engines[label] = Engine.load(model=name, threads=2, measure_energy=False)
    loading.session_options = chosen
    totals = {label: [0.0, 0.0, 0.0, 0.0] for label in engines}
    for _ in range(2):
        for text in load_prompts("code")[:prompts]:
            for label, engine in engines.items():
                time.sleep(0.25)
                stats = engine.generate(text, drafter="model", k=3, max_new_tokens=tokens).stats
                found = totals[label]
                found[0] += stats.new_tokens
                found[1] += stats.decode_ms / 1e3
                found[2] += stats.draft_ms
                found[3] += stats.draft_steps
    for label, (count, seconds, draft_ms, steps) in totals.items():
        line = {"draft": label, "tok_s": round(count / seconds, 2)}
        print(json.dumps({**line, "draft_step_ms": round(draft_ms / max(steps, 1), 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("draft", type=Path, nargs="?")
    parser.add_argument("head", type=Path, nargs="?")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pair", default=None, help="a catalog model with a draft")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    if args.pair:
        pair_threads(args.pair, args.prompts, args.tokens)
    elif args.draft is not None:
        step_costs(args.draft, args.head, args.threads)
    else:
        parser.error("give a DRAFT_BUNDLE or --pair NAME")


if __name__ == "__main__":
    main()
