"""Pieces shared by the built-in pair's training phases (``train_pair.py``, ``on_policy.py``).

Batches seeded by step, the learning-rate schedule, the distillation loss, the clipped AdamW
step, checkpoints written atomically and found again on resume, and the progress figures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def sample_windows(data: np.ndarray, *, batch: int, window: int, seed: int) -> Any:
    """``batch`` windows of ``window`` tokens at random starts: int64 [batch, window]."""
    import torch

    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - window - 1, size=batch)
    return torch.from_numpy(np.stack([data[s : s + window] for s in starts]).astype(np.int64))


def scheduled_lr(step: int, total: int, *, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak``, then cosine decay to a tenth of it at ``total``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def set_lr(optimizer: Any, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def kl_to_teacher(student_logits: Any, teacher_logits: Any) -> Any:
    """KL(teacher || student) per token, averaged; logits [batch, window, vocab]."""
    import torch.nn.functional as functional

    student = functional.log_softmax(student_logits.float(), dim=-1).flatten(0, 1)
    teacher = functional.log_softmax(teacher_logits.float(), dim=-1).flatten(0, 1)
    return functional.kl_div(student, teacher, log_target=True, reduction="batchmean")


def clipped_step(optimizer: Any, model: Any, loss: Any) -> None:
    """One AdamW step with gradients clipped to norm 1."""
    import torch

    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def save_atomically(state: dict[str, Any], path: Path) -> None:
    """A checkpoint is either whole or absent: written beside ``path``, then renamed."""
    import torch

    scratch = path.with_name(path.name + ".partial")
    torch.save(state, scratch)
    scratch.replace(path)


@dataclass(frozen=True, kw_only=True)
class SavedState:
    """The last state a resumable phase saved."""

    name: str  # the file's name, for the log
    state: dict[str, Any]  # state dicts of models and optimizers, "step" and "elapsed_s"


def load_saved_state(final: Path, checkpoint: Path, *, device: str) -> SavedState | None:
    """The finished phase's ``final`` file if it exists, else its last checkpoint, else None."""
    import torch

    source = final if final.exists() else checkpoint if checkpoint.exists() else None
    if source is None:
        return None
    return SavedState(
        name=source.name, state=torch.load(source, map_location=device, weights_only=False)
    )


def pace(started: float, *, step: int, total: int) -> str:
    """Seconds per step so far and the minutes left at that rate, for the progress log."""
    rate = (time.monotonic() - started) / step
    return f"({rate:.2f} s/step, ~{rate * (total - step) / 60:.0f} min left)"
