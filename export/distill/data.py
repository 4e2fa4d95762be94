"""The distillation data: prompt windows, the teacher's continuations (greedy, then sampled
for repeats) and its top-k log-probabilities at every position, saved as they are made."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.errors import ConfigError
from edgespec.export.distill.config import (
    BUILTIN_CODE_TASKS,
    BUILTIN_SUBJECTS,
    BUILTIN_TEMPLATES,
    SAMPLE_TEMPERATURE,
    SAVE_EVERY,
    TOP_K,
    DistillConfig,
    Log,
)
from edgespec.export.distill.teacher import Teacher


def prompt_texts(config: DistillConfig, teacher: Teacher) -> list[str]:
    """The prompts to continue: from the corpus files, else the built-in mix (chat prompts
    through the target's chat template when it has one)."""
    texts: list[str] = list(config.extra_prompts)
    for path in config.corpus:
        texts.extend(_corpus_texts(path))
    if not config.corpus and not texts:
        requests = [t.format(s) for t in BUILTIN_TEMPLATES for s in BUILTIN_SUBJECTS]
        requests += [f"Write a Python function that {task}." for task in BUILTIN_CODE_TASKS]
        texts = [_chat(teacher, request) for request in requests]
    if not texts:
        raise ConfigError(
            "the corpus holds no text",
            fix="pass files with text (or JSONL with 'prompt' or 'text')",
        )
    return texts


def _chat(teacher: Teacher, prompt: str) -> str:
    if not teacher.chat_template:
        return prompt
    import jinja2

    template = jinja2.Environment(autoescape=False).from_string(teacher.chat_template)
    return template.render(
        messages=[{"role": "user", "content": prompt}], add_generation_prompt=True, bos_token=""
    )


def _corpus_texts(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(
            f"cannot read corpus file {path} ({error})", fix="check the path"
        ) from error
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ConfigError(
                    f"{path}:{number} is not JSON ({error.msg})", fix="one JSON object per line"
                ) from error
            value = row.get("prompt") or row.get("text") if isinstance(row, dict) else None
            if isinstance(value, str) and value.strip():
                rows.append(value)
        return rows
    return [text] if text.strip() else []


def build_data(config: DistillConfig, teacher: Teacher, log: Log) -> dict[str, np.ndarray]:
    """``samples`` sequences (prompt + greedy continuation, padded with -1) and the teacher's
    top-``TOP_K`` token ids and log-probabilities at each position; resumable."""
    from tokenizers import Tokenizer

    path = config.work_dir / f"data-{config.data_key()}.npz"
    partial = path.with_suffix(".partial.npz")
    length = config.prompt_tokens + config.new_tokens
    tokenizer = Tokenizer.from_file(str(teacher.tokenizer_dir / "tokenizer.json"))
    windows = _prompt_windows(prompt_texts(config, teacher), tokenizer, config)
    arrays = _load_arrays(path)
    if arrays is not None:
        return arrays
    arrays = _load_arrays(partial) or {
        "tokens": np.full((config.samples, length), -1, np.int32),
        "top_ids": np.zeros((config.samples, length, TOP_K), np.int32),
        "top_logprobs": np.full((config.samples, length, TOP_K), -np.inf, np.float32),
        "done": np.zeros(config.samples, np.bool_),
        # Sample i continues prompt window i mod n; its repeat i // n > 0 is sampled.
        "window": np.arange(config.samples, dtype=np.int32) % len(windows),
        "repeat": np.arange(config.samples, dtype=np.int32) // len(windows),
    }
    started, first = time.monotonic(), int(arrays["done"].sum())
    for index in range(config.samples):
        if arrays["done"][index]:
            continue
        prompt = windows[int(arrays["window"][index])]
        if arrays["repeat"][index] == 0:
            added = teacher.continue_greedy(prompt, config.new_tokens)
        else:
            seed = config.seed * 1_000_003 + index
            added = teacher.continue_sampled(prompt, config.new_tokens, SAMPLE_TEMPERATURE, seed)
        sequence = prompt + added
        logits = teacher.logits(sequence)  # [len(sequence), vocab]
        top = np.argpartition(-logits, TOP_K - 1, axis=-1)[:, :TOP_K]
        chosen = np.take_along_axis(logits, top, axis=-1)
        logprobs = chosen - _logsumexp(logits)[:, None]
        arrays["tokens"][index, : len(sequence)] = sequence
        arrays["top_ids"][index, : len(sequence)] = top
        arrays["top_logprobs"][index, : len(sequence)] = logprobs
        arrays["done"][index] = True
        made = int(arrays["done"].sum())
        if made % SAVE_EVERY == 0 or made == config.samples:
            _save_arrays(partial, arrays)
            timing = eta(started, made - first, config.samples - made)
            log(f"distill: data {made}/{config.samples} {timing}")
    _save_arrays(path, arrays)
    partial.unlink(missing_ok=True)
    return arrays


def _prompt_windows(texts: list[str], tokenizer: Any, config: DistillConfig) -> list[list[int]]:
    """Prompts of at most ``prompt_tokens`` tokens: short texts whole, long ones cut into
    windows; shuffled by the seed."""
    windows: list[list[int]] = []
    for text in texts:
        ids = list(tokenizer.encode(text, add_special_tokens=False).ids)
        for start in range(0, max(len(ids), 1), config.prompt_tokens):
            window = ids[start : start + config.prompt_tokens]
            if len(window) >= 4:
                windows.append(window)
    if len(windows) < 2:
        raise ConfigError(
            f"the corpus gives {len(windows)} prompt(s) of 4 tokens or more; distillation needs "
            "2 or more (a tenth is held out)",
            fix="pass files with more text",
        )
    order = np.random.default_rng(config.seed).permutation(len(windows))
    return [windows[i] for i in order]


def _logsumexp(logits: np.ndarray) -> np.ndarray:
    peak = logits.max(-1)
    return np.asarray(peak + np.log(np.exp(logits - peak[:, None]).sum(-1)))


def _load_arrays(path: Path) -> dict[str, np.ndarray] | None:
    if not path.is_file():
        return None
    with np.load(path) as data:
        return {name: np.array(data[name]) for name in data.files}


def _save_arrays(path: Path, arrays: dict[str, np.ndarray]) -> None:
    scratch = path.with_name(path.name + ".tmp.npz")
    np.savez(scratch, **arrays)  # type: ignore[arg-type]
    os.replace(scratch, path)


def eta(started: float, done: int, left: int) -> str:
    if done <= 0:
        return ""
    rate = (time.monotonic() - started) / done
    return f"({rate:.2f} s each, ~{rate * left / 60:.1f} min left)"
