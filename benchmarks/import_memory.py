"""Peak memory of ``edgespec export FILE.gguf``, stage by stage, and the bundle's size.

    python benchmarks/import_memory.py FILE.gguf [--out DIR] [--interval 0.05] [--json OUT]
                                       [-- EXTRA EXPORT ARGUMENTS]

Runs ``python -m edgespec export FILE.gguf --out DIR --force`` in a subprocess (with
``EDGESPEC_SKIP_MEMORY_CHECK=1``, so the importer's own estimate does not refuse the run being
measured), samples its RSS and its children's (the llama.cpp check runs in a child process),
summed, every ``--interval`` seconds and reads its progress lines: each stage's peak RSS is the
highest sample between its line and the next. RSS counts the pages of the GGUF that are mapped
and resident (file-backed, the ``shared`` column) as well as the processes' own
(``anonymous``). Then prints the peak, the peak over the file's size, the bundle's
weight bytes over the file's size, and the manifest's parameter count and checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from edgespec.export.gguf.memory import process_tree_memory

import harness

MB = 1024 * 1024


def measure(gguf: Path, out: Path, interval: float, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "edgespec", "export", str(gguf), "--out", str(out)]
    command += ["--force", *extra]
    environment = {**os.environ, "EDGESPEC_SKIP_MEMORY_CHECK": "1"}
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=environment
    )
    watched = psutil.Process(process.pid)
    stages: list[dict[str, Any]] = [
        {"stage": "start", "at_s": 0.0, "peak_rss": 0, "peak_shared": 0, "peak_anonymous": 0}
    ]
    lines: list[str] = []

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append(line.rstrip())
            label = line.strip()
            if label:
                stages.append(
                    {
                        "stage": label,
                        "at_s": round(time.perf_counter() - started, 1),
                        "peak_rss": 0,
                        "peak_shared": 0,
                        "peak_anonymous": 0,
                    }
                )

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while process.poll() is None:
        try:
            rss, shared = process_tree_memory(watched)
        except psutil.NoSuchProcess:
            break
        current = stages[-1]
        current["peak_rss"] = max(current["peak_rss"], rss)
        current["peak_shared"] = max(current["peak_shared"], shared)
        current["peak_anonymous"] = max(current["peak_anonymous"], rss - shared)
        time.sleep(interval)
    reader.join()
    elapsed = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit("export failed:\n" + "\n".join(lines[-20:]))
    manifest = json.loads((out / "manifest.json").read_text())
    file_bytes = gguf.stat().st_size
    weight_bytes = manifest["memory"]["weight_bytes"]
    peak = max(stage["peak_rss"] for stage in stages)
    verification = manifest["verification"]
    return {
        "file": gguf.name,
        "file_mb": round(file_bytes / MB, 1),
        "seconds": round(elapsed, 1),
        "peak_rss_mb": round(peak / MB),
        "peak_over_file": round(peak / file_bytes, 2),
        "peak_minus_file_mb": round((peak - file_bytes) / MB),
        "bundle_weights_mb": round(weight_bytes / MB, 1),
        "bundle_over_file": round(weight_bytes / file_bytes, 3),
        "parameters": manifest["model"]["parameters"],
        "parity_top1": verification["parity"]["top1_agreement"],
        "batch_invariance_max_dlogit": verification["batch_invariance"]["max_abs_logit_diff"],
        "batch_invariance_passed": verification["batch_invariance"]["passed"],
        "llama_cpp_agreement": manifest["extra"].get("llama_cpp_agreement"),
        "grid_kept": manifest["extra"]["gguf"]["grid_kept"],
        "requantized_types": manifest["extra"]["gguf"]["requantized_types"],
        "stages": [
            {
                "stage": stage["stage"],
                "at_s": stage["at_s"],
                "peak_rss_mb": round(stage["peak_rss"] / MB),
                "peak_shared_mb": round(stage["peak_shared"] / MB),
                "peak_anonymous_mb": round(stage["peak_anonymous"] / MB),
            }
            for stage in stages
        ],
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, part="paragraph", jsonl=False)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="bundle directory (default: temp)")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between samples")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    # Everything after "--" goes to the export as it stands (argparse would take it for this
    # script's own positionals).
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.extra = argv[split + 1 :]
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch) / "bundle"
        result = measure(args.gguf, out, args.interval, args.extra)
    for stage in result["stages"]:
        print(
            f"{stage['at_s']:7.1f} s  peak {stage['peak_rss_mb']:6d} MB "
            f"(shared {stage['peak_shared_mb']:5d}, anonymous {stage['peak_anonymous_mb']:6d})  "
            f"{stage['stage']}"
        )
    summary = {k: v for k, v in result.items() if k != "stages"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
