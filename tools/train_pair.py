"""Corpus, tokenizer and training for the built-in pair (used by ``build_default_pair.py``).

Needs the ``[export]`` extra (torch, transformers). Every stage writes its result into the
work directory and is skipped when that result exists, so an interrupted build resumes;
training itself checkpoints every ``checkpoint_every`` steps (atomic rename) and resumes from
the last checkpoint with the same batches it would have drawn (batches are seeded by step).
"""

from __future__ import annotations

import hashlib
import json
import math
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
# Directories of the standard library left out of the corpus: tests (huge generated data
# files), the IDLE GUI and the retired lib2to3 fixers, and third-party site-packages.
EXCLUDED_PARTS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})
CHAT_TEMPLATE = (
    "{% for message in messages %}<s>{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Everything that decides the trained weights; recorded in the manifests."""

    seed: int = 0
    vocab_size: int = 8192
    validation_share: int = 20  # one file in N (by path hash) is held out whole
    window: int = 128
    batch: int = 16
    target_steps: int = 1000
    target_lr: float = 1.5e-3
    draft_lr: float = 3e-3
    warmup_steps: int = 100
    distill_steps: int = 300
    distill_batch: int = 16
    checkpoint_every: int = 50
    target_hidden: int = 384
    target_layers: int = 8
    target_heads: int = 6
    target_kv_heads: int = 2
    target_intermediate: int = 1024
    draft_hidden: int = 128
    draft_layers: int = 2
    draft_heads: int = 4
    draft_kv_heads: int = 2
    draft_intermediate: int = 384
    max_positions: int = 1024
    onpolicy_steps: int = 250
    onpolicy_batch: int = 16
    onpolicy_prompt: int = 48
    onpolicy_new: int = 64
    onpolicy_lr: float = 1e-3


def stdlib_files(stdlib: Path | None = None) -> list[Path]:
    root = stdlib or Path(sysconfig.get_paths()["stdlib"])
    files = [
        path
        for path in sorted(root.rglob("*.py"))
        if not EXCLUDED_PARTS.intersection(path.relative_to(root).parts)
    ]
    return files


def split_corpus(work: Path, settings: TrainSettings) -> dict[str, Any]:
    """Held-out whole files for validation; returns (and writes) the corpus record."""
    record_path = work / "corpus.json"
    if record_path.exists():
        return dict(json.loads(record_path.read_text()))
    root = Path(sysconfig.get_paths()["stdlib"])
    train, validation = [], []
    digest = hashlib.sha256()
    for path in stdlib_files(root):
        relative = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        digest.update(relative.encode() + b"\0" + text.encode() + b"\0")
        bucket = int(hashlib.sha1(relative.encode()).hexdigest(), 16) % settings.validation_share
        (validation if bucket == 0 else train).append(relative)
    record = {
        # No machine path: the record ships in the manifests.
        "source": f"Python {sysconfig.get_python_version()} standard library",
        "licence": "PSF-2.0",
        "sha256": digest.hexdigest(),
        "train_files": train,
        "validation_files": validation,
    }
    record_path.write_text(json.dumps(record, indent=1))
    return record


def train_tokenizer(work: Path, corpus: dict[str, Any], settings: TrainSettings) -> Path:
    """A byte-level BPE tokenizer trained on the training files only."""
    out = work / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [
        (root / name).read_text(encoding="utf-8", errors="replace")
        for name in corpus["train_files"]
    ]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=settings.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return out


def token_arrays(work: Path, corpus: dict[str, Any], tokenizer_dir: Path) -> dict[str, np.ndarray]:
    """Each file as <s> tokens </s>, concatenated: uint16 arrays for train and validation."""
    arrays = {}
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    root = Path(sysconfig.get_paths()["stdlib"])
    for split in ("train", "validation"):
        path = work / f"{split}_ids.npy"
        if not path.exists():
            ids: list[int] = []
            for name in corpus[f"{split}_files"]:
                text = (root / name).read_text(encoding="utf-8", errors="replace")
                ids.extend(tokenizer.encode(text).ids)  # the post-processor adds <s>
                ids.append(1)
            np.save(path, np.asarray(ids, dtype=np.uint16))
        arrays[split] = np.load(path)
    return arrays


def llama_config(settings: TrainSettings, *, role: str) -> Any:
    from transformers import LlamaConfig

    size = {
        name: getattr(settings, f"{role}_{name}")
        for name in ("hidden", "layers", "heads", "kv_heads", "intermediate")
    }
    return LlamaConfig(
        vocab_size=settings.vocab_size,
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        max_position_embeddings=settings.max_positions,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
    )


def _windows(data: np.ndarray, *, batch: int, window: int, seed: int) -> Any:
    import torch

    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - window - 1, size=batch)
    return torch.from_numpy(np.stack([data[s : s + window] for s in starts]).astype(np.int64))


def _lr(step: int, total: int, *, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _kl(student_logits: Any, teacher_logits: Any) -> Any:
    """KL(teacher || student) per token, averaged; logits [batch, window, vocab]."""
    import torch.nn.functional as functional

    student = functional.log_softmax(student_logits.float(), dim=-1).flatten(0, 1)
    teacher = functional.log_softmax(teacher_logits.float(), dim=-1).flatten(0, 1)
    return functional.kl_div(student, teacher, log_target=True, reduction="batchmean")


def _optimizer_step(optimizer: Any, model: Any, loss: Any) -> None:
    """One AdamW step with gradients clipped to norm 1."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _save_atomically(state: dict[str, Any], path: Path) -> None:
    """A checkpoint is either whole or absent: written beside ``path``, then renamed."""
    import torch

    scratch = path.with_name(path.name + ".partial")
    torch.save(state, scratch)
    scratch.replace(path)


def train_pair(
    work: Path,
    arrays: dict[str, np.ndarray],
    settings: TrainSettings,
    *,
    device: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Target trained on next-token loss while the draft is distilled from it (KL to the
    target's logits, detached), then a distillation-only phase against the final target."""
    import torch
    from transformers import AutoModelForCausalLM

    final = work / "trained.pt"
    checkpoint = work / "checkpoint.pt"
    torch.manual_seed(settings.seed)
    target = AutoModelForCausalLM.from_config(llama_config(settings, role="target")).to(device)
    draft = AutoModelForCausalLM.from_config(llama_config(settings, role="draft")).to(device)
    target_opt = torch.optim.AdamW(target.parameters(), lr=settings.target_lr, weight_decay=0.1)
    draft_opt = torch.optim.AdamW(draft.parameters(), lr=settings.draft_lr, weight_decay=0.1)
    total = settings.target_steps + settings.distill_steps
    step, elapsed = 0, 0.0
    source = final if final.exists() else checkpoint if checkpoint.exists() else None
    if source is not None:
        state = torch.load(source, map_location=device, weights_only=False)
        target.load_state_dict(state["target"])
        draft.load_state_dict(state["draft"])
        target_opt.load_state_dict(state["target_opt"])
        draft_opt.load_state_dict(state["draft_opt"])
        step, elapsed = state["step"], state["elapsed_s"]
        log(f"resumed from {source.name} at step {step} of {total}")
    started = time.monotonic() - elapsed
    train = arrays["train"]
    while step < total:
        distilling = step >= settings.target_steps
        batch = settings.distill_batch if distilling else settings.batch
        inputs = _windows(
            train, batch=batch, window=settings.window, seed=settings.seed * 1_000_003 + step
        )
        inputs = inputs.to(device)
        if distilling:
            target.eval()
            with torch.no_grad():
                teacher = target(input_ids=inputs).logits
            target_loss = None
        else:
            target.train()
            for group in target_opt.param_groups:
                group["lr"] = _lr(
                    step,
                    settings.target_steps,
                    peak=settings.target_lr,
                    warmup=settings.warmup_steps,
                )
            output = target(input_ids=inputs, labels=inputs)
            _optimizer_step(target_opt, target, output.loss)
            teacher = output.logits.detach()
            target_loss = output.loss.item()
        for group in draft_opt.param_groups:
            group["lr"] = _lr(step, total, peak=settings.draft_lr, warmup=settings.warmup_steps)
        draft_loss = _kl(draft(input_ids=inputs).logits, teacher)
        _optimizer_step(draft_opt, draft, draft_loss)
        step += 1
        if step % 10 == 0 or step == total:
            rate = (time.monotonic() - started) / step
            eta = rate * (total - step) / 60
            phase = "distill" if distilling else "train"
            loss_text = "" if target_loss is None else f" target loss {target_loss:.3f}"
            log(
                f"{phase} step {step}/{total}{loss_text} draft KL {draft_loss.item():.3f} "
                f"({rate:.2f} s/step, ~{eta:.0f} min left)"
            )
        if step % settings.checkpoint_every == 0 or step == total:
            state = {
                "target": target.state_dict(),
                "draft": draft.state_dict(),
                "target_opt": target_opt.state_dict(),
                "draft_opt": draft_opt.state_dict(),
                "step": step,
                "elapsed_s": time.monotonic() - started,
                "settings": asdict(settings),
            }
            _save_atomically(state, final if step == total else checkpoint)
    checkpoint.unlink(missing_ok=True)
    return {
        "target": target.eval(),
        "draft": draft.eval(),
        "train_seconds": time.monotonic() - started,
    }


def validate(
    models: dict[str, Any], arrays: dict[str, np.ndarray], settings: TrainSettings, *, device: str
) -> dict[str, float]:
    """Validation loss of both models and teacher-forced top-1 agreement on held-out files."""
    import torch
    import torch.nn.functional as functional

    data = arrays["validation"]
    windows = min(64, (len(data) - 1) // settings.window)
    stride = (len(data) - settings.window - 1) // windows
    sums = {"target_loss": 0.0, "draft_loss": 0.0, "top1_agreement": 0.0}
    with torch.no_grad():
        for index in range(windows):
            start = index * stride
            chunk = torch.from_numpy(data[start : start + settings.window + 1].astype(np.int64))[
                None
            ].to(device)
            inputs, labels = chunk[:, :-1], chunk[:, 1:]
            target_logits = models["target"](input_ids=inputs).logits
            draft_logits = models["draft"](input_ids=inputs).logits
            sums["target_loss"] += functional.cross_entropy(target_logits[0], labels[0]).item()
            sums["draft_loss"] += functional.cross_entropy(draft_logits[0], labels[0]).item()
            agree = (target_logits.argmax(-1) == draft_logits.argmax(-1)).float().mean().item()
            sums["top1_agreement"] += agree
    return {name: round(value / windows, 4) for name, value in sums.items()}


def distill_on_policy(
    work: Path,
    arrays: dict[str, np.ndarray],
    settings: TrainSettings,
    *,
    device: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """More draft distillation on the target's own greedy continuations (on-policy data).

    Speculative decoding verifies drafts along the target's greedy path, so training the draft
    where that path goes raises acceptance more than more corpus windows do (DistillSpec's
    finding). Each step: ``onpolicy_batch`` corpus windows of ``onpolicy_prompt`` tokens, the
    target continues each greedily for ``onpolicy_new`` tokens, and the draft minimises
    KL(target || draft) over the continuation positions. Resumable like ``train_pair``.
    """
    import torch
    from transformers import AutoModelForCausalLM

    final, checkpoint = work / "onpolicy.pt", work / "onpolicy_checkpoint.pt"
    trained = torch.load(work / "trained.pt", map_location=device, weights_only=False)
    target = AutoModelForCausalLM.from_config(llama_config(settings, role="target")).to(device)
    draft = AutoModelForCausalLM.from_config(llama_config(settings, role="draft")).to(device)
    target.load_state_dict(trained["target"])
    draft.load_state_dict(trained["draft"])
    target.eval()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=settings.onpolicy_lr, weight_decay=0.1)
    step, elapsed = 0, 0.0
    source = final if final.exists() else checkpoint if checkpoint.exists() else None
    if source is not None:
        state = torch.load(source, map_location=device, weights_only=False)
        draft.load_state_dict(state["draft"])
        optimizer.load_state_dict(state["draft_opt"])
        step, elapsed = state["step"], state["elapsed_s"]
        log(f"on-policy distillation resumed at step {step} of {settings.onpolicy_steps}")
    started = time.monotonic() - elapsed
    total = settings.onpolicy_steps
    while step < total:
        prompts = _windows(
            arrays["train"],
            batch=settings.onpolicy_batch,
            window=settings.onpolicy_prompt,
            seed=settings.seed * 1_000_003 + 7_000_000 + step,
        ).to(device)
        with torch.no_grad():
            sequences = target.generate(
                prompts,
                attention_mask=torch.ones_like(prompts),
                do_sample=False,
                max_new_tokens=settings.onpolicy_new,
                min_new_tokens=settings.onpolicy_new,
                pad_token_id=2,
            )
            teacher = target(input_ids=sequences).logits
        # Positions whose next token is a continuation token: [onpolicy_prompt - 1, end - 1).
        span = slice(settings.onpolicy_prompt - 1, sequences.shape[1] - 1)
        loss = _kl(draft(input_ids=sequences).logits[:, span], teacher[:, span])
        for group in optimizer.param_groups:
            group["lr"] = _lr(step, total, peak=settings.onpolicy_lr, warmup=10)
        _optimizer_step(optimizer, draft, loss)
        step += 1
        if step % 10 == 0 or step == total:
            rate = (time.monotonic() - started) / step
            log(
                f"on-policy step {step}/{total} KL {loss.item():.3f} "
                f"({rate:.2f} s/step, ~{rate * (total - step) / 60:.0f} min left)"
            )
        if step % settings.checkpoint_every == 0 or step == total:
            _save_atomically(
                {
                    "draft": draft.state_dict(),
                    "draft_opt": optimizer.state_dict(),
                    "step": step,
                    "elapsed_s": time.monotonic() - started,
                },
                final if step == total else checkpoint,
            )
    checkpoint.unlink(missing_ok=True)
    return {"target": target, "draft": draft.eval(), "seconds": time.monotonic() - started}
