"""A head on the target against the model's other drafters, alternating prompt by prompt in one
process on the same weights and prompts: target-only, the draft model and the combined drafter
over it (without a draft model: prompt lookup, the default then), the head alone and the
combined drafter over the head; greedy (or sampled at ``--temperature``), 96 new tokens by default.

    python benchmarks/heads.py [--model NAME] [--head DIR] [--sets code edit chat]
        [--tokens 96] [--threads 2] [--temperature 0]

Also prints the steps' costs (``runtime.costs.measure_costs``: the target's one-token step,
the draft model's and the head's), so c = draft step / target step is measured on the same
machine in the same run. Every speculative output is checked against the target-only output
of the same prompt. One JSON line per (set, configuration), then a table.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.measure.bench import load_prompt_set
from edgespec.runtime.costs import measure_costs

import harness

#: (name, engine, drafter, k): engine "draft" holds the target and its draft model, "head"
#: the target and its head; k None is the engine's policy.
CONFIGURATIONS = (
    ("target-only", "head", "none", None),
    ("draft model", "draft", "model", None),
    ("combined over the draft", "draft", "combined", None),
    ("head", "head", "head", None),
    ("combined over the head", "head", "combined", None),
)


def head_argument_parser(doc: str | None, *, prompts: int) -> argparse.ArgumentParser:
    """The flags of the scripts that measure a head: a model, a head, the prompt sets and how
    many of each (``prompts`` by default; 0: all), beside the harness's own."""
    parser = harness.argument_parser(doc, part="paragraph", threads=2, tokens=96, repeats=1)
    parser.add_argument("--model", default=None, help="a catalog model (default: the default)")
    parser.add_argument("--head", type=Path, default=None, help="a head bundle to use")
    parser.add_argument("--sets", nargs="+", default=["code", "edit", "chat"])
    parser.add_argument(
        "--prompts", type=int, default=prompts, help="the first N of each set (0: all)"
    )
    return parser


def main() -> None:
    parser = head_argument_parser(__doc__, prompts=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    args = parser.parse_args()
    common = {"model": args.model, "threads": args.threads, "measure_energy": False}
    engines = {
        "head": Engine.load(head=args.head, drafter="head", **common),
        "draft": Engine.load(heads=False, drafter="combined", **common),
    }
    chosen = list(CONFIGURATIONS)
    if engines["draft"].draft is None:  # no draft model: the default is prompt lookup
        chosen = [c for c in chosen if c[1] != "draft"]
        chosen.insert(1, ("prompt lookup (the default)", "draft", "ngram", None))
    assert engines["head"].pair.head is not None, "no head: pass --head DIR"
    target = engines["head"].target
    assert target is not None
    head_costs = measure_costs(target, engines["head"].pair.head, max_width=1)
    draft = engines["draft"].draft
    draft_costs = measure_costs(target, draft, max_width=1) if draft is not None else None
    steps = {
        "target_step_ms": round(head_costs.target_step_s * 1e3, 2),
        "head_step_ms": round(head_costs.draft_step_s * 1e3, 3),
        "head_c": round(head_costs.draft_step_s / head_costs.target_step_s, 3),
    }
    if draft_costs is not None:
        steps["draft_step_ms"] = round(draft_costs.draft_step_s * 1e3, 3)
        steps["draft_c"] = round(draft_costs.draft_step_s / draft_costs.target_step_s, 3)
    lines = harness.JsonLines(args.jsonl)
    lines.write({"steps": steps, "threads": args.threads})
    print(steps)
    configurations = {c[0]: c for c in chosen}
    table = []
    for name in args.sets:
        prompts = load_prompt_set(name)
        items = list(enumerate(prompts.prompts[: args.prompts or None]))
        for warm in engines.values():
            warm.generate(items[0][1], drafter="none", max_new_tokens=8, chat=prompts.chat)

        def run(label: str, item: tuple[int, str], chat: bool = prompts.chat) -> Any:
            _, engine, drafter, k = configurations[label]
            return engines[engine].generate(
                item[1],
                drafter=drafter,
                k=k,
                max_new_tokens=args.tokens,
                chat=chat,
                temperature=args.temperature,
                seed=item[0],
            )

        rates, accepted = harness.Rates(), harness.Rates()
        per_round = harness.Rates()  # committed tokens over rounds
        check = harness.OutputCheck(reference="target-only")
        turns = harness.alternate(
            list(configurations), items, run, rounds=args.repeats, rotate=True
        )
        for turn in turns:
            check.add({label: result.tokens for label, result in turn.results.items()})
            for label, result in turn.results.items():
                stats = result.stats
                rates.add(label, stats.new_tokens, stats.decode_ms / 1e3)
                accepted.add(label, stats.accepted, stats.tested)
                per_round.add(label, stats.new_tokens, stats.rounds)
        speedups = rates.ratios("target-only")
        for label in configurations:
            tested = accepted.seconds[label]
            line = {
                "set": name,
                "configuration": label,
                "tokens_per_s": round(rates.rate(label), 1),
                "speedup": round(speedups[label], 2),
                "alpha": round(accepted.tokens[label] / tested, 2) if tested else None,
                "tokens_per_round": round(per_round.rate(label), 2),
                "identical": check.fraction(label) if args.temperature == 0 else "–",
                "temperature": args.temperature,
                "threads": args.threads,
                "max_new_tokens": args.tokens,
                "prompts": len(items),
            }
            lines.write(line)
            table.append(line)
    print(
        "\n| set | configuration | tok/s | vs target-only | α | tokens a round | identical |"
        "\n|---|---|---|---|---|---|---|"
    )
    for line in table:
        alpha = "–" if line["alpha"] is None else f"{line['alpha']:.2f}"
        print(
            f"| {line['set']} | {line['configuration']} | {line['tokens_per_s']} | "
            f"{line['speedup']:.2f}x | {alpha} | {line['tokens_per_round']} | "
            f"{line['identical']} |"
        )


if __name__ == "__main__":
    main()
