"""Draft bundles of one model in different forms, side by side: their step, and the pair.

    python benchmarks/draft_forms.py TARGET DRAFT [DRAFT ...] [--prompts 4] [--tokens 64]

First, each draft's one-token steps (unpadded, as the runtime runs a draft; 2 threads) after
64 and after 500 positions, each cropped back, the drafts in turn in blocks of 12 (the first
2 of a block dropped), six blocks each: median and least milliseconds. Then the pair: TARGET
with each draft at k 3, greedy, the drafts in turn on each of the first ``--prompts`` code and
chat prompts; acceptance (accepted / tested) and decode tok/s over the set, every output
checked equal across the drafts (each equals target-only decoding).

Make the forms with ``edgespec export`` (``--attention plain|kernel``) from the draft's GGUF,
or from a reduced-head copy (``edgespec.export.draft_head.reduced_head_gguf``, whose
``requantize`` re-quantizes the layers' blocks).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from draft_step import alternating_steps

from edgespec.manifest import load_bundle
from edgespec.runtime.model import ModelOptions, OnnxModel

import harness


def draft_steps(drafts: list[str], contexts: tuple[int, ...] = (64, 500)) -> None:
    options = ModelOptions(intra_op_threads=2, exact_passes=False)
    models = {path: OnnxModel(load_bundle(path), options=options) for path in drafts}
    for positions in contexts:
        for path, found in alternating_steps(models, positions).items():
            print(
                f"{positions} positions: {Path(path).name}: step median "
                f"{statistics.median(found):.2f} ms, least {min(found):.2f} ms",
                flush=True,
            )


def pairs(target: str, drafts: list[str], prompts: int, tokens: int) -> None:
    from edgespec import Engine
    from edgespec.measure.bench import load_prompts

    engines = {
        path: Engine.load(target=target, draft=path, threads=2, measure_energy=False)
        for path in drafts
    }
    for prompt_set in ("code", "chat"):

        def run(path: str, prompt: str, chat: bool = prompt_set == "chat") -> Any:
            return engines[path].generate(
                prompt, max_new_tokens=tokens, drafter="model", k=3, chat=chat
            )

        rates, accepted = harness.Rates(), harness.Rates()  # accepted: over tested
        check = harness.OutputCheck(reference=drafts[0])
        texts = load_prompts(prompt_set)[:prompts]
        for turn in harness.alternate(drafts, texts, run):
            same = check.add({path: result.tokens for path, result in turn.results.items()})
            if not all(same.values()):
                differing = next(path for path, equal in same.items() if not equal)
                raise SystemExit(f"{differing} wrote other tokens than {drafts[0]}")
            for path, result in turn.results.items():
                stats = result.stats
                rates.add(path, stats.new_tokens, stats.decode_ms / 1e3)
                accepted.add(path, stats.accepted, stats.tested)
        for path in drafts:
            tested = max(accepted.seconds[path], 1)
            print(
                f"{prompt_set}: {Path(path).name}: acceptance "
                f"{accepted.tokens[path] / tested:.3f}, {rates.rate(path):.2f} tok/s",
                flush=True,
            )


def main() -> None:
    parser = harness.argument_parser(__doc__, part="paragraph", prompts=4, tokens=64, jsonl=False)
    parser.add_argument("target")
    parser.add_argument("drafts", nargs="+")
    args = parser.parse_args()
    draft_steps(args.drafts)
    pairs(args.target, args.drafts, args.prompts, args.tokens)


if __name__ == "__main__":
    main()
