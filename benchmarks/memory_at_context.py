"""Peak resident memory of one generation after a long context, against the manifest estimate.

    python benchmarks/memory_at_context.py BUNDLE [--context 3000] [--tokens 32]

Loads the bundle alone (one process per run: the peak is the process's), decodes ``--tokens``
tokens with prompt lookup after ``--context`` tokens of this repository's README (repeated),
and prints the peak RSS beside what admission estimates for that context
(:mod:`edgespec.telemetry.estimate`: weights, two copies of the KV cache, a whole-context
prefill's logits, 25% margin, the process's base).
"""

from __future__ import annotations

import argparse
import json
import resource
from pathlib import Path

from edgespec.api import Engine
from edgespec.manifest import load_bundle
from edgespec.telemetry.estimate import estimate_pair
from edgespec.telemetry.memory import MemoryProbe, base_rss_bytes
from edgespec.telemetry.sysfs import Tree

MIB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--context", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    base = base_rss_bytes(MemoryProbe(Tree("/")))
    estimate = estimate_pair(
        load_bundle(args.bundle), None, base_bytes=base, context=args.context + args.tokens
    )
    engine = Engine.load(target=args.bundle, threads=args.threads, measure_energy=False)
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    prompt = engine.encode(text * 20)[: args.context]
    result = engine.generate(prompt, drafter="ngram", max_new_tokens=args.tokens)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    line = {
        "bundle": str(args.bundle),
        "context": len(prompt),
        "new_tokens": result.stats.new_tokens,
        "peak_rss_mb": round(peak / MIB, 1),
        "estimate_mb": round(estimate.total_bytes / MIB, 1),
        "within_estimate": peak <= estimate.total_bytes,
    }
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
