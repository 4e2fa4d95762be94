"""A pair on ONNX Runtime's CUDA provider against the same machine's CPU, greedy.

    python benchmarks/cuda_pair.py TARGET DRAFT [--tokens 96] [--no-cpu-draft] [--json OUT]

TARGET and DRAFT are bundles (a GGUF imported where CUDA is offered, or with ``--kernels
mlas``: edgespec's GGUF kernels are CPU code). Needs ``onnxruntime-gpu``. Six engines are
loaded (the target on the CPU alone and with the draft; on CUDA alone, with the draft on the
CPU, with the draft on CUDA, and with prompt lookup); each prompt runs on each engine in turn,
twice, and the table keeps each engine's best decode tok/s. Every CUDA engine's tokens are
compared with CUDA target-only decoding (exactness on the device), and each engine's first
token that differs from the CPU's target-only decoding is given (float16 attention on CUDA
rounds apart from float32 on the CPU). Then: the CUDA graph's batch invariance (widths 2-9),
the target step and verify curve T(w)/T(1) at 64 and 1,000 positions, and the GPU's memory.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import harness

CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
CPU = ["CPUExecutionProvider"]
PROMPTS = [
    ("code", "Write a Python function that merges overlapping intervals in a list.", False),
    ("chat", "What is the capital of France, and why is it famous?", True),
    (
        "edit",
        "Rewrite this function to use a list comprehension:\n\ndef squares(n):\n    out = []\n"
        "    for i in range(n):\n        out.append(i * i)\n    return out\n",
        True,
    ),
    ("story", "Tell me a short story about a robot who learns to paint.", True),
]


def gpu_memory() -> str:
    query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown (no nvidia-smi)"


def main() -> None:
    from edgespec import Engine
    from edgespec.export.invariance import check_batch_invariance
    from edgespec.runtime.costs import measure_costs

    parser = harness.argument_parser(__doc__, part="paragraph", tokens=96, jsonl=False)
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--no-cpu-draft", action="store_true", help="skip the CPU pair")
    parser.add_argument("--json", type=Path, help="write every run's tokens and stats here")
    args = parser.parse_args()
    configs = {
        "cpu target-only": (CPU, CPU, "none"),
        "cpu draft": (CPU, CPU, "model"),
        "cuda target-only": (CUDA, CPU, "none"),
        "cuda target, cpu draft": (CUDA, CPU, "model"),
        "cuda target, cuda draft": (CUDA, CUDA, "model"),
        "cuda prompt lookup": (CUDA, CPU, "ngram"),
    }
    if args.no_cpu_draft:
        del configs["cpu draft"]
    engines: dict[str, Any] = {}
    for name, (target_providers, draft_providers, _) in configs.items():
        started = time.perf_counter()
        engines[name] = Engine.load(
            target=args.target,
            draft=args.draft,
            target_providers=target_providers,
            draft_providers=draft_providers,
        )
        engine = engines[name]
        print(
            f"loaded {name} in {time.perf_counter() - started:.1f} s; KV "
            f"{engine.target.kv_dtype}; warnings {engine.warnings}; GPU {gpu_memory()}",
            flush=True,
        )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(2):
        for label, prompt, chat in PROMPTS:
            for name, (_, _, drafter) in configs.items():
                result = engines[name].generate(
                    prompt, max_new_tokens=args.tokens, chat=chat, drafter=drafter
                )
                stats = result.stats
                results.setdefault((name, label), []).append(
                    {
                        "tokens": list(result.tokens),
                        "text": result.text,
                        "tok_s": stats.tokens_per_s or 0.0,
                        "alpha": stats.alpha,
                        "prefill_ms": stats.prefill_ms,
                        "providers": stats.providers,
                    }
                )
    print(
        "\n| engine | set | tok/s (best of 2) | α | = CUDA target-only | first token unlike CPU's |"
    )
    for (name, label), runs in results.items():
        on_cuda = results[("cuda target-only", label)][0]["tokens"]
        on_cpu = results[("cpu target-only", label)][0]["tokens"]
        same = all(run["tokens"] == on_cuda for run in runs) if name.startswith("cuda") else "-"
        differs = next(
            (i for i, (a, b) in enumerate(zip(runs[0]["tokens"], on_cpu, strict=False)) if a != b),
            None,
        )
        alpha = runs[-1]["alpha"]
        print(
            f"| {name} | {label} | {max(run['tok_s'] for run in runs):.1f} | "
            f"{'-' if alpha is None else f'{alpha:.2f}'} | {same} | "
            f"{'none' if differs is None else differs} of {len(runs[0]['tokens'])} |",
            flush=True,
        )
    engine = engines["cuda target-only"]
    streams = [
        engine.encode(prompt)[:40] + results[("cuda target-only", label)][0]["tokens"][:60]
        for label, prompt, _ in PROMPTS[:3]
    ]
    invariance = check_batch_invariance(engine.target.driver, streams, prefill=16)
    print(
        f"CUDA batch invariance: passed {invariance.passed}, {invariance.positions} positions, "
        f"max |Δlogit| {invariance.max_abs_logit_diff:.3g}",
        flush=True,
    )
    for name in ("cpu target-only", "cuda target, cpu draft", "cuda target, cuda draft"):
        for context in (64, 1000):
            costs = measure_costs(
                engines[name].target, engines[name].draft, repeats=7, context_tokens=context
            )
            curve = ", ".join(f"{value:.2f}" for value in costs.verify_cost)
            print(
                f"{name}, {context} positions: step {costs.target_step_s * 1e3:.2f} ms, draft "
                f"step {costs.draft_step_s * 1e3:.2f} ms, T(w)/T(1) w=1..9: {curve}",
                flush=True,
            )
    print("GPU memory in use at the end:", gpu_memory())
    if args.json:
        args.json.write_text(json.dumps({f"{n}|{s}": runs for (n, s), runs in results.items()}))


if __name__ == "__main__":
    main()
