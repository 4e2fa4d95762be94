"""Training the draft on the teacher's distributions (resumable), and its acceptance by draft
position on held-out prompts."""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.export.distill.config import (
    CHECKPOINT_EVERY,
    EVAL_K,
    HELD_OUT_SHARE,
    DistillConfig,
    Log,
)
from edgespec.export.distill.data import eta
from edgespec.export.distill.teacher import Teacher


@dataclass
class TrainingState:
    step: int = 0
    elapsed_s: float = 0.0
    losses: list[float] = field(default_factory=list)  # mean loss per CHECKPOINT_EVERY steps
    stopped_early: bool = False


def new_draft(config: DistillConfig, teacher: Teacher, tokenizer_config: dict[str, Any]) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(config.seed)
    if config.init is not None:
        return _initial_draft(config.init, teacher).to(config.device)
    draft_config = LlamaConfig(
        vocab_size=teacher.vocab_size,
        hidden_size=config.hidden,
        num_hidden_layers=config.layers,
        num_attention_heads=config.heads,
        num_key_value_heads=config.kv_heads,
        intermediate_size=config.intermediate,
        max_position_embeddings=max(2048, config.prompt_tokens + config.new_tokens),
        tie_word_embeddings=True,
        bos_token_id=tokenizer_config.get("bos_token_id"),
        eos_token_id=tokenizer_config.get("eos_token_id"),
    )
    return LlamaForCausalLM(draft_config).to(config.device)  # type: ignore[arg-type]


def _initial_draft(path: Path, teacher: Teacher) -> Any:
    from edgespec.errors import ConfigError

    if path.suffix == ".gguf":
        from edgespec.export.distill.torch_teacher import torch_model_from_gguf
        from edgespec.export.gguf.reader import open_gguf

        draft = torch_model_from_gguf(open_gguf(path))
    elif (path / "config.json").is_file():
        from transformers import AutoModelForCausalLM

        draft = AutoModelForCausalLM.from_pretrained(path, dtype="float32")
    else:
        raise ConfigError(
            f"--init {path} is neither a draft GGUF nor a Hugging Face directory",
            fix="pass the .gguf or the draft-hf directory an earlier distillation wrote",
        )
    if int(draft.config.vocab_size) != teacher.vocab_size:
        raise ConfigError(
            f"--init {path} has a vocabulary of {draft.config.vocab_size}, the target "
            f"{teacher.vocab_size}",
            fix="start from a draft distilled for this target",
        )
    return draft.float()


def train(
    config: DistillConfig, draft: Any, arrays: dict[str, np.ndarray], log: Log
) -> TrainingState:
    """Minimises the cross-entropy to the teacher's renormalised top-k distribution (KL up to
    a constant) over every position with a next token; resumes from the checkpoint."""
    import torch

    train_rows = _split(config, arrays)[0]
    checkpoint = config.work_dir / f"checkpoint-{config.data_key()}.pt"
    optimizer = torch.optim.AdamW(draft.parameters(), lr=config.lr, weight_decay=0.01)
    state = TrainingState()
    if checkpoint.is_file():
        saved = torch.load(checkpoint, map_location=config.device, weights_only=False)
        draft.load_state_dict(saved["draft"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainingState(**saved["state"])
        log(f"distill: resumed at step {state.step} of {config.steps}")
    started = time.monotonic() - state.elapsed_s
    deadline = None if config.max_minutes is None else time.monotonic() + config.max_minutes * 60
    # With --max-minutes the schedule decays over whichever ends first, the steps or the time,
    # so a run cut by the clock still ends at a low learning rate.
    span_s = None if deadline is None else deadline - started
    window: list[float] = []
    draft.train()
    while state.step < config.steps:
        rows = np.random.default_rng(config.seed * 1_000_003 + state.step).choice(
            train_rows, size=min(config.batch, len(train_rows)), replace=False
        )
        loss = _loss(draft, arrays, rows, config.device)
        progress = state.step / config.steps
        if span_s is not None:
            progress = max(progress, (time.monotonic() - started) / span_s)
        for group in optimizer.param_groups:
            group["lr"] = _lr(state.step, progress, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        state.step += 1
        window.append(float(loss.item()))
        out_of_time = deadline is not None and time.monotonic() > deadline
        if state.step % CHECKPOINT_EVERY == 0 or state.step == config.steps or out_of_time:
            state.losses.append(sum(window) / len(window))
            window = []
            state.elapsed_s = time.monotonic() - started
            state.stopped_early = out_of_time and state.step < config.steps
            _save_checkpoint(checkpoint, draft, optimizer, state)
            timing = eta(started, state.step, config.steps - state.step)
            if deadline is not None and (deadline - time.monotonic()) / 60 < _minutes_left(
                started, state.step, config.steps
            ):  # the clock ends the run first
                timing = (
                    f"(~{max(deadline - time.monotonic(), 0) / 60:.1f} min left: --max-minutes)"
                )
            log(f"distill: step {state.step}/{config.steps} loss {state.losses[-1]:.3f} {timing}")
        if out_of_time:
            log(f"distill: --max-minutes reached at step {state.step}; rerun to resume")
            break
    draft.eval()
    return state


def _loss(draft: Any, arrays: dict[str, np.ndarray], rows: np.ndarray, device: str) -> Any:
    import torch

    # Columns past the batch's longest sequence are padding everywhere: cut them (sequences
    # are padded to prompt + new tokens, most prompts are far shorter).
    width = int((arrays["tokens"][rows] >= 0).sum(1).max())
    tokens = torch.from_numpy(arrays["tokens"][rows, :width].astype(np.int64)).to(device)
    valid = tokens >= 0
    # bfloat16 matrix products on a GPU (the loss itself stays float32).
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
        logits = draft(input_ids=tokens.clamp(min=0), attention_mask=valid.long()).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, T, vocab]
    ids = torch.from_numpy(arrays["top_ids"][rows, :width].astype(np.int64)).to(device)
    teacher = torch.from_numpy(arrays["top_logprobs"][rows, :width]).to(device)
    # Padded positions hold -inf everywhere: make them finite (they are masked out below),
    # or their NaN weights would turn the gradient into NaN through the mask.
    teacher = torch.where(valid[..., None], teacher, torch.zeros_like(teacher))
    weights = torch.softmax(teacher, dim=-1)  # renormalised top-k
    per_position = -(weights * logprobs.gather(-1, ids)).sum(-1)  # [B, T]
    # A position teaches when it and the next one are real tokens (its target is known).
    mask = valid.clone()
    mask[:, :-1] &= valid[:, 1:]
    mask[:, -1] = False
    return (per_position * mask).sum() / mask.sum().clamp(min=1)


def _minutes_left(started: float, done: int, total: int) -> float:
    return (time.monotonic() - started) / max(done, 1) * (total - done) / 60


def _lr(step: int, progress: float, config: DistillConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth as ``progress`` (0..1) goes by."""
    warmup = max(1, min(20, config.steps // 10))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def _save_checkpoint(path: Path, draft: Any, optimizer: Any, state: TrainingState) -> None:
    import torch

    scratch = path.with_name(path.name + ".partial")
    payload = {"draft": draft.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**payload, "state": asdict(state)}, scratch)
    os.replace(scratch, path)


def _split(config: DistillConfig, arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Training rows, and held-out rows: the greedy samples of a tenth of the prompt windows,
    whose samples (greedy or sampled) are never trained on."""
    windows = int(arrays["window"].max()) + 1
    order = np.random.default_rng(config.seed).permutation(windows)
    held = order[: max(1, round(windows * HELD_OUT_SHARE))].tolist()
    in_held = np.isin(arrays["window"], held)
    train_rows = np.flatnonzero(~in_held)
    held_rows = np.flatnonzero(in_held & (arrays["repeat"] == 0))
    return train_rows, held_rows


# -- evaluation ----------------------------------------------------------------------------


def frequent_tokens(
    config: DistillConfig,
    arrays: dict[str, np.ndarray],
    size: int,
    always: tuple[int, ...],
    vocab_size: int,
) -> np.ndarray:
    """A reduced output vocabulary of ``size`` ascending ids: ``always``, then tokens by their
    count in the target's continuations (training rows), then in the prompts, then by id."""
    rows = _split(config, arrays)[0]
    tokens = arrays["tokens"][rows]
    continuation = np.arange(tokens.shape[1])[None, :] >= arrays["prompt_length"][rows][:, None]
    written = np.bincount(tokens[continuation & (tokens >= 0)], minlength=vocab_size)
    seen = np.bincount(tokens[tokens >= 0], minlength=vocab_size)
    order = np.lexsort((np.arange(vocab_size), -seen[:vocab_size], -written[:vocab_size]))
    kept = dict.fromkeys([*always, *(int(t) for t in order)])
    return np.array(sorted(list(kept)[:size]), np.int64)


def acceptance_by_position(
    config: DistillConfig,
    draft: Any,
    arrays: dict[str, np.ndarray],
    kept: np.ndarray | None = None,
) -> dict[str, Any]:
    """Greedy speculation at k = ``EVAL_K`` simulated along the target's greedy continuation
    of each held-out sample: a draft token is accepted while it equals the target's. Draft
    proposals on an accepted prefix see exactly the target's tokens, so one teacher-forced
    pass gives them. With ``kept`` the draft proposes among those tokens only. Returns alpha
    (accepted / tested), alpha at each draft position and, with ``kept``, the share of the
    target's tokens it covers."""
    import torch

    held = _split(config, arrays)[1]
    offered, accepted = [0] * EVAL_K, [0] * EVAL_K
    for row in held:
        sequence = [int(t) for t in arrays["tokens"][row] if t >= 0]
        with torch.no_grad():
            logits = draft(input_ids=torch.tensor([sequence], device=config.device)).logits[0]
        if kept is None:
            guesses = logits.argmax(-1).tolist()  # guesses[i] predicts sequence[i + 1]
        else:
            index = torch.as_tensor(kept, device=logits.device)
            guesses = index[logits[:, index].argmax(-1)].tolist()
        prompt = int(arrays["prompt_length"][row]) if "prompt_length" in arrays else 0
        position = (prompt or config.prompt_tokens) - 1
        end = len(sequence) - 1
        while position < end:
            run = 0
            while run < EVAL_K and position + run < end:
                offered[run] += 1
                if guesses[position + run] != sequence[position + run + 1]:
                    break
                accepted[run] += 1
                run += 1
            position += run + 1
    tested = sum(offered)
    coverage: dict[str, Any] = {}
    if kept is not None:
        rows = arrays["tokens"][held]
        after = np.arange(rows.shape[1])[None, :] >= arrays["prompt_length"][held][:, None]
        produced = rows[after & (rows >= 0)]
        coverage["output_vocabulary_coverage"] = float(np.isin(produced, kept).mean())
    return {
        **coverage,
        "alpha": sum(accepted) / tested if tested else None,
        "alpha_by_position": [a / o if o else None for a, o in zip(accepted, offered, strict=True)],
        "held_out_samples": len(held),
        "measured_as": "greedy speculation at k 8 along the target's own continuations",
    }
