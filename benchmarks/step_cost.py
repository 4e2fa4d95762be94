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

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.api import Engine

PASSES_PER_BLOCK = 25
WARM_PASSES = 5


def timed_passes(model: Any, cache: Any, step: list[int], context: int, passes: int) -> list[float]:
    """Seconds of ``passes`` passes of ``step`` over ``cache`` (cropped back to ``context``
    after each), less the first WARM_PASSES (the previous passes' threads still spin)."""
    found = []
    for index in range(passes):
        started = time.perf_counter()
        model.forward(step, cache)
        elapsed = time.perf_counter() - started
        cache.crop(context)
        if index >= WARM_PASSES:
            found.append(elapsed)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", type=Path, nargs="+")
    parser.add_argument("--contexts", default="64")
    parser.add_argument("--width", type=int, default=1, help="tokens per pass (default 1)")
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    engines = [
        Engine.load(target=b, threads=args.threads, measure_energy=False) for b in args.bundles
    ]
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    ids = engines[0].encode(text * 20)
    for context in (int(c) for c in args.contexts.split(",")):
        models = [engine.target for engine in engines]
        caches = []
        for model in models:
            cache = model.new_cache()
            model.forward(ids[:context], cache)
            caches.append(cache)
        step = ids[context : context + args.width]
        times: list[list[float]] = [[] for _ in models]
        for _ in range(args.blocks):
            for model, cache, found in zip(models, caches, times, strict=True):
                found.extend(timed_passes(model, cache, step, context, PASSES_PER_BLOCK))
        medians = [float(np.median(found)) for found in times]
        for bundle, found, median in zip(args.bundles, times, medians, strict=True):
            quartiles = np.percentile(found, [25, 75]) * 1e3
            line = {"bundle": str(bundle), "context": context, "width": args.width}
            line |= {
                "median_ms": round(median * 1e3, 3),
                "p25_ms": round(float(quartiles[0]), 3),
                "p75_ms": round(float(quartiles[1]), 3),
                "vs_first": round(median / medians[0], 3),
            }
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
