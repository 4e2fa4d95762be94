"""Target-only decoding of several bundles by context length, alternating in one process.

    python benchmarks/bundles_by_context.py BUNDLE [BUNDLE ...] [--contexts 64,1024,3000]
        [--tokens 48] [--rounds 2] [--threads 2]

For the same weights in different graphs, e.g. a Hugging Face checkpoint exported with
``--graph optimum`` (past and new keys concatenated into a fresh cache every step) and with
``--graph inplace`` (one buffer per layer written in place). Each round decodes ``--tokens``
greedy tokens after a context of each length (the start of this repository's README,
repeated) with every bundle in turn; prints one JSON line per run, then each bundle's mean
rate per context and the growth from the shortest to the longest context.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from edgespec.api import Engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--contexts", default="64,1024,3000")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    engines = [
        Engine.load(target=b, threads=args.threads, measure_energy=False) for b in args.bundles
    ]
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    ids = engines[0].encode(text * 20)
    for engine in engines:  # warm-up
        engine.generate(ids[:16], drafter="none", max_new_tokens=4)
    rates: dict[str, dict[int, list[float]]] = {str(b): {} for b in args.bundles}
    for round_index in range(args.rounds):
        for context in contexts:
            for bundle, engine in zip(args.bundles, engines, strict=True):
                result = engine.generate(
                    ids[:context], drafter="none", max_new_tokens=args.tokens, stop=()
                )
                rate = result.stats.new_tokens / (result.stats.decode_ms / 1e3)
                rates[str(bundle)].setdefault(context, []).append(rate)
                line = {"round": round_index, "context": context, "bundle": str(bundle)}
                print(json.dumps({**line, "tok_s": rate}), flush=True)
    for bundle, by_context in rates.items():
        mean = {c: sum(r) / len(r) for c, r in by_context.items()}
        growth = mean[contexts[0]] / mean[contexts[-1]]
        print(json.dumps({"bundle": bundle, "tok_s": mean, "growth": growth}), flush=True)


if __name__ == "__main__":
    main()
