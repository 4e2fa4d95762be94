"""Drafters side by side on one target: target-only, prompt lookup, the draft model and the
combined drafter (lookup when the context matches, the model otherwise), alternating prompt
by prompt in one process, greedy (or sampled at ``--temperature``), on the ``chat`` and
``chat-edit`` sets.

    python benchmarks/drafters.py [--target DIR] [--draft DIR] [--threads 2] [--tokens 128]
        [--also-draft NAME=DIR ...]

``--also-draft`` puts more drafts for the same target in the same run (their draft-model and
combined configurations, labelled with NAME), each through its own engine.

Defaults: the default model and its shipped draft (converted on first use). Prints one JSON
line per (set, configuration) and a table; every speculative output is checked against the
target-only output of the same prompt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.measure.bench import load_prompt_set

import harness

#: (name, drafter, k, sampling mode): k None is the engine's policy ("auto" for prompt
#: lookup); mode None the drafter's default (applies with --temperature).
CONFIGURATIONS = (
    ("target-only", "none", None, None),
    ("prompt lookup", "ngram", None, None),
    ("draft model k 2", "model", 2, None),
    ("draft model k 3", "model", 3, None),
    ("combined k 6", "combined", 6, None),
    ("combined k 6 rejection", "combined", 6, "rejection"),
)


def main() -> None:
    parser = harness.argument_parser(__doc__, part="paragraph", threads=2, tokens=128, repeats=1)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--sets", nargs="+", default=["chat", "chat-edit"])
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    parser.add_argument("--also-draft", nargs="+", default=[], metavar="NAME=DIR")
    parser.add_argument(
        "--only", nargs="+", default=None, help="configurations to run (target-only always runs)"
    )
    args = parser.parse_args()
    chosen = [
        (*c, "") for c in CONFIGURATIONS if args.only is None or c[0] in (*args.only, "target-only")
    ]
    engines = {
        "": Engine.load(
            target=args.target, draft=args.draft, threads=args.threads, measure_energy=False
        )
    }
    for spec in args.also_draft:
        draft_name, _, directory = spec.partition("=")
        engines[draft_name] = Engine.load(
            target=args.target, draft=Path(directory), threads=args.threads, measure_energy=False
        )
        chosen += [
            (f"{c[0]} {draft_name}", *c[1:4], draft_name)
            for c in chosen
            if c[1] in ("model", "combined") and c[4] == ""
        ]
    configurations = {c[0]: c for c in chosen}
    lines = harness.JsonLines(args.jsonl)
    table = []
    for name in args.sets:
        prompts = load_prompt_set(name)
        for warm in engines.values():
            warm.generate(prompts.prompts[0], drafter="none", max_new_tokens=8, chat=prompts.chat)
        indexed = list(enumerate(prompts.prompts))

        def run(label: str, item: tuple[int, str], chat: bool = prompts.chat) -> Any:
            _, drafter, k, mode, key = configurations[label]
            return engines[key].generate(
                item[1],
                drafter=drafter,
                k=k,
                max_new_tokens=args.tokens,
                chat=chat,
                temperature=args.temperature,
                seed=item[0],
                sampling_mode=mode,
            )

        rates, accepted = harness.Rates(), harness.Rates()  # accepted: over tested
        check = harness.OutputCheck(reference="target-only")
        # The order rotates prompt by prompt so no configuration always runs first.
        turns = harness.alternate(
            list(configurations), indexed, run, rounds=args.repeats, rotate=True
        )
        for turn in turns:
            check.add({label: result.tokens for label, result in turn.results.items()})
            for label, result in turn.results.items():
                rates.add(label, result.stats.new_tokens, result.stats.decode_ms / 1e3)
                accepted.add(label, result.stats.accepted, result.stats.tested)
        speedups = rates.ratios("target-only")
        for label in configurations:
            tested = accepted.seconds[label]
            line = {
                "set": name,
                "configuration": label,
                "tokens_per_s": round(rates.rate(label), 1),
                "speedup": round(speedups[label], 2),
                "alpha": round(accepted.tokens[label] / tested, 2) if tested else None,
                # Sampled outputs differ by design (same distribution, other draws).
                "identical": check.fraction(label) if args.temperature == 0 else "–",
                "temperature": args.temperature,
                "threads": args.threads,
                "max_new_tokens": args.tokens,
            }
            lines.write(line)
            table.append(line)
    print("\n| set | configuration | tok/s | speedup | α | identical |\n|---|---|---|---|---|---|")
    for line in table:
        alpha = "–" if line["alpha"] is None else f"{line['alpha']:.2f}"
        print(
            f"| {line['set']} | {line['configuration']} | {line['tokens_per_s']} | "
            f"{line['speedup']:.2f}× | {alpha} | {line['identical']} |"
        )


if __name__ == "__main__":
    main()
