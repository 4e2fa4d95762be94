"""A draft's step beside its target in one process: what the target's threads do between its
passes changes what the draft's step costs.

    python benchmarks/draft_beside_target.py TARGET_BUNDLE DRAFT_BUNDLE [--repeats 2]

Each mode runs in its own process (a global thread pool is set once per process), the modes
in turn, ``--repeats`` times: the target (2 threads, spinning) and the draft (2 threads,
sleeping between kernels) after 64 tokens of context, then 25 rounds of four draft steps, a
5-token verify pass and a one-token target step, both caches cropped back after each; the
medians of the last 22 rounds. Modes:

- ``spin``: the target's threads spin on after its pass (ONNX Runtime's default);
- ``stop``: both sessions set ``session.force_spinning_stop`` (what edgespec sets beside a
  threaded draft: ``ModelOptions.stop_spinning_after_run``);
- ``global``: one global thread pool of 2 threads for both sessions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import harness

MODES = ("spin", "stop", "global")


def one_mode(mode: str, target_path: str, draft_path: str) -> dict[str, float]:
    import onnxruntime

    if mode == "global":
        onnxruntime.set_global_thread_pool_sizes(2, 1)
        session_options = onnxruntime.SessionOptions

        class Shared(session_options):  # type: ignore[misc, valid-type]
            def __init__(self) -> None:
                super().__init__()
                self.use_per_session_threads = False

        onnxruntime.SessionOptions = Shared
    from edgespec.manifest import load_bundle
    from edgespec.runtime.model import ModelOptions, OnnxModel

    stop = mode == "stop"
    target = OnnxModel(
        load_bundle(target_path),
        options=ModelOptions(intra_op_threads=2, spinning=True, stop_spinning_after_run=stop),
    )
    draft = OnnxModel(
        load_bundle(draft_path),
        options=ModelOptions(intra_op_threads=2, exact_passes=False, stop_spinning_after_run=stop),
    )
    target_cache, draft_cache = target.new_cache(), draft.new_cache()
    context = list(range(1000, 1064))
    target.forward(context, target_cache)
    draft.forward(context, draft_cache)
    steps: list[float] = []
    verifies: list[float] = []
    target_steps: list[float] = []
    for round_index in range(25):
        started = time.perf_counter()
        for j in range(4):
            draft.forward([2000 + round_index + j], draft_cache, last_only=True)
        drafted = time.perf_counter()
        target.forward([2000 + round_index + j for j in range(5)], target_cache)
        verified = time.perf_counter()
        target.forward([3000 + round_index], target_cache)
        stepped = time.perf_counter()
        draft_cache.crop(len(context))
        target_cache.crop(len(context))
        if round_index >= 3:
            steps.append((drafted - started) / 4)
            verifies.append(verified - drafted)
            target_steps.append(stepped - verified)
    return {
        "draft_step_ms": 1e3 * statistics.median(steps),
        "verify5_ms": 1e3 * statistics.median(verifies),
        "target_step_ms": 1e3 * statistics.median(target_steps),
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, repeats=2, jsonl=False)
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one child run
    args = parser.parse_args()
    if args.mode:
        print(json.dumps({"mode": args.mode, **one_mode(args.mode, args.target, args.draft)}))
        return
    for _ in range(args.repeats):
        for mode in MODES:
            child = [sys.executable, __file__, args.target, args.draft, "--mode", mode]
            print(subprocess.run(child, check=True, capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
