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
from edgespec.export.distill.edit_prompts import edit_requests
from edgespec.export.distill.teacher import Teacher


def prompt_texts(config: DistillConfig, teacher: Teacher, log: Log) -> list[str]:
    """The prompts to continue: from the corpus files, else the built-in mix and the requests
    the target writes itself (chat prompts through the target's chat template when it has
    one)."""
    texts: list[str] = list(config.extra_prompts)
    for path in config.corpus:
        texts.extend(_corpus_texts(path))
    if not config.corpus and not texts:
        requests = [t.format(s) for t in BUILTIN_TEMPLATES for s in BUILTIN_SUBJECTS]
        requests += [f"Write a Python function that {task}." for task in BUILTIN_CODE_TASKS]
        requests += self_written_requests(config, teacher, log)
        requests += edit_requests(config.edit_prompts, config.seed)
        texts = [_chat(teacher, request, config.system_prompt) for request in requests]
    if not texts:
        raise ConfigError(
            "the corpus holds no text",
            fix="pass files with text (or JSONL with 'prompt' or 'text')",
        )
    return texts


#: Stands in for the user's message while the template is rendered; the text before it is
#: the user turn's opening.
_MARK = "\x00USER\x00"
SELF_PROMPT_TOKENS = 48


def self_written_requests(config: DistillConfig, teacher: Teacher, log: Log) -> list[str]:
    """``config.self_prompts`` user requests sampled (temperature 0.8) from the target after
    its template's user-turn opening, kept when the target closed the turn itself
    (Magpie's trick: an instruction model writes the questions its users ask)."""
    if config.self_prompts == 0 or not teacher.chat_template:
        return []
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(teacher.tokenizer_dir / "tokenizer.json"))
    opening = _chat(teacher, _MARK, config.system_prompt, reply=False).split(_MARK)[0]
    prefix = list(tokenizer.encode(opening, add_special_tokens=False).ids)
    requests: dict[str, None] = {}
    seed = config.seed
    while len(requests) < config.self_prompts and seed < config.seed + 4 * config.self_prompts:
        ask = min(teacher.batch_size, 4 * config.self_prompts)
        for written in teacher.continue_many(
            [prefix] * ask, SELF_PROMPT_TOKENS, SAMPLE_TEMPERATURE, seed
        ):
            text = tokenizer.decode(written[:-1]).strip()
            if len(written) >= 5 and _closed(teacher, written) and text:
                requests.setdefault(text, None)
        seed += ask
    log(f"distill: {len(requests)} self-written requests, e.g. {list(requests)[:3]}")
    return list(requests)[: config.self_prompts]


def _closed(teacher: Teacher, written: list[int]) -> bool:
    return not teacher.eos_ids or written[-1] in teacher.eos_ids


def _chat(teacher: Teacher, prompt: str, system: str | None, *, reply: bool = True) -> str:
    if not teacher.chat_template:
        return prompt
    import jinja2

    messages = [{"role": "user", "content": prompt}]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    template = jinja2.Environment(autoescape=False).from_string(teacher.chat_template)
    return template.render(messages=messages, add_generation_prompt=reply, bos_token="")


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
    """``samples`` sequences (prompt + continuation, padded with -1) and the teacher's
    top-``TOP_K`` token ids and log-probabilities at each position; saved as they are made
    (every ``SAVE_EVERY`` samples, at most twice a minute) and resumed."""
    from tokenizers import Tokenizer

    path = config.work_dir / f"data-{config.data_key()}.npz"
    partial = path.with_suffix(".partial.npz")
    arrays = _load_arrays(path)
    if arrays is not None:
        return arrays
    length = config.prompt_tokens + config.new_tokens
    tokenizer = Tokenizer.from_file(str(teacher.tokenizer_dir / "tokenizer.json"))
    windows = _prompt_windows(prompt_texts(config, teacher, log), tokenizer, config)
    arrays = _load_arrays(partial) or {
        "tokens": np.full((config.samples, length), -1, np.int32),
        "top_ids": np.zeros((config.samples, length, TOP_K), np.int32),
        "top_logprobs": np.full((config.samples, length, TOP_K), -np.inf, np.float32),
        "done": np.zeros(config.samples, np.bool_),
        "prompt_length": np.zeros(config.samples, np.int32),
        # Sample i continues prompt window i mod n; its repeat i // n > 0 is sampled.
        "window": np.arange(config.samples, dtype=np.int32) % len(windows),
        "repeat": np.arange(config.samples, dtype=np.int32) // len(windows),
    }
    started, first, saved = time.monotonic(), int(arrays["done"].sum()), time.monotonic()
    waiting = [int(i) for i in np.flatnonzero(~arrays["done"])]
    # Greedy samples and sampled repeats go to the teacher in separate batches.
    for sampled in (False, True):
        rows = [i for i in waiting if bool(arrays["repeat"][i] > 0) == sampled]
        for at in range(0, len(rows), teacher.batch_size):
            batch = rows[at : at + teacher.batch_size]
            prompts = [windows[int(arrays["window"][i])] for i in batch]
            temperature = SAMPLE_TEMPERATURE if sampled else 0.0
            seed = config.seed * 1_000_003 + batch[0]
            added = teacher.continue_many(prompts, config.new_tokens, temperature, seed)
            sequences = [p + a for p, a in zip(prompts, added, strict=True)]
            top_ids, top_logprobs = teacher.top_logprobs_many(sequences)
            for j, (index, sequence) in enumerate(zip(batch, sequences, strict=True)):
                arrays["tokens"][index, : len(sequence)] = sequence
                arrays["top_ids"][index, : len(sequence)] = top_ids[j, : len(sequence)]
                arrays["top_logprobs"][index, : len(sequence)] = top_logprobs[j, : len(sequence)]
                arrays["done"][index] = True
                arrays["prompt_length"][index] = len(prompts[j])
            made = int(arrays["done"].sum())
            if (made - first) % SAVE_EVERY < len(batch) and time.monotonic() - saved > 30:
                _save_arrays(partial, arrays)
                saved = time.monotonic()
            if (made - first) % SAVE_EVERY < len(batch) or made == config.samples:
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
