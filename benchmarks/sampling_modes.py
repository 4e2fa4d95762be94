"""Sampled speculation's two exact modes against target-only sampling, on one catalog pair:
tok/s, acceptance and whether each output equals target-only sampling's.

    python benchmarks/sampling_modes.py [--model qwen2.5-coder-1.5b] [--prompts 4]
        [--temperature 0.7] [--tokens 64] [--threads 2]

For each prompt of the code, code-edit and chat sets (the peers benchmark's prompts), target-only
decoding, ``rejection`` and ``match`` take turns, each with the pair's own drafter and k (its
stored choice) and the same seed. Prints one line per prompt, then per set each mode's decode
tok/s over the set, its ratio to target-only and its mean acceptance. ``match`` draws every
position the way target-only sampling does, so its text is target-only's and the ratio
compares like with like; rejection's text differs, so its ratio carries the noise of other
texts.
"""

from __future__ import annotations

import statistics
from typing import Any

from llama_cpp_peers import prompt_sets

from edgespec.api import Engine

import harness

MODES = {"target-only": {"drafter": "none"}, "rejection": {"sampling_mode": "rejection"}}
MODES["match"] = {"sampling_mode": "match"}


def main() -> None:
    parser = harness.argument_parser(__doc__, prompts=4, tokens=64, threads=2, jsonl=False)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--temperature", type=float, default=0.7)
    args = parser.parse_args()
    engine = Engine.load(model=args.model, threads=args.threads, measure_energy=False)
    sets = prompt_sets(engine, ["code", "edit", "chat"], args.prompts, 0)
    options: dict[str, Any] = {
        "max_new_tokens": args.tokens,
        "temperature": args.temperature,
        "seed": 0,
    }
    warm = sets["code"][0]
    for mode in MODES.values():  # each mode's first use loads what it needs
        engine.generate(warm, **{**options, "max_new_tokens": 8}, **mode)

    def run(mode: str, prompt: Any) -> Any:
        return engine.generate(prompt, **options, **MODES[mode])

    for name, prompts in sets.items():
        rates = harness.Rates()
        check = harness.OutputCheck(reference="target-only")
        alphas: dict[str, list[float]] = {mode: [] for mode in MODES}
        for turn in harness.alternate(list(MODES), prompts, run):
            for mode, result in turn.results.items():
                rates.add(mode, result.stats.new_tokens, result.stats.decode_ms / 1e3)
                if result.stats.alpha is not None:
                    alphas[mode].append(result.stats.alpha)
            same = check.add({mode: result.tokens for mode, result in turn.results.items()})
            print(f"{name} {turn.index}: match equals target-only: {same['match']}", flush=True)
        ratios = rates.ratios("target-only")
        summary = {
            mode: {
                "tok_s": round(rates.rate(mode), 2),
                "vs_target_only": round(ratios[mode], 3),
                "alpha": round(statistics.mean(alphas[mode]), 3) if alphas[mode] else None,
            }
            for mode in MODES
        }
        print(f"{name}: {summary}", flush=True)


if __name__ == "__main__":
    main()
