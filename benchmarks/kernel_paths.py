"""One bundle's passes on each of the GGUF kernels' code paths this CPU has, alternating: what
an instruction set buys a real model's step, verify passes and prefill.

    python benchmarks/kernel_paths.py BUNDLE [--paths avx2,avx512-vnni,auto]
        [--widths 1,2,5,8,128] [--context 64] [--rounds 3] [--threads 2]
    python benchmarks/kernel_paths.py BUNDLE --builds A.so,B.so [...]

A process runs one path (the library picks it once, ``EDGESPEC_GGUF_KERNEL_PATH`` forces
it; ``auto`` is the CPU's own choice), so each path runs in a child process of its own, the
paths taking turns ``--rounds`` times. A child loads the bundle's target through the runtime
(as ``edgespec generate`` runs it), feeds ``--context`` tokens of this repository's README,
then times passes of each width over that context (each cropped back after it: 20 passes
after 5 warm ones, 4 for widths above 16) and prints its medians. The parent prints, per
path and width, the median over rounds of the children's medians in milliseconds and its
ratio to the first path's. Every path's outputs are the same bits
(tests/kernels/test_kernel_paths.py checks it), so only time differs. ``--builds`` compares
builds of the library instead: the same source compiled with other settings
(``CFLAGS=-DES_ROWS8_PREFETCH_BYTES=4096 python setup.py build_ext --inplace --force``, then
copy the .so it writes). The builds run in one
process, each session registering its own build, their passes taking turns in batches of 8
(after 5 warm ones) ``--rounds`` times: separate processes moved by up to 40% between runs
of the same build on a 2-core EPYC whose memory speed drifts, batches in one process by up
to 6%.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import harness


def child(bundle: Path, widths: list[int], context: int, threads: int) -> None:
    """Times each width's passes on this process's path; prints one JSON line."""
    from edgespec.api import Engine
    from edgespec.graph.kernels import gguf_kernel_path

    engine = Engine.load(target=bundle, threads=threads, measure_energy=False)
    ids = engine.encode(harness.readme_text(20))
    model = engine.target
    cache = model.new_cache()
    model.forward(ids[:context], cache)
    medians = {}
    for width in widths:
        passes = harness.WARM_PASSES + (20 if width <= 16 else 4)
        found = harness.timed_passes(
            model,
            cache,
            ids[context : context + width],
            length=context,
            passes=passes,
            warm=harness.WARM_PASSES,
        )
        medians[str(width)] = statistics.median(found) * 1e3
    print(json.dumps({"path": gguf_kernel_path(), "ms": medians}), flush=True)


def builds_in_one_process(
    bundle: Path, builds: list[str], widths: list[int], args: argparse.Namespace
) -> None:
    """Loads the bundle once per library build (each session registers its own) and times
    their passes in turn; prints each build's medians and their ratios to the first build's."""
    import edgespec.graph.kernels as kernels
    from edgespec.api import Engine

    missing = [build for build in builds if not Path(build).is_file()]
    if missing:
        sys.exit(
            f"no library build at {', '.join(missing)}: build one with 'python setup.py "
            "build_ext --inplace --force' and copy the .so it writes"
        )
    text = harness.readme_text(20)
    loaded = []
    for build in builds:
        os.environ[kernels.ENVIRONMENT] = str(Path(build).resolve())
        kernels.gguf_kernel_library.cache_clear()
        engine = Engine.load(target=bundle, threads=args.threads, measure_energy=False)
        ids = engine.encode(text)
        cache = engine.target.new_cache()
        engine.target.forward(ids[: args.context], cache)
        loaded.append((engine.target, cache, ids))
    found: dict[tuple[int, int], list[float]] = {
        (i, w): [] for i in range(len(builds)) for w in widths
    }
    for _ in range(args.rounds):
        for index, (model, cache, ids) in enumerate(loaded):
            for width in widths:
                step = ids[args.context : args.context + width]
                batch = 8 if width <= 16 else 2
                found[(index, width)] += harness.timed_passes(
                    model,
                    cache,
                    step,
                    length=args.context,
                    passes=harness.WARM_PASSES + batch,
                    warm=harness.WARM_PASSES,
                )
    lines = harness.JsonLines(args.jsonl)
    for index, build in enumerate(builds):
        row: dict[str, object] = {"build": build}
        for width in widths:
            median = statistics.median(found[(index, width)]) * 1e3
            baseline = statistics.median(found[(0, width)]) * 1e3
            row[f"T({width}) ms"] = round(median, 2)
            row[f"T({width}) vs the first"] = round(median / baseline, 3)
        lines.write(row)


def main() -> None:
    parser = harness.argument_parser(__doc__, context=64, rounds=3, threads=2)
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--paths", default="avx2,avx512-vnni,auto")
    parser.add_argument("--builds", default="", help="library builds to compare instead")
    parser.add_argument("--widths", default="1,2,5,8,128")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    widths = harness.int_list(args.widths)
    lines = harness.JsonLines(args.jsonl)
    if args.child:
        child(args.bundle, widths, args.context, args.threads)
        return
    if args.builds:
        builds_in_one_process(args.bundle, args.builds.split(","), widths, args)
        return
    paths = args.paths.split(",")
    runs: dict[str, list[dict[str, float]]] = {path: [] for path in paths}
    ran: dict[str, str] = {}
    for _ in range(args.rounds):
        for path in paths:
            env = {**os.environ, "EDGESPEC_GGUF_KERNEL_PATH": "" if path == "auto" else path}
            command = [sys.executable, __file__, str(args.bundle), "--child"]
            command += ["--widths", args.widths, "--context", str(args.context)]
            command += ["--threads", str(args.threads)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            line = json.loads(done.stdout.strip().splitlines()[-1])
            ran[path] = line["path"]
            runs[path].append(line["ms"])
            lines.write({"asked": path, **line})
    first = paths[0]
    for path in paths:
        row = {"path": path, "ran": ran[path]}
        for width in widths:
            median = statistics.median(run[str(width)] for run in runs[path])
            baseline = statistics.median(run[str(width)] for run in runs[first])
            row[f"T({width}) ms"] = round(median, 2)
            row[f"T({width}) vs {first}"] = round(median / baseline, 3)
        lines.write(row)


if __name__ == "__main__":
    main()
