"""Build the toy draft/target pair the tests use (``tests/fixtures/toy_pair``): a 19M target
and a 2.6M draft trained here, which show the mechanism quickly but write poor text.

    python tools/build_toy_pair.py [--work build/toy_pair] [--device cpu|cuda]
                                       [--until trained|exported|installed]

Stages (each skipped when its output exists in the work directory, so a rerun resumes):
1. corpus: the Python standard library's own source files, whole files held out for
   validation (one in ``validation_share`` by path hash); the corpus hash is recorded;
2. tokenizer: byte-level BPE trained with ``tokenizers`` on the training files;
3. training: a Llama target (~19M parameters) on next-token loss while a Llama draft (~2.6M)
   is distilled from it (KL to the target's logits), then distillation against the final
   target; checkpoints every 50 steps, resumed automatically;
4. export: ``edgespec export`` of the target in each candidate quantization and of the draft;
5. selection: target-only and speculative decoding measured on the benchmark prompts for each
   target quantization that passed the export checks; the fastest exact speculative
   configuration is installed into the package data with the build record in the manifests'
   ``extra`` field, and the table is written to ``WORK/table.md``.

Not run by CI: hours on a 2-core CPU (docs/benchmarks/toy-pair.md, "The toy pair"), minutes
with ``--device cuda``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from on_policy import distill_on_policy
from train_pair import (
    TrainSettings,
    split_corpus,
    token_arrays,
    train_pair,
    train_tokenizer,
    validate,
)

REPO = Path(__file__).resolve().parents[1]


def _logger(work: Path):  # type: ignore[no-untyped-def]
    log_file = (work / "build.log").open("a")

    def log(line: str) -> None:
        stamped = f"{time.strftime('%H:%M:%S')} {line}"
        print(stamped, flush=True)
        log_file.write(stamped + "\n")
        log_file.flush()

    return log


def stage_train(work: Path, settings: TrainSettings, *, device: str, log) -> dict:  # type: ignore[no-untyped-def]
    """Corpus → tokenizer → training → Hugging Face model directories and a record."""
    record_path = work / "training.json"
    if record_path.exists() and (work / "hf" / "target").exists():
        return dict(json.loads(record_path.read_text()))
    import torch

    torch.set_num_threads(torch.get_num_threads())
    corpus = split_corpus(work, settings)
    log(
        f"corpus: {len(corpus['train_files'])} training files, "
        f"{len(corpus['validation_files'])} held out"
    )
    tokenizer_dir = train_tokenizer(work, corpus, settings)
    arrays = token_arrays(work, corpus, tokenizer_dir)
    log(f"tokens: {len(arrays['train'])} train, {len(arrays['validation'])} validation")
    models = train_pair(work, arrays, settings, device=device, log=log)
    metrics = validate(models, arrays, settings, device=device)
    log(f"validation: {metrics}")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    for role in ("target", "draft"):
        out = work / "hf" / role
        models[role].to("cpu").save_pretrained(out)
        tokenizer.save_pretrained(out)
    record = {
        "settings": asdict(settings),
        "device": device,
        "torch": torch.__version__,
        "corpus": {k: v for k, v in corpus.items() if not k.endswith("_files")}
        | {
            "train_files": len(corpus["train_files"]),
            "validation_files": len(corpus["validation_files"]),
        },
        "tokens": {"train": len(arrays["train"]), "validation": len(arrays["validation"])},
        "parameters": {
            role: sum(p.numel() for p in models[role].parameters()) for role in ("target", "draft")
        },
        "train_seconds": round(models["train_seconds"], 1),
        "validation": metrics,
    }
    record_path.write_text(json.dumps(record, indent=1))
    return record


def stage_on_policy(work: Path, settings: TrainSettings, record: dict, *, device: str, log) -> dict:  # type: ignore[no-untyped-def]
    """On-policy draft distillation; replaces ``hf/draft`` and adds to the training record."""
    if "on_policy" in record:
        return record
    corpus = split_corpus(work, settings)
    arrays = token_arrays(work, corpus, work / "tokenizer")
    models = distill_on_policy(work, arrays, settings, device=device, log=log)
    metrics = validate(models, arrays, settings, device=device)
    log(f"validation after on-policy distillation: {metrics}")
    models["draft"].to("cpu").save_pretrained(work / "hf" / "draft")
    record = {
        **record,
        "on_policy": {"seconds": round(models["seconds"], 1), "validation": metrics},
        "validation": metrics,
    }
    (work / "training.json").write_text(json.dumps(record, indent=1))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work", type=Path, default=REPO / "build" / "default_pair")
    parser.add_argument("--device", default="cpu", help="torch device for training: cpu or cuda")
    parser.add_argument(
        "--until", default="installed", choices=("trained", "exported", "installed")
    )
    parser.add_argument("--target-steps", type=int, default=TrainSettings.target_steps)
    parser.add_argument("--distill-steps", type=int, default=TrainSettings.distill_steps)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script in minutes: 2+2 training steps, two candidates, two prompts, "
        "installed into WORK/installed (default work dir build/smoke_pair)",
    )
    args = parser.parse_args()
    if args.smoke and args.work == REPO / "build" / "default_pair":
        args.work = REPO / "build" / "smoke_pair"
    args.work.mkdir(parents=True, exist_ok=True)
    log = _logger(args.work)
    steps = (2, 2) if args.smoke else (args.target_steps, args.distill_steps)
    settings = TrainSettings(target_steps=steps[0], distill_steps=steps[1])
    record = stage_train(args.work, settings, device=args.device, log=log)
    log(f"trained: {json.dumps(record['validation'])}")
    record = stage_on_policy(args.work, settings, record, device=args.device, log=log)
    if args.until == "trained":
        return
    from build_select import SelectSettings, stage_export, stage_install

    select = SelectSettings.smoke(args.work) if args.smoke else SelectSettings()
    exported = stage_export(args.work, select, log=log)
    if args.until == "exported":
        return
    stage_install(args.work, record, exported, select, log=log)


if __name__ == "__main__":
    main()
