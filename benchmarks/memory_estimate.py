"""The memory estimate against the measured peak resident memory, per catalog model and pair.

    python benchmarks/memory_estimate.py [--models smollm2-135m,qwen2.5-coder-1.5b]
        [--contexts 256,1024,full] [--kernels gguf,mlas] [--tokens 32] [--bundles DIR,...]

Each case runs in a fresh process (the peak is the process's): it loads the model, or the
model and its catalog draft ("NAME+draft"), or with its head and no draft ("NAME+head": the
shipped head, or ``--head NAME=DIR``), exactly as ``Engine.load(model=NAME)`` does, feeds
a prompt of ``context - tokens`` tokens (this repository's README, repeated) and decodes
``tokens`` more, so the session ends at ``context`` tokens; "full" is the bundle's context
limit. It prints one JSON line per case: the estimate admission uses
(:mod:`edgespec.telemetry.estimate`) at that context, the peak RSS (VmHWM), their ratio, and
whether the ratio lies in the band the estimate promises (-10 % / +25 % of the peak).

``--kernels mlas`` imports each model's GGUF with ``--kernels mlas`` (ONNX Runtime's
MatMulNBits instead of edgespec's GGUF kernels) into ``~/.cache/edgespec/bench`` once, and
measures the model alone (prompt lookup drafts): a pair's estimate is the sum of its models'
terms and one process base, which the default path's pairs check. ``--bundles`` measures
bundle directories alone instead of catalog models.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
#: The band the estimate must stay in: estimate / measured peak.
LOW, HIGH = 0.90, 1.25


def measure_one(case: dict[str, object]) -> dict[str, object]:
    """Loads, prefills, decodes; the estimate and the peak of this process."""
    from edgespec.api import Engine
    from edgespec.telemetry.memory import MemoryProbe

    probe = MemoryProbe()
    load: dict[str, object] = {"threads": 2, "measure_energy": False}
    if case["target"]:
        load |= {"target": case["target"], "draft": case.get("draft")}
    else:
        load["model"] = case["model"]
    if case.get("drafter") == "head":
        load |= {"drafter": "head", "head": case.get("head")}
    engine = Engine.load(**load)  # type: ignore[arg-type]
    context = int(case["context"]) if case["context"] != "full" else engine.max_length
    tokens = int(case["tokens"])  # type: ignore[call-overload]
    after_load = probe.rss_bytes() or 0
    # The README encoded once and its tokens repeated: encoding a long text takes the
    # tokenizer memory of its own, which is the benchmark's, not the engine's.
    once = engine.encode((ROOT / "README.md").read_text(encoding="utf-8"))
    prompt = (once * (context // len(once) + 1))[: context - tokens]
    options = {"max_new_tokens": tokens}
    if case.get("drafter") == "head":
        options["drafter"] = "head"  # type: ignore[assignment]
    elif engine.draft is None:
        options["drafter"] = "ngram"  # type: ignore[assignment]
    result = engine.generate(prompt, **options)
    peak = probe.snapshot().peak_rss_bytes or 0
    estimate = engine.pair.admission.estimate
    expected = estimate.at(context)
    return {
        "case": case["label"],
        "kernels": case["kernels"],
        "context": context,
        "new_tokens": result.stats.new_tokens,
        "base_mb": round(estimate.base_bytes / MIB, 1),
        "after_load_mb": round(after_load / MIB, 1),
        "peak_rss_mb": round(peak / MIB, 1),
        "estimate_mb": round(expected / MIB, 1),
        "ratio": round(expected / peak, 3),
        "in_band": LOW <= expected / peak <= HIGH,
    }


def mlas_bundle(name: str) -> Path:
    """``name``'s GGUF imported with ONNX Runtime's MatMulNBits, cached for the benchmark."""
    from edgespec.models import catalog
    from edgespec.models.fetch import gguf_file
    from edgespec.models.store import cache_dir

    model = catalog.find(name)
    out = cache_dir() / "bench" / f"{name}-mlas"
    if (out / "manifest.json").is_file():
        return out
    source = gguf_file(model)
    print(f"importing {name} with --kernels mlas into {out} ...", file=sys.stderr, flush=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "edgespec",
            "export",
            str(source),
            "--out",
            str(out),
            "--kernels",
            "mlas",
            "--quiet",
            "--force",
        ],
        check=True,
        stdout=subprocess.DEVNULL,  # its summary; this script's stdout is JSON lines
    )
    return out


def cases(
    models: list[str],
    contexts: list[str],
    kernels: list[str],
    tokens: int,
    heads: dict[str, str] | None = None,
) -> list[dict]:
    found = []
    for kind in kernels:
        for entry in models:
            name, _, with_draft = entry.partition("+")
            if kind == "mlas" and with_draft:
                continue
            for context in contexts:
                case: dict[str, object] = {
                    "label": entry,
                    "model": name,
                    "kernels": kind,
                    "context": context,
                    "tokens": tokens,
                    "target": None,
                }
                if with_draft == "head":
                    case |= {"drafter": "head", "head": (heads or {}).get(name)}
                if kind == "mlas":
                    case["target"] = str(mlas_bundle(name))
                elif not with_draft:
                    case["target"] = str(_bundle_root(name))
                found.append(case)
    return found


def _bundle_root(name: str) -> Path:
    from edgespec.models import catalog
    from edgespec.models.bundles import model_bundle

    return model_bundle(catalog.find(name)).root


def main() -> None:
    parser = harness.argument_parser(__doc__, tokens=32, jsonl=False)
    parser.add_argument(
        "--models",
        default="smollm2-135m+draft,smollm2-135m,qwen2.5-coder-1.5b+draft,qwen2.5-coder-1.5b,"
        "qwen2.5-coder-0.5b,gemma3-270m",
        help="catalog names; NAME+draft loads the model with its catalog draft",
    )
    parser.add_argument("--contexts", default="256,1024,full")
    parser.add_argument("--kernels", default="gguf,mlas")
    parser.add_argument("--bundles", help="bundle directories to measure instead (comma list)")
    parser.add_argument(
        "--head", nargs="*", default=[], metavar="NAME=DIR", help="a head bundle for NAME+head"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(json.loads(args.one))), flush=True)
        return
    contexts = args.contexts.split(",")
    if args.bundles:
        chosen = [
            {"label": path, "model": None, "kernels": "bundle", "context": context,
             "tokens": args.tokens, "target": path}
            for path in args.bundles.split(",")
            for context in contexts
        ]  # fmt: skip
    else:
        heads = dict(spec.split("=", 1) for spec in args.head)
        chosen = cases(
            args.models.split(","), contexts, args.kernels.split(","), args.tokens, heads
        )
    for case in chosen:
        child = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(case)],
            capture_output=True,
            text=True,
            env={
                k: v
                for k, v in os.environ.items()
                if k not in ("EDGESPEC_TARGET", "EDGESPEC_DRAFT")
            },
        )
        if child.returncode != 0:
            print(
                json.dumps(
                    {
                        "case": case["label"],
                        "context": case["context"],
                        "error": child.stderr.strip().splitlines()[-1:],
                    }
                ),
                flush=True,
            )
            continue
        print(child.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
