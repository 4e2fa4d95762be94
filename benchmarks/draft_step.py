"""What a draft step costs, and what each of the runtime's draft levers takes off it.

    python benchmarks/draft_step.py DRAFT_BUNDLE [HEAD_BUNDLE] [--threads 1]
    python benchmarks/draft_step.py --pair qwen2.5-coder-1.5b [--prompts 3] [--tokens 48]

First form: one-token draft steps after 64 tokens of context, each cropped back, in
alternating blocks of 12 (the first 2 of a block dropped), median of 60: the bundle with
its steps padded as a target's are, the same unpadded (as the runtime runs a draft), and
``HEAD_BUNDLE`` unpadded (the same draft with a reduced head, ``models.bundles.draft_bundle``).

Second form: the catalog pair drafting with its model at k 3, the draft on one thread, on
the target's threads, and on the target's threads spinning, alternating over the code
prompts; tok/s and the draft's step.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path
from typing import Any

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness


def alternating_steps(models: dict[str, OnnxModel], positions: int) -> dict[str, list[float]]:
    """Milliseconds of one-token steps after ``positions`` tokens of context, each cropped
    back, the models in turn in blocks of 12 (the first 2 of a block dropped), six blocks."""
    context = list(range(1000, 1000 + positions))
    found = harness.step_blocks(models, context, blocks=6, passes=12, warm=2, step=[1000])
    return {name: [seconds * 1e3 for seconds in times] for name, times in found.items()}


def step_costs(draft: Path, head: Path | None, threads: int, lines: harness.JsonLines) -> None:
    def model(path: Path, exact: bool) -> OnnxModel:
        options = ModelOptions(intra_op_threads=threads, exact_passes=exact)
        return OnnxModel(load_bundle(path), options=options)

    models = {"padded": model(draft, True), "unpadded": model(draft, False)}
    if head is not None:
        models["reduced head, unpadded"] = model(head, False)
    for name, found in alternating_steps(models, 64).items():
        line = {"draft": name, "step_ms": round(statistics.median(found), 1), "steps": len(found)}
        lines.write({**line, "threads": threads})


def pair_threads(name: str, prompts: int, tokens: int, lines: harness.JsonLines) -> None:
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

    def run(label: str, text: str) -> Any:
        return engines[label].generate(text, drafter="model", k=3, max_new_tokens=tokens).stats

    rates, draft_ms, steps = harness.Rates(), harness.Rates(), harness.Rates()
    texts = load_prompts("code")[:prompts]
    for turn in harness.alternate(list(engines), texts, run, rounds=2, settle_s=0.25):
        for label, stats in turn.results.items():
            rates.add(label, stats.new_tokens, stats.decode_ms / 1e3)
            draft_ms.add(label, stats.draft_ms, 0.0)
            steps.add(label, stats.draft_steps, 0.0)
    for label in engines:
        line = {"draft": label, "tok_s": round(rates.rate(label), 2)}
        per_step = draft_ms.tokens[label] / max(steps.tokens[label], 1)
        lines.write({**line, "draft_step_ms": round(per_step, 1)})


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=1, prompts=3, tokens=48)
    parser.add_argument("draft", type=Path, nargs="?")
    parser.add_argument("head", type=Path, nargs="?")
    parser.add_argument("--pair", default=None, help="a catalog model with a draft")
    args = parser.parse_args()
    lines = harness.JsonLines(args.jsonl)
    if args.pair:
        pair_threads(args.pair, args.prompts, args.tokens, lines)
    elif args.draft is not None:
        step_costs(args.draft, args.head, args.threads, lines)
    else:
        parser.error("give a DRAFT_BUNDLE or --pair NAME")


if __name__ == "__main__":
    main()
