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
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgespec.config import ExportConfig
from edgespec.errors import ConfigError, ModelSourceError
from edgespec.manifest import Bundle, load_bundle

#: Teacher probabilities kept per position (renormalised): enough mass for greedy agreement.
TOP_K = 32
SAVE_EVERY = 16
CHECKPOINT_EVERY = 25
HELD_OUT_SHARE = 0.1
#: Draft positions scored in the evaluation (edgespec's largest k).
EVAL_K = 8
#: Continuations of a prompt seen again (more samples than prompt windows) are sampled at
#: this temperature, so repeats add new text.
SAMPLE_TEMPERATURE = 0.8
#: The built-in prompt mix: requests made from these templates and subjects. It shares no
#: prompt with the benchmark sets (``edgespec bench --prompts chat|chat-edit|code``), so a
#: draft trained on it can be measured on them.
BUILTIN_TEMPLATES = (
    "Explain {} in simple terms.",
    "Write a short poem about {}.",
    "Give me three facts about {}.",
    "What are the pros and cons of {}?",
    "Summarize the history of {} in a few sentences.",
    "How would you teach {} to a ten-year-old?",
)
BUILTIN_SUBJECTS = (
    "photosynthesis",
    "the moon",
    "volcanoes",
    "the internet",
    "bicycles",
    "coffee",
    "the ocean",
    "electric cars",
    "chess",
    "honey bees",
    "rainbows",
    "the Roman Empire",
    "recycling",
    "jazz music",
    "vaccines",
    "black holes",
    "gardening",
    "sleep",
    "remote work",
    "the printing press",
    "solar panels",
    "dinosaurs",
    "mountains",
    "tea",
)
BUILTIN_CODE_TASKS = (
    "returns the largest of three numbers",
    "counts the vowels in a string",
    "checks whether a word is a palindrome",
    "merges two sorted lists",
    "computes the factorial of n",
    "removes duplicates from a list while keeping order",
    "converts Celsius to Fahrenheit",
    "returns the n-th Fibonacci number",
    "flattens a nested list",
    "counts word frequencies in a text",
    "checks whether a number is prime",
    "reverses the words of a sentence",
)

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class DistillConfig:
    """``edgespec distill`` options (see ``edgespec distill --help``)."""

    target: str
    out: Path
    corpus: tuple[Path, ...] = ()
    samples: int = 256
    prompt_tokens: int = 64
    new_tokens: int = 64
    steps: int = 400
    batch: int = 8
    hidden: int = 256
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 768
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    max_minutes: float | None = None
    force: bool = False
    work: Path | None = None
    extra_prompts: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in ("samples", "prompt_tokens", "new_tokens", "steps", "batch", "layers"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"--{name.replace('_', '-')} is {getattr(self, name)}", fix="use 1 or more"
                )
        if self.samples < 2:
            raise ConfigError("--samples is 1", fix="use at least 2 (one is held out)")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ConfigError(
                f"--hidden {self.hidden}, --heads {self.heads}, --kv-heads {self.kv_heads} do "
                "not divide",
                fix="hidden must be a multiple of heads, heads a multiple of kv-heads",
            )
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError(f"--max-minutes is {self.max_minutes}", fix="use a positive number")

    @property
    def work_dir(self) -> Path:
        return self.work or self.out.parent / f".{self.out.name}.distill-work"

    def data_key(self) -> str:
        """What the data depend on: a resumed run must not mix data of other settings."""
        keys = ("target", "samples", "prompt_tokens", "new_tokens", "seed", "extra_prompts")
        payload: dict[str, Any] = {k: str(getattr(self, k)) for k in keys}
        payload["corpus"] = [str(p) for p in self.corpus]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


# -- teachers ------------------------------------------------------------------------------


class Teacher:
    """The target as a teacher: greedy continuations and next-token logits."""

    vocab_size: int
    tokenizer_dir: Path  # tokenizer.json (and tokenizer_config.json) of the target
    chat_template: str | None
    description: str

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        raise NotImplementedError

    def logits(self, tokens: list[int]) -> np.ndarray:
        """[len(tokens), vocab] float32."""
        raise NotImplementedError

    def continue_sampled(
        self, prompt: list[int], count: int, temperature: float, seed: int
    ) -> list[int]:
        """``count`` tokens sampled at ``temperature`` (one full pass per token: simple, and
        the data stage is a small part of a distillation)."""
        rng = np.random.default_rng(seed)
        tokens = list(prompt)
        for _ in range(count):
            tokens.append(_sample(self.logits(tokens)[-1], temperature, rng))
        return tokens[len(prompt) :]


def _sample(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    scaled = logits.astype(np.float64) / temperature
    probabilities = np.exp(scaled - scaled.max())
    return int(rng.choice(len(probabilities), p=probabilities / probabilities.sum()))


class TorchTeacher(Teacher):
    def __init__(self, directory: Path, device: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        self.model.to(device).eval()  # type: ignore[arg-type]
        self.device = device
        self.vocab_size = int(self.model.config.vocab_size)
        self.tokenizer_dir = directory
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template = config.get("chat_template")
        self.description = f"Hugging Face model {directory.name} (torch)"

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        ids = self.torch.tensor([prompt], device=self.device)
        with self.torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=self.torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=count,
                pad_token_id=self.model.config.eos_token_id or 0,
            )
        return [int(t) for t in out[0, len(prompt) :]]

    def logits(self, tokens: list[int]) -> np.ndarray:
        with self.torch.no_grad():
            out = self.model(input_ids=self.torch.tensor([tokens], device=self.device)).logits
        return np.asarray(out[0].float().cpu().numpy())


class OnnxTeacher(Teacher):
    """A GGUF bundle (in-place KV graph) run with ONNX Runtime, as its export checks run it."""

    def __init__(self, bundle: Bundle) -> None:
        from types import SimpleNamespace

        from edgespec.export.gguf.check import GraphRunner

        if bundle.manifest.graph.kv_sharing != "shared":
            raise ModelSourceError(
                f"{bundle.root} is not a GGUF import; a bundle teacher must be one",
                fix="pass the Hugging Face directory or the GGUF file the bundle came from",
            )
        model = bundle.manifest.model
        shape = SimpleNamespace(
            architecture=SimpleNamespace(
                num_layers=model.num_layers,
                num_kv_heads=model.num_kv_heads,
                head_dim=model.head_dim,
            )
        )
        self.runner = GraphRunner(
            bundle.graph_path,
            shape,  # type: ignore[arg-type]
            capacity=model.max_length,
            min_width=bundle.manifest.graph.min_pass_width,
        )
        self.vocab_size = bundle.manifest.model.vocab_size
        self.tokenizer_dir = bundle.root
        self.max_length = model.max_length
        config_path = bundle.root / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.chat_template = config.get("chat_template")
        self.description = f"bundle {bundle.root.name} (ONNX Runtime)"

    def continue_greedy(self, prompt: list[int], count: int) -> list[int]:
        return self.runner.greedy(prompt, count)

    def continue_sampled(
        self, prompt: list[int], count: int, temperature: float, seed: int
    ) -> list[int]:
        rng = np.random.default_rng(seed)
        cache = self.runner.empty()
        logits = self.runner.forward(prompt, 0, cache)
        produced: list[int] = []
        while True:
            produced.append(_sample(logits[-1], temperature, rng))
            if len(produced) == count:
                return produced
            logits = self.runner.forward(produced[-1:], len(prompt) + len(produced) - 1, cache)

    def logits(self, tokens: list[int]) -> np.ndarray:
        return self.runner.forward(tokens, 0, self.runner.empty())


def load_teacher(config: DistillConfig, log: Log) -> Teacher:
    """A Hugging Face directory, a GGUF import bundle, or a GGUF file (imported into the work
    directory once)."""
    from edgespec.export.gguf.pipeline import export_gguf, is_gguf_source

    target = Path(config.target)
    if is_gguf_source(config.target) and not (target / "manifest.json").is_file():
        imported = config.work_dir / "target-bundle"
        if not (imported / "manifest.json").is_file():
            log(f"distill: importing {target.name} (once) ...")
            export_gguf(ExportConfig(model=config.target, out=imported, force=True))
        return OnnxTeacher(load_bundle(imported))
    if (target / "manifest.json").is_file():
        return OnnxTeacher(load_bundle(target))
    if (target / "config.json").is_file():
        return TorchTeacher(target, config.device)
    raise ModelSourceError(
        f"{config.target} is not a Hugging Face model directory, a GGUF file or a bundle",
        fix="pass the target's directory (with config.json), its .gguf file, or its bundle",
    )


# -- data ----------------------------------------------------------------------------------


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
            timing = _eta(started, made - first, config.samples - made)
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


def _eta(started: float, done: int, left: int) -> str:
    if done <= 0:
        return ""
    rate = (time.monotonic() - started) / done
    return f"({rate:.2f} s each, ~{rate * left / 60:.1f} min left)"


# -- training ------------------------------------------------------------------------------


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
    window: list[float] = []
    draft.train()
    while state.step < config.steps:
        rows = np.random.default_rng(config.seed * 1_000_003 + state.step).choice(
            train_rows, size=min(config.batch, len(train_rows)), replace=False
        )
        loss = _loss(draft, arrays, rows, config.device)
        for group in optimizer.param_groups:
            group["lr"] = _lr(state.step, config)
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
            log(
                f"distill: step {state.step}/{config.steps} loss {state.losses[-1]:.3f} "
                f"{_eta(started, state.step, config.steps - state.step)}"
            )
        if out_of_time:
            log(f"distill: --max-minutes reached at step {state.step}; rerun to resume")
            break
    draft.eval()
    return state


def _loss(draft: Any, arrays: dict[str, np.ndarray], rows: np.ndarray, device: str) -> Any:
    import torch

    tokens = torch.from_numpy(arrays["tokens"][rows].astype(np.int64)).to(device)
    valid = tokens >= 0
    logits = draft(input_ids=tokens.clamp(min=0), attention_mask=valid.long()).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, T, vocab]
    ids = torch.from_numpy(arrays["top_ids"][rows].astype(np.int64)).to(device)
    teacher = torch.from_numpy(arrays["top_logprobs"][rows]).to(device)
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


def _lr(step: int, config: DistillConfig) -> float:
    warmup = max(1, min(20, config.steps // 10))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
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


def acceptance_by_position(
    config: DistillConfig, draft: Any, arrays: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Greedy speculation at k = ``EVAL_K`` simulated along the target's greedy continuation
    of each held-out sample: a draft token is accepted while it equals the target's. Draft
    proposals on an accepted prefix see exactly the target's tokens, so one teacher-forced
    pass gives them. Returns alpha (accepted / tested) and alpha at each draft position."""
    import torch

    held = _split(config, arrays)[1]
    offered, accepted = [0] * EVAL_K, [0] * EVAL_K
    for row in held:
        sequence = [int(t) for t in arrays["tokens"][row] if t >= 0]
        with torch.no_grad():
            logits = draft(input_ids=torch.tensor([sequence], device=config.device)).logits[0]
        guesses = logits.argmax(-1).tolist()  # guesses[i] predicts sequence[i + 1]
        position = config.prompt_tokens - 1
        end = len(sequence) - 1
        while position < end:
            kept = 0
            while kept < EVAL_K and position + kept < end:
                offered[kept] += 1
                if guesses[position + kept] != sequence[position + kept + 1]:
                    break
                accepted[kept] += 1
                kept += 1
            position += kept + 1
    tested = sum(offered)
    return {
        "alpha": sum(accepted) / tested if tested else None,
        "alpha_by_position": [a / o if o else None for a, o in zip(accepted, offered, strict=True)],
        "held_out_samples": len(held),
        "measured_as": "greedy speculation at k 8 along the target's own continuations",
    }


# -- the whole run -------------------------------------------------------------------------


def distill(config: DistillConfig, *, log: Log) -> Bundle:
    """Runs every stage (each resumed from the work directory) and exports the draft."""
    from edgespec.export.bundle import check_output_free
    from edgespec.export.pipeline import export_bundle

    check_output_free(config.out.absolute(), force=config.force)
    try:
        config.work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(
            f"cannot write the work directory {config.work_dir} ({error.strerror})",
            fix="pass an --out in a writable place",
        ) from error
    teacher = load_teacher(config, log)
    log(f"distill: teacher {teacher.description}, vocabulary {teacher.vocab_size}")
    arrays = build_data(config, teacher, log)
    tokenizer_config = _tokenizer_config(teacher)
    draft = new_draft(config, teacher, tokenizer_config)
    parameters = sum(p.numel() for p in draft.parameters())
    log(f"distill: draft {parameters / 1e6:.1f}M parameters")
    state = train(config, draft, arrays, log)
    evaluation = acceptance_by_position(config, draft, arrays)
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
            "hidden": config.hidden,
            "layers": config.layers,
            "heads": config.heads,
            "kv_heads": config.kv_heads,
            "intermediate": config.intermediate,
        },
        "evaluation": evaluation,
        "c": None,
        "recommended_k": None,
    }
    log("distill: exporting the draft ...")
    return export_bundle(
        ExportConfig(
            model=str(draft_dir),
            out=config.out,
            quant="fp32",
            force=config.force,
            extra={"distillation": record},
        )
    )


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
