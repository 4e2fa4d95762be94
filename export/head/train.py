"""Training a head on the target's features (torch): at every chain depth the head's scores
learn the target's next-token distribution over the kept tokens (soft cross-entropy) and its
output the target's next feature (smooth L1, in units of the features' RMS). Time-bounded,
checkpointed every few minutes, resumed from the checkpoint."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.head.data import Sample
from edgespec.export.head.net import HeadShape, head_net

Log = Callable[[str], None]
#: How much the feature regression counts beside the scores' cross-entropy.
REGRESSION_WEIGHT = 0.5
CHECKPOINT_EVERY_S = 120.0
WARMUP_STEPS = 50
#: The learning rate falls along a cosine to this share of its peak by the end of the budget.
FINAL_LR_SHARE = 0.1


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    depth: int = 3
    batch: int = 8
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    #: Training stops at the first of these.
    minutes: float = 10.0
    max_steps: int = 1 << 30
    max_length: int = 384
    #: The first share of the budget trains depth 1 alone (a third of a full step's cost, and
    #: the first draft position carries most of a round's gain); the rest unrolls to ``depth``.
    depth_one_share: float = 0.5


def schedule(settings: TrainSettings, *, step: int, progress: float) -> tuple[float, int]:
    """The learning rate and the chain depth of a step, at ``progress`` (0..1: the larger of
    the time spent over the budget and the steps over ``max_steps``): a short warm-up, then a
    cosine from the peak down to ``FINAL_LR_SHARE`` of it."""
    warm = min(1.0, (step + 1) / WARMUP_STEPS)
    cosine = 0.5 * (1.0 + np.cos(np.pi * min(max(progress, 0.0), 1.0)))
    lr = settings.lr * warm * (FINAL_LR_SHARE + (1.0 - FINAL_LR_SHARE) * cosine)
    depth = 1 if progress < settings.depth_one_share else settings.depth
    return float(lr), depth


def reduced_ids(tokens: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """Each token's row in the head's table: its index among ``kept``, or N (the zero row)."""
    index = np.full(int(max(tokens.max(initial=0), kept.max()) + 1), len(kept), np.int64)
    index[kept] = np.arange(len(kept))
    return index[tokens]


def train(
    samples: list[Sample],
    *,
    shape: HeadShape,
    table: np.ndarray,
    output: np.ndarray | None,
    norm: np.ndarray,
    kept: np.ndarray,
    settings: TrainSettings,
    checkpoint: Path,
    log: Log,
) -> tuple[Any, dict[str, Any]]:
    """The trained head and its training record (steps, positions seen, minutes, losses)."""
    import torch

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    net = head_net(shape, table=table, output=output, norm=norm, seed=settings.seed)
    net = net.to(settings.device)
    optimizer = torch.optim.AdamW(
        [p for p in net.parameters() if p.requires_grad], lr=settings.lr, weight_decay=0.0
    )
    step, seen, spent = 0, 0, 0.0
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location=settings.device)
        net.load_state_dict(state["net"])
        optimizer.load_state_dict(state["optimizer"])
        step, seen, spent = state["step"], state["seen"], state["seconds"]
        log(f"head: resuming training at step {step} ({spent / 60:.1f} min spent)")
    features_rms = float(
        np.sqrt(np.mean([np.mean(s.features.astype(np.float32) ** 2) for s in samples[:64]]))
    )
    rng = np.random.default_rng(settings.seed + step)
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].tokens))
    batches = [order[i : i + settings.batch] for i in range(0, len(order), settings.batch)]
    budget = settings.minutes * 60
    started, saved, losses = time.monotonic(), time.monotonic(), []
    while step < settings.max_steps and spent + (time.monotonic() - started) < budget:
        progress = max((spent + time.monotonic() - started) / budget, step / settings.max_steps)
        lr, depth = schedule(settings, step=step, progress=progress)
        picked = batches[int(rng.integers(len(batches)))]
        tokens, features, mask = _batch([samples[i] for i in picked], kept, settings)
        loss, parts = _loss(net, tokens, features, mask, depth, features_rms)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()
        step += 1
        seen += int(mask.sum())
        losses.append(parts)
        now = time.monotonic()
        if step % 25 == 0:
            recent = np.mean(losses[-25:], axis=0)
            total = spent + now - started
            log(
                f"head: step {step} (depth {depth}, lr {lr:.1e}), {seen:,} positions, "
                f"{seen / max(total, 1e-9):,.0f} positions/s, cross-entropy {recent[0]:.3f}, "
                f"regression {recent[1]:.3f}, "
                f"{max(budget - total, 0) / 60:.1f} min left"
            )
        if now - saved > CHECKPOINT_EVERY_S:
            _save(checkpoint, net, optimizer, step, seen, spent + now - started)
            saved = now
    spent += time.monotonic() - started
    _save(checkpoint, net, optimizer, step, seen, spent)
    recent = np.mean(losses[-50:], axis=0) if losses else np.zeros(2)
    record = {
        "steps": step,
        "positions_seen": seen,
        "train_minutes": round(spent / 60, 2),
        "depth": settings.depth,
        "depth_one_share": settings.depth_one_share,
        "batch": settings.batch,
        "lr": settings.lr,
        "lr_schedule": f"warm-up {WARMUP_STEPS} steps, cosine to {FINAL_LR_SHARE:g} of the peak",
        "final_cross_entropy": round(float(recent[0]), 4),
        "final_regression": round(float(recent[1]), 4),
        "device": settings.device,
        "torch_threads": torch.get_num_threads(),
    }
    return net, record


def _save(path: Path, net: Any, optimizer: Any, step: int, seen: int, seconds: float) -> None:
    import torch

    scratch = path.with_name(path.name + ".tmp")
    state = {"net": net.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "step": step, "seen": seen, "seconds": seconds}, scratch)
    scratch.replace(path)


def _batch(
    samples: list[Sample], kept: np.ndarray, settings: TrainSettings
) -> tuple[Any, Any, Any]:
    """Padded tokens [B, L] (reduced ids), features [B, L, H] and the mask [B, L] of real
    positions."""
    import torch

    length = min(max(len(s.tokens) for s in samples), settings.max_length)
    hidden = samples[0].features.shape[1]
    tokens = np.zeros((len(samples), length), np.int64)
    features = np.zeros((len(samples), length, hidden), np.float32)
    mask = np.zeros((len(samples), length), np.bool_)
    for row, sample in enumerate(samples):
        n = min(len(sample.tokens), length)
        tokens[row, :n] = reduced_ids(sample.tokens[:n], kept)
        features[row, :n] = sample.features[:n]
        mask[row, :n] = True
    device = settings.device
    return (
        torch.from_numpy(tokens).to(device),
        torch.from_numpy(features).to(device),
        torch.from_numpy(mask).to(device),
    )


def _loss(
    net: Any, tokens: Any, features: Any, mask: Any, depth: int, rms: float
) -> tuple[Any, tuple[float, float]]:
    """Mean over depths of the soft cross-entropy against the target's distribution over the
    kept tokens and the smooth-L1 distance to the target's feature."""
    import torch
    from torch.nn import functional

    predicted = net.unrolled(tokens, features, depth, drafted=False)
    with torch.no_grad():  # the target's distribution at every position, once [B, L, N]
        p_all = torch.softmax(net.logits(features), -1)
    total = torch.zeros((), device=features.device)
    ce_sum, reg_sum = 0.0, 0.0
    for j, guess in enumerate(predicted, start=1):
        n = guess.shape[1]
        target = features[:, j : j + n]  # f_{t+j}
        valid = mask[:, j : j + n].float()
        p_target = p_all[:, j : j + n]
        log_q = torch.log_softmax(net.logits(guess), -1)
        ce = -(p_target * log_q).sum(-1)
        reg = functional.smooth_l1_loss(guess / rms, target / rms, reduction="none").mean(-1)
        count = valid.sum().clamp(min=1.0)
        ce_mean, reg_mean = (ce * valid).sum() / count, (reg * valid).sum() / count
        total = total + (ce_mean + REGRESSION_WEIGHT * reg_mean) / len(predicted)
        ce_sum += float(ce_mean.detach()) / len(predicted)
        reg_sum += float(reg_mean.detach()) / len(predicted)
    return total, (ce_sum, reg_sum)


def acceptance_by_depth(
    net: Any, samples: list[Sample], kept: np.ndarray, *, depth: int, device: str = "cpu"
) -> list[float]:
    """On ``samples`` (held out), the fraction of answer positions where the head's greedy
    chain of drafts matches the target's own next tokens through depth 1, 2, ... ``depth``
    (each the chance that a round accepts at least that many)."""
    import torch

    matched = np.zeros(depth)
    counted = np.zeros(depth)
    with torch.no_grad():
        for sample in samples:
            tokens = torch.from_numpy(reduced_ids(sample.tokens, kept))[None].to(device)
            features = torch.from_numpy(sample.features.astype(np.float32))[None].to(device)
            predicted = net.unrolled(tokens, features, depth, drafted=True)
            alive: Any = None
            for j, guess in enumerate(predicted, start=1):
                n = guess.shape[1]
                drafts = net.logits(guess).argmax(-1)[0]  # [n]: row t drafts x_{t+j+1}
                # Row t's draft at depth j is checked against x_{t+j+1}; rows past the end
                # of the sequence have no answer to compare with. A branch counts where its
                # first draft falls in the answer.
                usable = n - 1
                truth = tokens[0, j + 1 : j + 1 + usable]
                hit = (drafts[:usable] == truth) & (truth < len(kept))
                alive = hit if alive is None else alive[:usable] & hit
                answer = torch.arange(usable) + 2 >= sample.prompt_length
                matched[j - 1] += float((alive & answer).sum())
                counted[j - 1] += float(answer.sum())
    return [round(float(m / max(c, 1)), 4) for m, c in zip(matched, counted, strict=True)]
