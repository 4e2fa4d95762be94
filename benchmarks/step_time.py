"""The one-token step of each bundle as the runtime runs a target (padded where the manifest
says so), after ``--context`` tokens (64 unless told), alternating between the bundles in one
process.

    python benchmarks/step_time.py BUNDLE [BUNDLE ...] [--context 64] [--threads 2] [--rounds 6]

Prints one JSON line per bundle: the median and the fastest step in milliseconds over
``rounds`` x 10 steps (each step's cache cropped back to the same context), and the seconds
its prefill of the context took (the runtime's 128-token passes; bundles in turn, once each).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--context", type=int, default=64)
    args = parser.parse_args()
    options = ModelOptions(intra_op_threads=args.threads, spinning=True)
    models = [OnnxModel(load_bundle(path), options=options) for path in args.bundles]
    context = [1000 + (7919 * i) % 20000 for i in range(args.context)]
    caches = [model.new_cache() for model in models]
    prefills = []
    for model, cache in zip(models, caches, strict=True):
        started = time.perf_counter()
        model.forward(context, cache, last_only=True)
        prefills.append(time.perf_counter() - started)
    steps: list[list[float]] = [[] for _ in models]
    for _ in range(args.rounds):
        for model, cache, times in zip(models, caches, steps, strict=True):
            for _ in range(10):
                started = time.perf_counter()
                model.forward([42], cache)
                times.append(time.perf_counter() - started)
                cache.crop(len(context))
    for path, times, prefill in zip(args.bundles, steps, prefills, strict=True):
        line = {
            "bundle": path.name,
            "context": args.context,
            "prefill_s": round(prefill, 2),
            "median_step_ms": round(statistics.median(times) * 1e3, 2),
            "fastest_step_ms": round(min(times) * 1e3, 2),
        }
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
