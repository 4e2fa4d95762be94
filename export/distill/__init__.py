"""``edgespec distill TARGET --out DRAFT``: a small draft trained on its target's own outputs.

A draft pays only when it agrees with its target, and edge targets rarely have a smaller
sibling with the same tokenizer. So the draft is distilled (DistillSpec): the target continues
prompts greedily (on-policy data: speculation verifies along the target's greedy path), and
the draft learns the target's next-token distribution (its top ``TOP_K`` probabilities) at
every position of prompt and continuation (teacher-forced KL on the text too).

Stages, each resumable from the work directory (``OUT`` + ``.distill-work``):

1. **teacher**: the target as a teacher: a Hugging Face directory in torch, or a GGUF file
   (imported first, no torch needed for it) or a GGUF bundle run by ONNX Runtime;
2. **data**: prompts from the files given (text: token windows; JSONL: ``prompt`` or ``text``
   fields) or a built-in mix (the chat, chat-edit and code prompt sets), each continued by the
   teacher; saved every ``SAVE_EVERY`` samples;
3. **training**: a Llama draft (``--hidden``, ``--layers``...) with AdamW and a cosine
   schedule; checkpoints written atomically every ``CHECKPOINT_EVERY`` steps; ``--max-minutes``
   stops early and keeps the checkpoint;
4. **evaluation**: acceptance by draft position on held-out samples, simulating greedy
   speculation along the target's path (which is what greedy verification accepts);
5. **export**: the draft through ``edgespec export`` (fp32, verified), with the record of the
   distillation in ``manifest.extra["distillation"]``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.config import ExportConfig
from edgespec.errors import ConfigError
from edgespec.export.distill.config import DistillConfig, Log
from edgespec.export.distill.data import build_data
from edgespec.export.distill.teacher import Teacher, load_teacher
from edgespec.export.distill.train import (
    acceptance_by_position,
    frequent_tokens,
    new_draft,
    train,
)
from edgespec.manifest import Bundle

__all__ = ["DistillConfig", "distill", "export_draft", "record_costs"]


def distill(config: DistillConfig, *, log: Log) -> Bundle | Path:
    """Runs every stage (each resumed from the work directory) and exports the draft; with
    ``config.export_bundle`` False, returns the draft's GGUF (or Hugging Face directory)
    unimported."""
    from edgespec.export.bundle import check_output_free

    check_output_free(config.out.absolute(), force=config.force)
    try:
        config.work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot write the work directory {config.work_dir} ({error.strerror})",
            fix="pass an --out in a writable place",
        ) from error
    from edgespec.export.gguf.locate import is_gguf_source

    gguf_file_target = (
        is_gguf_source(config.target) and not (Path(config.target) / "manifest.json").is_file()
    )
    if config.output_vocabulary and not gguf_file_target:
        raise ConfigError(
            "--output-vocabulary needs a GGUF file as the target (the draft's reduced head "
            "is written into its GGUF)",
            fix="distil for the model's .gguf file, or leave --output-vocabulary out",
        )
    teacher = load_teacher(config, log)
    log(f"distill: teacher {teacher.description}, vocabulary {teacher.vocab_size}")
    arrays = build_data(config, teacher, log)
    tokenizer_config = _tokenizer_config(teacher)
    draft = new_draft(config, teacher, tokenizer_config)
    parameters = sum(p.numel() for p in draft.parameters())
    log(f"distill: draft {parameters / 1e6:.1f}M parameters")
    state = train(config, draft, arrays, log)
    kept = None
    if config.output_vocabulary:
        size = min(config.output_vocabulary, teacher.vocab_size)
        kept = frequent_tokens(config, arrays, size, tuple(teacher.eos_ids), teacher.vocab_size)
        log(f"distill: the draft's head scores {len(kept)} of {teacher.vocab_size} tokens")
    evaluation = acceptance_by_position(config, draft, arrays, kept)
    alpha = evaluation["alpha"]
    log(f"distill: held-out alpha {'n/a' if alpha is None else f'{alpha:.2f}'}")
    draft_dir = config.work_dir / "draft-hf"
    _save_draft(draft, teacher, draft_dir)
    record = {
        "target": str(config.target),
        "teacher": teacher.description,
        "data_sha256": _data_hash(arrays),
        "samples": config.samples,
        "prompt_tokens": config.prompt_tokens,
        "new_tokens": config.new_tokens,
        "corpus": [str(p) for p in config.corpus] or "built-in mix (templates x subjects)",
        "prompt_windows": int(arrays["window"].max()) + 1,
        "sampled_samples": int((arrays["repeat"] > 0).sum()),
        "steps": state.step,
        "steps_asked": config.steps,
        "stopped_early": state.stopped_early,
        "losses_every_25_steps": state.losses,
        "training_seconds": state.elapsed_s,
        "seed": config.seed,
        "device": config.device,
        "draft": {
            "parameters": parameters,
            "hidden": draft.config.hidden_size,
            "layers": draft.config.num_hidden_layers,
            "heads": draft.config.num_attention_heads,
            "kv_heads": draft.config.num_key_value_heads,
            "intermediate": draft.config.intermediate_size,
            "initialised_from": None if config.init is None else str(config.init),
        },
        "evaluation": evaluation,
        "output_vocabulary": None if kept is None else len(kept),
        "c": None,
        "recommended_k": None,
    }
    if not config.export_bundle:
        return _draft_file(config, draft_dir, record, log, kept)
    return export_draft(config, draft_dir, record, log, kept)


def export_draft(
    config: DistillConfig,
    draft_dir: Path,
    record: dict[str, Any],
    log: Log,
    kept: np.ndarray | None = None,
) -> Bundle:
    """The trained draft (a Hugging Face directory) as a verified bundle recording ``record``:
    for a GGUF target, through a Q8_0 GGUF of the draft and the GGUF importer (the target's
    graph kind, checked against llama.cpp); otherwise through the Hugging Face exporter."""
    from edgespec.export.gguf.pipeline import export_gguf
    from edgespec.export.pipeline import export_bundle

    extra = {"distillation": record}
    gguf_file = _draft_file(config, draft_dir, record, log, kept)
    if gguf_file.suffix == ".gguf":
        log(f"distill: importing {gguf_file.name} ...")
        return export_gguf(
            ExportConfig(model=str(gguf_file), out=config.out, force=config.force, extra=extra)
        )
    log("distill: exporting the draft ...")
    return export_bundle(
        ExportConfig(
            model=str(draft_dir), out=config.out, quant="fp32", force=config.force, extra=extra
        )
    )


def _draft_file(
    config: DistillConfig,
    draft_dir: Path,
    record: dict[str, Any],
    log: Log,
    kept: np.ndarray | None = None,
) -> Path:
    """For a GGUF target, the draft as a Q8_0 GGUF with ``record`` in its metadata (in the
    work directory; its head over the ``kept`` tokens when given); otherwise the Hugging Face
    directory as it is."""
    from edgespec.export.gguf.locate import gguf_path, is_gguf_source

    if not is_gguf_source(config.target) or (Path(config.target) / "manifest.json").is_file():
        return draft_dir
    from transformers import AutoModelForCausalLM

    from edgespec.export.distill.gguf_draft import DRAFT_QUANT, write_draft_gguf
    from edgespec.export.gguf.reader import open_gguf

    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    gguf_file = config.work_dir / f"{config.out.name}.{DRAFT_QUANT}.gguf"
    with gguf_path(config.target) as path:
        target = open_gguf(path)
        name = f"{target.architecture.name} draft"
        record["gguf_draft"] = {"file": gguf_file.name, "quant": DRAFT_QUANT}
        write_draft_gguf(draft, target, gguf_file, name=name, record=record, output_vocabulary=kept)
    log(f"distill: draft written as {gguf_file}")
    return gguf_file


def _tokenizer_config(teacher: Teacher) -> dict[str, Any]:
    path = teacher.tokenizer_dir / "tokenizer_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    manifest = teacher.tokenizer_dir / "manifest.json"
    if manifest.is_file():  # a bundle: its manifest has the ids
        spec = json.loads(manifest.read_text())["tokenizer"]
        config["bos_token_id"] = spec.get("bos_token_id")
        eos = spec.get("eos_token_ids") or []
        config["eos_token_id"] = eos[0] if eos else None
    return config


def _save_draft(draft: Any, teacher: Teacher, directory: Path) -> None:
    """The draft as a Hugging Face directory with the target's tokenizer files."""
    if directory.exists():
        shutil.rmtree(directory)
    draft.save_pretrained(directory)
    for name in ("tokenizer.json", "special_tokens_map.json"):
        source = teacher.tokenizer_dir / name
        if source.is_file():
            shutil.copyfile(source, directory / name)
    # The target's special tokens and nothing else: a Llama config would otherwise make
    # transformers load a Llama tokenizer class, which adds its default "<unk>".
    config = _tokenizer_config(teacher)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _data_hash(arrays: dict[str, np.ndarray]) -> str:
    return hashlib.sha256(arrays["tokens"].tobytes()).hexdigest()


def record_costs(bundle_dir: Path, costs: dict[str, Any]) -> None:
    """Adds measured costs (c, recommended k) to the draft's distillation record, atomically."""
    path = bundle_dir / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["extra"]["distillation"].update(costs)
    scratch = path.with_name(path.name + ".partial")
    scratch.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(scratch, path)
