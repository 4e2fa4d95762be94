"""The default model's figures: first-use conversion, load time, a five-turn chat's peak RSS,
and speed and acceptance of the default configuration on chat and edit prompts.

    python benchmarks/default_model.py [--threads 2] [--tokens 128] [--json]

Uses a scratch cache (``--cache``, default a temporary directory) seeded with the model's GGUF
from the user's cache (``edgespec`` fetches it there on first use), so the conversion (the
model's, then its shipped draft's) is timed without the download. Then, each in a fresh
process: ``Engine.load()`` on the now-cached pair (three times; the median), a five-turn
``edgespec chat`` fed through a pipe (peak RSS of the process), and ``edgespec bench`` on the
``chat`` and ``chat-edit`` sets with the default drafter and k (target-only and speculative
runs alternate, greedy then T = 0.7).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgespec.models.catalog import default_model
from edgespec.models.store import cache_dir, source_path

import harness

FIVE_TURNS = [
    "Hi! My name is Ada and I like gardening.",
    "What vegetables are easy to grow on a balcony?",
    "How often should I water tomatoes?",
    "Write a haiku about my garden.",
    "What is my name?",
]
LOAD_SNIPPET = (
    "import time; t = time.perf_counter(); from edgespec import Engine; "
    "e = Engine.load(measure_energy=False); print(time.perf_counter() - t)"
)


def _env(cache: Path, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EDGESPEC_TARGET", "EDGESPEC_DRAFT")}
    return {**env, "EDGESPEC_CACHE": str(cache), "OMP_NUM_THREADS": str(threads)}


CONVERT_SNIPPET = (
    "import json, time; from pathlib import Path; "
    "from edgespec.models.bundles import draft_bundle, model_bundle; "
    "from edgespec.models.catalog import default_model; "
    "t = time.perf_counter(); b = model_bundle(default_model(), cache=Path({cache!r})); "
    "m = time.perf_counter(); d = draft_bundle(default_model(), cache=Path({cache!r})); "
    "print(json.dumps({{'seconds': m - t, 'draft_seconds': time.perf_counter() - m, "
    "'bundle_mb': sum(r.size for r in b.manifest.files) / 1e6, 'bundle': str(b.root), "
    "'draft_mb': sum(r.size for r in d.manifest.files) / 1e6 if d else None}}))"
)


def conversion(cache: Path, threads: int) -> dict[str, Any]:
    """Seeds ``cache`` with the model's kept file and converts it as the first use does, in a
    child process (this one stays small: see ``chat_peak_rss_mb``)."""
    kept = source_path(default_model(), cache_dir())
    if kept.is_file():
        source_path(default_model(), cache).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(kept, source_path(default_model(), cache))
    done = subprocess.run(
        [sys.executable, "-c", CONVERT_SNIPPET.format(cache=str(cache))],
        capture_output=True,
        text=True,
        check=True,
        env=_env(cache, threads),
    )
    return dict(json.loads(done.stdout))


def load_seconds(cache: Path, threads: int) -> float:
    runs = [
        float(
            subprocess.run(
                [sys.executable, "-c", LOAD_SNIPPET],
                capture_output=True,
                text=True,
                check=True,
                env=_env(cache, threads),
            ).stdout
        )
        for _ in range(3)
    ]
    return statistics.median(runs)


def chat_peak_rss_mb(cache: Path, threads: int) -> dict[str, Any]:
    """Peak RSS of a five-turn piped chat: that child's own ru_maxrss (os.wait4)."""
    command = [sys.executable, "-m", "edgespec", "chat", "--no-color", "--threads", str(threads)]
    process = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=_env(cache, threads),
    )
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("\n".join(FIVE_TURNS) + "\n")
    process.stdin.close()
    answers = process.stdout.read().strip().splitlines()
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"edgespec chat exited with {process.returncode}")
    return {"peak_rss_mb": usage.ru_maxrss * 1024 / 1e6, "answers": answers}


def bench(cache: Path, prompts: str, threads: int, tokens: int) -> dict[str, Any]:
    command = [
        *(sys.executable, "-m", "edgespec", "bench", "--prompts", prompts),
        *("--threads", str(threads), "--max-new-tokens", str(tokens), "--json"),
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, check=True, env=_env(cache, threads)
    )
    results = json.loads(done.stdout)
    keys = ("target_tokens_per_s", "speculative_tokens_per_s", "speedup", "alpha")
    return {
        "settings": results["settings"],
        "greedy": {k: results["greedy"][k] for k in (*keys, "identical_output", "new_tokens")},
        "sampling": {k: results["sampling"][k] for k in keys},
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=2, tokens=128, jsonl=False)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgespec-bench-cache-") as scratch:
        cache = args.cache or Path(scratch)
        report: dict[str, Any] = {"conversion": conversion(cache, args.threads)}
        report["five_turn_chat"] = chat_peak_rss_mb(cache, args.threads)
        report["load_s"] = load_seconds(cache, args.threads)
        for prompts in ("chat", "chat-edit"):
            report[prompts] = bench(cache, prompts, args.threads, args.tokens)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    converted = report["conversion"]
    print(
        f"first use   conversion {converted['seconds']:.0f} s, "
        f"bundle {converted['bundle_mb']:.0f} MB; its draft {converted['draft_seconds']:.0f} s, "
        f"{converted['draft_mb']:.0f} MB"
    )
    print(f"second use  Engine.load() {report['load_s']:.2f} s (median of 3 processes)")
    print(f"chat        five turns, peak RSS {report['five_turn_chat']['peak_rss_mb']:.0f} MB")
    for prompts in ("chat", "chat-edit"):
        greedy, sampled = report[prompts]["greedy"], report[prompts]["sampling"]
        print(
            f"{prompts:<11} greedy target {greedy['target_tokens_per_s']:.1f} tok/s, default "
            f"{greedy['speculative_tokens_per_s']:.1f} tok/s ({greedy['speedup']:.2f}x, alpha "
            f"{greedy['alpha']:.2f}, identical {greedy['identical_output']}); T=0.7 "
            f"{sampled['speedup']:.2f}x"
        )


if __name__ == "__main__":
    main()
