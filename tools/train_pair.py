"""Corpus, tokenizer and training for the built-in pair (used by ``build_toy_pair.py``).

Needs the ``[export]`` extra (torch, transformers). Every stage writes its result into the
work directory and is skipped when that result exists, so an interrupted build resumes;
training itself checkpoints every ``checkpoint_every`` steps (atomic rename) and resumes from
the last checkpoint with the same batches it would have drawn (batches are seeded by step).
The on-policy distillation that follows is in ``on_policy.py``.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from train_steps import (
    clipped_step,
    kl_to_teacher,
    load_saved_state,
    pace,
    sample_windows,
    save_atomically,
    scheduled_lr,
    set_lr,
)

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


@dataclass(frozen=True, kw_only=True)
class PairModels:
    """A Llama target and its draft (transformers causal LMs) on the training device."""

    target: Any
    draft: Any


def new_pair(settings: TrainSettings, *, device: str) -> PairModels:
    """A freshly initialised target and draft (in that order, for the seeded RNG) on ``device``."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_config(llama_config(settings, role="target")).to(device)
    draft = AutoModelForCausalLM.from_config(llama_config(settings, role="draft")).to(device)
    return PairModels(target=target, draft=draft)


@dataclass(frozen=True, kw_only=True)
class _PairTraining:
    """Both models and their AdamW optimizers: what a ``train_pair`` checkpoint holds."""

    target: Any
    draft: Any
    target_opt: Any
    draft_opt: Any

    def state_dicts(self) -> dict[str, Any]:
        return {
            "target": self.target.state_dict(),
            "draft": self.draft.state_dict(),
            "target_opt": self.target_opt.state_dict(),
            "draft_opt": self.draft_opt.state_dict(),
        }

    def load_state_dicts(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.draft.load_state_dict(state["draft"])
        self.target_opt.load_state_dict(state["target_opt"])
        self.draft_opt.load_state_dict(state["draft_opt"])


@dataclass(frozen=True, kw_only=True)
class _StepLosses:
    target: float | None  # the target's next-token loss; None in the distillation-only phase
    draft_kl: Any  # 0-d tensor KL(target || draft); .item() (a device sync) only when logged


@dataclass(frozen=True, kw_only=True)
class _Teacher:
    logits: Any  # the target's [batch, window, vocab], without gradient
    target_loss: float | None  # its next-token loss while it trains; None once it is frozen


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

    final, checkpoint = work / "trained.pt", work / "checkpoint.pt"
    torch.manual_seed(settings.seed)
    pair = new_pair(settings, device=device)
    training = _PairTraining(
        target=pair.target,
        draft=pair.draft,
        target_opt=torch.optim.AdamW(
            pair.target.parameters(), lr=settings.target_lr, weight_decay=0.1
        ),
        draft_opt=torch.optim.AdamW(
            pair.draft.parameters(), lr=settings.draft_lr, weight_decay=0.1
        ),
    )
    total = settings.target_steps + settings.distill_steps
    step, elapsed = 0, 0.0
    saved = load_saved_state(final, checkpoint, device=device)
    if saved is not None:
        training.load_state_dicts(saved.state)
        step, elapsed = saved.state["step"], saved.state["elapsed_s"]
        log(f"resumed from {saved.name} at step {step} of {total}")
    started = time.monotonic() - elapsed
    while step < total:
        distilling = step >= settings.target_steps
        losses = _pair_step(training, arrays["train"], settings, step=step, device=device)
        step += 1
        if step % 10 == 0 or step == total:
            timing = pace(started, step=step, total=total)
            phase = "distill" if distilling else "train"
            loss_text = "" if losses.target is None else f" target loss {losses.target:.3f}"
            draft_kl = losses.draft_kl.item()
            log(f"{phase} step {step}/{total}{loss_text} draft KL {draft_kl:.3f} {timing}")
        if step % settings.checkpoint_every == 0 or step == total:
            state = {
                **training.state_dicts(),
                "step": step,
                "elapsed_s": time.monotonic() - started,
                "settings": asdict(settings),
            }
            save_atomically(state, final if step == total else checkpoint)
    checkpoint.unlink(missing_ok=True)
    return {
        "target": training.target.eval(),
        "draft": training.draft.eval(),
        "train_seconds": time.monotonic() - started,
    }


def _pair_step(
    training: _PairTraining,
    train_ids: np.ndarray,
    settings: TrainSettings,
    *,
    step: int,
    device: str,
) -> _StepLosses:
    """One step: the target learns (or, once distilling, only teaches), then the draft."""
    distilling = step >= settings.target_steps
    # [batch, window] token ids, seeded by the step so that a resumed run draws the same batches.
    inputs = sample_windows(
        train_ids,
        batch=settings.distill_batch if distilling else settings.batch,
        window=settings.window,
        seed=settings.seed * 1_000_003 + step,
    ).to(device)
    if distilling:
        teacher = _frozen_teacher(training.target, inputs)
    else:
        teacher = _train_target(training, inputs, settings, step=step)
    total = settings.target_steps + settings.distill_steps
    set_lr(
        training.draft_opt,
        scheduled_lr(step, total, peak=settings.draft_lr, warmup=settings.warmup_steps),
    )
    draft_kl = kl_to_teacher(training.draft(input_ids=inputs).logits, teacher.logits)
    clipped_step(training.draft_opt, training.draft, draft_kl)
    return _StepLosses(target=teacher.target_loss, draft_kl=draft_kl)


def _frozen_teacher(target: Any, inputs: Any) -> _Teacher:
    import torch

    target.eval()
    with torch.no_grad():
        return _Teacher(logits=target(input_ids=inputs).logits, target_loss=None)


def _train_target(
    training: _PairTraining, inputs: Any, settings: TrainSettings, *, step: int
) -> _Teacher:
    """One next-token step of the target; its logits, detached, teach the draft."""
    training.target.train()
    set_lr(
        training.target_opt,
        scheduled_lr(
            step, settings.target_steps, peak=settings.target_lr, warmup=settings.warmup_steps
        ),
    )
    output = training.target(input_ids=inputs, labels=inputs)
    clipped_step(training.target_opt, training.target, output.loss)
    return _Teacher(logits=output.logits.detach(), target_loss=output.loss.item())


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
