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
ratio to the first path's. Every path's outputs are the same bits (tests/test_gguf_kernels.py
checks it), so only time differs. ``--builds`` compares builds of the library instead (each
child loads one through ``EDGESPEC_GGUF_KERNELS``, on the CPU's own path): the same source
compiled with other settings, ``-DES_ROWS8_PREFETCH_BYTES=8192`` say.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def child(bundle: Path, widths: list[int], context: int, threads: int) -> None:
    """Times each width's passes on this process's path; prints one JSON line."""
    import numpy as np
    from step_cost import WARM_PASSES, timed_passes  # this folder, first on sys.path

    from edgespec.api import Engine
    from edgespec.graph.kernels import gguf_kernel_path

    engine = Engine.load(target=bundle, threads=threads, measure_energy=False)
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    ids = engine.encode(text * 20)
    model = engine.target
    cache = model.new_cache()
    model.forward(ids[:context], cache)
    medians = {}
    for width in widths:
        passes = WARM_PASSES + (20 if width <= 16 else 4)
        found = timed_passes(model, cache, ids[context : context + width], context, passes)
        medians[str(width)] = float(np.median(found)) * 1e3
    print(json.dumps({"path": gguf_kernel_path(), "ms": medians}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--paths", default="avx2,avx512-vnni,auto")
    parser.add_argument("--builds", default="", help="library builds to compare instead")
    parser.add_argument("--widths", default="1,2,5,8,128")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    widths = [int(w) for w in args.widths.split(",")]
    if args.child:
        child(args.bundle, widths, args.context, args.threads)
        return
    builds = args.builds.split(",") if args.builds else []
    paths = builds or args.paths.split(",")
    runs: dict[str, list[dict[str, float]]] = {path: [] for path in paths}
    ran: dict[str, str] = {}
    for _ in range(args.rounds):
        for path in paths:
            env = {**os.environ, "EDGESPEC_GGUF_KERNEL_PATH": "" if path == "auto" else path}
            if builds:
                env |= {"EDGESPEC_GGUF_KERNEL_PATH": "", "EDGESPEC_GGUF_KERNELS": path}
            command = [sys.executable, __file__, str(args.bundle), "--child"]
            command += ["--widths", args.widths, "--context", str(args.context)]
            command += ["--threads", str(args.threads)]
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
            line = json.loads(done.stdout.strip().splitlines()[-1])
            ran[path] = line["path"]
            runs[path].append(line["ms"])
            print(json.dumps({"asked": path, **line}), flush=True)
    first = paths[0]
    for path in paths:
        row = {"path": path, "ran": ran[path]}
        for width in widths:
            median = statistics.median(run[str(width)] for run in runs[path])
            baseline = statistics.median(run[str(width)] for run in runs[first])
            row[f"T({width}) ms"] = round(median, 2)
            row[f"T({width}) vs {first}"] = round(median / baseline, 3)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
