"""Gives a trained draft GGUF a reduced output vocabulary: its head scores only the N tokens
its target writes most, counted over the target's greedy answers to the distillation's
built-in prompt mix (chat requests, code tasks, edit requests), then by id.

    python tools/reduce_draft_vocabulary.py DRAFT.gguf --out SMALL.gguf --size 8192 \\
        [--target BUNDLE] [--counts counts.npy]

The head's rows are the draft's tied embedding rows of those tokens, byte for byte, so the
kept tokens' logits do not change; the draft never proposes the others. ``--target``
defaults to the default model; ``--counts`` caches the counts (made once, a few minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

#: Edit requests in the counted mix (beside every built-in chat request and code task).
EDIT_REQUESTS = 200
NEW_TOKENS = 128


def count_target_tokens(target: Path | None, vocab_size: int) -> np.ndarray:
    from edgespec.api import Engine
    from edgespec.export.distill.config import (
        BUILTIN_CODE_TASKS,
        BUILTIN_SUBJECTS,
        BUILTIN_TEMPLATES,
    )
    from edgespec.export.distill.edit_prompts import edit_requests

    requests = [t.format(s) for t in BUILTIN_TEMPLATES for s in BUILTIN_SUBJECTS]
    requests += [f"Write a Python function that {task}." for task in BUILTIN_CODE_TASKS]
    requests += edit_requests(EDIT_REQUESTS, seed=0)
    engine = Engine.load(target=target, measure_energy=False)
    counts = np.zeros(vocab_size, np.int64)
    started = time.monotonic()
    for index, request in enumerate(requests, 1):
        for token in engine.generate(request, chat=True, max_new_tokens=NEW_TOKENS).tokens:
            counts[token] += 1
        if index % 25 == 0 or index == len(requests):
            print(
                f"counted {index}/{len(requests)} answers "
                f"({time.monotonic() - started:.0f} s, {int(counts.sum())} tokens)",
                file=sys.stderr,
                flush=True,
            )
    return counts


def main() -> int:
    from edgespec.export.distill.gguf_draft import read_record, reduce_output_vocabulary
    from edgespec.export.gguf.reader import open_gguf
    from edgespec.export.gguf.tokenizer import build_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--counts", type=Path, default=None, help="cache of the counts (.npy)")
    args = parser.parse_args()
    draft = open_gguf(args.draft)
    vocab = draft.architecture.vocab_size
    if args.counts is not None and args.counts.is_file():
        counts = np.load(args.counts)
    else:
        counts = count_target_tokens(args.target, vocab)
        if args.counts is not None:
            np.save(args.counts, counts)
    always = [int(t) for t in build_tokenizer(draft).eos_token_ids]
    order = np.lexsort((np.arange(vocab), -counts))  # by count, then by id
    kept = np.array(sorted(list(dict.fromkeys([*always, *map(int, order)]))[: args.size]), np.int64)
    record = read_record(args.draft) or {}
    covered = float(counts[kept].sum() / max(int(counts.sum()), 1))
    record["output_vocabulary"] = len(kept)
    record["output_vocabulary_made_by"] = (
        f"tools/reduce_draft_vocabulary.py --size {args.size}: the target's greedy answers "
        f"to the built-in mix ({int(counts.sum())} tokens), covering {covered:.2%} of them"
    )
    reduce_output_vocabulary(args.draft, args.out, kept, record)
    print(json.dumps({"out": str(args.out), "kept": len(kept), "coverage": round(covered, 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
