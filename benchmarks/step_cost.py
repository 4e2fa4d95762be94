"""The cost of one target step, for several bundles, interleaved in blocks: a finer measure
than decoding whole answers, for telling graphs of the same weights apart.

    python benchmarks/step_cost.py BUNDLE [BUNDLE ...] [--contexts 64,1024,3000]
        [--width 1] [--blocks 30] [--threads 2]

Each bundle's target is loaded through the runtime (IO binding, in-place cache, spinning
threads, as ``edgespec generate`` runs it) and fed ``--context`` tokens of this repository's
README. Then, for ``--blocks`` rounds, every bundle in turn runs 25 passes of ``--width``
tokens, each cropped back to the context (the first 5 of a block are dropped: the previous
bundle's threads are still spinning), so every pass reads the same cache. Prints one JSON line
per bundle and context with the median and quartiles in milliseconds, then each bundle's
median over the first bundle's. Passes of the same graph move by about ±2% between runs on
this machine, decodes of 64 tokens by about ±10%.
"""

from __future__ import annotations

from edgespec.api import Engine

import harness

PASSES_PER_BLOCK = 25


def main() -> None:
    parser = harness.argument_parser(__doc__, bundles="+", contexts="64", threads=2)
    parser.add_argument("--width", type=int, default=1, help="tokens per pass (default 1)")
    parser.add_argument("--blocks", type=int, default=30)
    args = parser.parse_args()
    engines = {
        str(b): Engine.load(target=b, threads=args.threads, measure_energy=False)
        for b in args.bundles
    }
    ids = next(iter(engines.values())).encode(harness.readme_text(20))
    models = {bundle: engine.target for bundle, engine in engines.items()}
    lines = harness.JsonLines(args.jsonl)
    for context in harness.int_list(args.contexts):
        times = harness.step_blocks(
            models,
            ids[:context],
            blocks=args.blocks,
            passes=PASSES_PER_BLOCK,
            warm=harness.WARM_PASSES,
            step=ids[context : context + args.width],
        )
        first = harness.summarize(next(iter(times.values()))).median
        for bundle, found in times.items():
            summary = harness.summarize(found)
            line = {"bundle": bundle, "context": context, "width": args.width}
            line |= {
                "median_ms": round(summary.median * 1e3, 3),
                "p25_ms": round(summary.p25 * 1e3, 3),
                "p75_ms": round(summary.p75 * 1e3, 3),
                "vs_first": round(summary.median / first, 3),
            }
            lines.write(line)


if __name__ == "__main__":
    main()
