"""The combined drafter at another git revision against this checkout's, in one process:
target-only decoding, the baseline and the current drafter take turns prompt by prompt.

    python benchmarks/combined_versions.py --baseline REV [--model NAME] [--temperature 0.7]
        [--sets code,chat-edit,chat] [--tokens 64] [--baseline-auto-k]

The baseline's ``runtime/drafters/combined.py`` is read with ``git show REV:...`` and loaded
beside the current module; both are built from the engine's own draft model and costs.
``--baseline-auto-k`` wraps the baseline in AutoK when k is "auto" (how revisions before the
combined drafter priced its own rounds ran it). Prints per set each one's decode tok/s, its
ratio to target-only and how many outputs equal target-only (greedy, or ``match`` sampling
with the same seed).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from edgespec.api import Engine
from edgespec.engine import assembly
from edgespec.measure.bench import load_prompt_set

import harness

ROOT = Path(__file__).resolve().parent.parent


def baseline_factory(revision: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{revision}:runtime/drafters/combined.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "combined_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("combined_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return lambda source: module.CombinedDrafter(
        assembly._model_drafter(source), costs=source.costs
    )


def main() -> None:
    parser = harness.argument_parser(__doc__, threads=2, tokens=64, jsonl=False)
    parser.add_argument("--baseline", required=True, help="a git revision")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--sets", default="code,chat-edit,chat")
    parser.add_argument("--baseline-auto-k", action="store_true")
    args = parser.parse_args()
    factories = {
        "baseline": baseline_factory(args.baseline),
        "current": assembly.DRAFTERS["combined"],
    }
    current_k_policy = assembly.k_policy

    def auto_k_policy(options: Any, *, drafter_name: str, **rest: Any) -> Any:
        name = "model" if drafter_name == "combined" else drafter_name  # AutoK's branch
        return current_k_policy(options, drafter_name=name, **rest)

    engine = Engine.load(model=args.model, threads=args.threads, measure_energy=False)
    runs = ("target-only", "baseline", "current")

    def generate(run: str, prompt: str, chat: bool) -> Any:
        if run != "target-only":
            assembly.DRAFTERS["combined"] = factories[run]
        baseline_k = run == "baseline" and args.baseline_auto_k
        assembly.k_policy = auto_k_policy if baseline_k else current_k_policy
        drafter = "none" if run == "target-only" else "combined"
        return engine.generate(
            prompt,
            drafter=drafter,
            chat=chat,
            max_new_tokens=args.tokens,
            temperature=args.temperature,
            seed=0,
        )

    for name in args.sets.split(","):
        prompt_set = load_prompt_set(name)
        tokens = dict.fromkeys(runs, 0)
        seconds = dict.fromkeys(runs, 0.0)
        equal = 0
        for run in runs:  # each run's first use loads what it needs
            generate(run, prompt_set.prompts[0], prompt_set.chat)
        for index, prompt in enumerate(prompt_set.prompts):
            order = runs if index % 2 == 0 else ("target-only", "current", "baseline")
            outputs = {}
            for run in order:
                result = generate(run, prompt, prompt_set.chat)
                tokens[run] += result.stats.new_tokens
                seconds[run] += result.stats.decode_ms / 1e3
                outputs[run] = result.tokens
            equal += outputs["baseline"] == outputs["current"] == outputs["target-only"]
        base = tokens["target-only"] / seconds["target-only"]
        speeds = {run: tokens[run] / seconds[run] for run in runs}
        rates = ", ".join(
            f"{run} {speed:.1f} tok/s ({speed / base:.3f}x)" for run, speed in speeds.items()
        )
        print(f"{name}, T={args.temperature}: {rates}; equal {equal}/{len(prompt_set.prompts)}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
