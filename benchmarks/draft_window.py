"""A draft attending over a window of its history at long contexts: the pair with the draft's
whole history against the pair with windows of it, and target-only, in one process, taking
turns prompt by prompt.

    python benchmarks/draft_window.py [--model qwen2.5-coder-1.5b] [--context 8192]
        [--fill 0.75] [--windows 0,512,1024] [--drafters model,combined] [--prompts 4]
        [--tokens 64] [--rounds 2] [--threads 2] [--jsonl FILE]

Every prompt is the same ``--fill`` x ``--context`` tokens of the Python standard library's
source (benchmarks/long_context.py's) followed by one of the project's hidden code requests,
so after the first generation each engine reuses the history's cache and prefills only the
request. One engine per window (``Engine.load(draft_window=W)``, 0: the whole history) and
one of the target alone (target-only: its threads spin, as without a draft), each loaded at
``--context``. Every output is compared with target-only's for the same prompt. Prints one
JSON line per generation, then per configuration the median decode tok/s, its ratio to
target-only, α, draft steps and the draft's milliseconds per step (catching up on the
tokens of rounds it did not draft included).
"""

from __future__ import annotations

import statistics
from typing import Any

from long_context import CODE_REQUEST, stdlib_code

import harness


def prompts(model: str, context: int, fill: float, count: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    from edgespec.manifest import load_bundle
    from edgespec.measure.bench import load_prompts
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    bundle = load_bundle(model_bundle(catalog.find(model)).root, verify_checksums=False)
    tokenizer = Tokenizer.from_file(str(bundle.tokenizer_path))
    requests = [tokenizer.encode(CODE_REQUEST + text).ids for text in load_prompts("code")[:count]]
    history = tokenizer.encode(stdlib_code()).ids
    depth = int(context * fill) - max(len(request) for request in requests)
    if depth > len(history):
        raise SystemExit(f"the library's text holds {len(history)} tokens, short of {depth}")
    return [history[:depth] + request for request in requests]


def main() -> None:
    parser = harness.argument_parser(
        __doc__, threads=2, rounds=2, prompts=4, tokens=64, context=8192
    )
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--fill", type=float, default=0.75)
    parser.add_argument("--windows", default="0,512,1024", help="draft windows (0: whole)")
    parser.add_argument("--drafters", default="model,combined")
    args = parser.parse_args()
    from edgespec.api import Engine
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    ids = prompts(args.model, args.context, args.fill, args.prompts)
    windows = harness.int_list(args.windows)
    alone = Engine.load(
        target=model_bundle(catalog.find(args.model)).root,
        context=args.context,
        threads=args.threads,
        measure_energy=False,
    )
    alone.generate(ids[0], max_new_tokens=8, drafter="none")
    engines = {}
    for window in windows:
        engines[window] = Engine.load(
            model=args.model,
            context=args.context,
            threads=args.threads,
            draft_window=window,
            measure_energy=False,
        )
        # the history's cache, and every session's first passes, before any timing
        engines[window].generate(ids[0], max_new_tokens=8, drafter="model")
        print(f"loaded the pair with draft window {window}", flush=True)
    configs = ["target-only"] + [
        f"{drafter}, window {window}" for drafter in args.drafters.split(",") for window in windows
    ]
    lines = harness.JsonLines(args.jsonl)
    found: dict[str, list[dict[str, Any]]] = {config: [] for config in configs}
    reference: dict[int, tuple[int, ...]] = {}

    def run(config: str, index: int) -> dict[str, Any]:
        if config == "target-only":
            engine, drafter = alone, "none"
        else:
            drafter, window = config.split(", window ")
            engine = engines[int(window)]
        result = engine.generate(ids[index], max_new_tokens=args.tokens, drafter=drafter)
        stats = result.stats.to_dict()
        if config == "target-only":
            reference.setdefault(index, result.tokens)
        return {
            "config": config,
            "prompt": index,
            "tok_s": stats["tokens_per_s"],
            "alpha": stats["alpha"],
            "draft_steps": stats["draft_steps"],
            "draft_ms": stats["draft_ms"],
            "rounds": stats["rounds"],
            "reused_tokens": stats.get("reused_tokens"),
            "tokens": result.tokens,
        }

    for turn in harness.alternate(configs, range(len(ids)), run, rounds=args.rounds, rotate=True):
        for config, record in turn.results.items():
            record["identical"] = record.pop("tokens") == reference[turn.item]
            lines.write({"context": args.context, "round": turn.round, **record})
            found[config].append(record)
    base = statistics.median(r["tok_s"] for r in found["target-only"])
    print(f"\n{args.model}, context {args.context}, {len(ids[0])}-token prompts, {args.tokens} new")
    print("configuration           tok/s   vs target-only  alpha  draft steps  ms/step  identical")
    for config, records in found.items():
        speed = statistics.median(r["tok_s"] for r in records)
        alphas = [r["alpha"] for r in records if r["alpha"] is not None]
        steps = sum(r["draft_steps"] for r in records)
        per_step = sum(r["draft_ms"] for r in records) / steps if steps else 0.0
        same = sum(r["identical"] for r in records)
        alpha = f"{statistics.mean(alphas):.2f}" if alphas else "  - "
        print(
            f"{config:22s}  {speed:6.2f}  {speed / base:13.2f}x  {alpha}  {steps:11d}  "
            f"{per_step:7.2f}  {same}/{len(records)}"
        )


if __name__ == "__main__":
    main()
