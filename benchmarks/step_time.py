"""The one-token step of each bundle as the runtime runs a target (padded where the manifest
says so), after ``--context`` tokens (64 unless told), alternating between the bundles in one
process.

    python benchmarks/step_time.py BUNDLE [BUNDLE ...] [--context 64] [--threads 2] [--rounds 6]

Prints one JSON line per bundle: the median and the fastest step in milliseconds over
``rounds`` x 10 steps (each step's cache cropped back to the same context), and the seconds
its prefill of the context took (the runtime's 128-token passes; bundles in turn, once each).
"""

from __future__ import annotations

import time

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness


def main() -> None:
    parser = harness.argument_parser(__doc__, bundles="+", threads=2, rounds=6, context=64)
    args = parser.parse_args()
    options = ModelOptions(intra_op_threads=args.threads, spinning=True)
    models = {path: OnnxModel(load_bundle(path), options=options) for path in args.bundles}
    context = [1000 + (7919 * i) % 20000 for i in range(args.context)]
    prefills = {}
    for path, model in models.items():
        started = time.perf_counter()
        model.forward(context, model.new_cache(), last_only=True)
        prefills[path] = time.perf_counter() - started
    steps = harness.step_blocks(models, context, blocks=args.rounds, passes=10)
    lines = harness.JsonLines(args.jsonl)
    for path, times in steps.items():
        found = harness.summarize(times)
        line = {
            "bundle": path.name,
            "context": args.context,
            "prefill_s": round(prefills[path], 2),
            "median_step_ms": round(found.median * 1e3, 2),
            "fastest_step_ms": round(found.least * 1e3, 2),
        }
        lines.write(line)


if __name__ == "__main__":
    main()
