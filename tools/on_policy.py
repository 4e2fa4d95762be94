"""On-policy distillation of the built-in pair's draft (after ``train_pair``; used by
``build_toy_pair.py``).

Resumable like ``train_pair``: checkpoints every ``checkpoint_every`` steps (atomic rename),
and the prompt batches are seeded by step, so a resumed run draws the same ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import train_steps as steps
from train_pair import PairModels, TrainSettings, new_pair

# Added to the prompt seeds, so they differ from the seeds of train_pair's batches.
_SEED_OFFSET = 7_000_000
_WARMUP_STEPS = 10
_PAD_TOKEN_ID = 2  # the tokenizer's <pad>


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

    final, checkpoint = work / "onpolicy.pt", work / "onpolicy_checkpoint.pt"
    pair = _trained_pair(work, settings, device=device)
    optimizer = torch.optim.AdamW(
        pair.draft.parameters(), lr=settings.onpolicy_lr, weight_decay=0.1
    )
    step, elapsed = 0, 0.0
    saved = steps.load_saved_state(final, checkpoint, device=device)
    if saved is not None:
        pair.draft.load_state_dict(saved.state["draft"])
        optimizer.load_state_dict(saved.state["draft_opt"])
        step, elapsed = saved.state["step"], saved.state["elapsed_s"]
        log(f"on-policy distillation resumed at step {step} of {settings.onpolicy_steps}")
    started = time.monotonic() - elapsed
    total = settings.onpolicy_steps
    while step < total:
        loss = _on_policy_step(pair, optimizer, arrays["train"], settings, step=step, device=device)
        step += 1
        if step % 10 == 0 or step == total:
            timing = steps.pace(started, step=step, total=total)
            log(f"on-policy step {step}/{total} KL {loss.item():.3f} {timing}")
        if step % settings.checkpoint_every == 0 or step == total:
            steps.save_atomically(
                {
                    "draft": pair.draft.state_dict(),
                    "draft_opt": optimizer.state_dict(),
                    "step": step,
                    "elapsed_s": time.monotonic() - started,
                },
                final if step == total else checkpoint,
            )
    checkpoint.unlink(missing_ok=True)
    return {
        "target": pair.target,
        "draft": pair.draft.eval(),
        "seconds": time.monotonic() - started,
    }


def _trained_pair(work: Path, settings: TrainSettings, *, device: str) -> PairModels:
    """The pair as ``train_pair`` finished it, with the target in eval mode (it only teaches)."""
    import torch

    trained = torch.load(work / "trained.pt", map_location=device, weights_only=False)
    pair = new_pair(settings, device=device)
    pair.target.load_state_dict(trained["target"])
    pair.draft.load_state_dict(trained["draft"])
    pair.target.eval()
    return pair


def _on_policy_step(
    pair: PairModels,
    optimizer: Any,
    train_ids: np.ndarray,
    settings: TrainSettings,
    *,
    step: int,
    device: str,
) -> Any:
    """One draft step on fresh target continuations; returns the KL, a 0-d tensor."""
    import torch

    # [onpolicy_batch, onpolicy_prompt] corpus windows as prompts.
    prompts = steps.sample_windows(
        train_ids,
        batch=settings.onpolicy_batch,
        window=settings.onpolicy_prompt,
        seed=settings.seed * 1_000_003 + _SEED_OFFSET + step,
    ).to(device)
    with torch.no_grad():
        # [onpolicy_batch, onpolicy_prompt + onpolicy_new]: exactly onpolicy_new new tokens.
        sequences = pair.target.generate(
            prompts,
            attention_mask=torch.ones_like(prompts),
            do_sample=False,
            max_new_tokens=settings.onpolicy_new,
            min_new_tokens=settings.onpolicy_new,
            pad_token_id=_PAD_TOKEN_ID,
        )
        teacher = pair.target(input_ids=sequences).logits
    # Positions whose next token is a continuation token: [onpolicy_prompt - 1, end - 1).
    span = slice(settings.onpolicy_prompt - 1, sequences.shape[1] - 1)
    loss = steps.kl_to_teacher(pair.draft(input_ids=sequences).logits[:, span], teacher[:, span])
    steps.set_lr(
        optimizer,
        steps.scheduled_lr(
            step, settings.onpolicy_steps, peak=settings.onpolicy_lr, warmup=_WARMUP_STEPS
        ),
    )
    steps.clipped_step(optimizer, pair.draft, loss)
    return loss
