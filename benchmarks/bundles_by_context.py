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

from edgespec.api import Engine

import harness


def main() -> None:
    parser = harness.argument_parser(
        __doc__, bundles="+", contexts="64,1024,3000", tokens=48, rounds=2, threads=2
    )
    args = parser.parse_args()
    contexts = harness.int_list(args.contexts)
    engines = {
        str(b): Engine.load(target=b, threads=args.threads, measure_energy=False)
        for b in args.bundles
    }
    ids = next(iter(engines.values())).encode(harness.readme_text(20))
    for engine in engines.values():  # warm-up
        engine.generate(ids[:16], drafter="none", max_new_tokens=4)

    def decode(bundle: str, context: int) -> float:
        result = engines[bundle].generate(
            ids[:context], drafter="none", max_new_tokens=args.tokens, stop=()
        )
        return result.stats.new_tokens / (result.stats.decode_ms / 1e3)

    lines = harness.JsonLines(args.jsonl)
    rates = harness.Samples()
    for turn in harness.alternate(list(engines), contexts, decode, rounds=args.rounds):
        for bundle, rate in turn.results.items():
            rates.add((bundle, turn.item), rate)
            line = {"round": turn.round, "context": turn.item, "bundle": bundle}
            lines.write({**line, "tok_s": rate})
    for bundle in engines:
        mean = {c: rates.mean((bundle, c)) for c in contexts}
        growth = mean[contexts[0]] / mean[contexts[-1]]
        lines.write({"bundle": bundle, "tok_s": mean, "growth": growth})


if __name__ == "__main__":
    main()
