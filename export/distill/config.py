"""What ``edgespec distill`` is asked for, and the constants of its stages."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgespec.errors import ConfigError

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
    #: The system message chat prompts are rendered with (None: the template's own default).
    system_prompt: str | None = None
    #: User requests the target writes itself (sampled from its chat template's user turn)
    #: and then answers, beside the built-in mix: varied prompts without a corpus.
    self_prompts: int = 0
    #: Edit requests ("rewrite this function ...") around standard-library functions in the
    #: built-in mix: answers that copy their prompt, as edits and refactors do.
    edit_prompts: int = 32
    #: A draft to start from (a Hugging Face directory or a draft GGUF): another round of
    #: training on new data (another --seed) continues where an earlier run stopped.
    init: Path | None = None
    #: Tokens the draft's head scores (its N most frequent in the target's continuations,
    #: and the end-of-turn tokens); 0: the whole vocabulary. GGUF targets.
    output_vocabulary: int = 0
    #: False: stop at the draft's GGUF (or Hugging Face directory) without importing it, for
    #: a training machine that lacks the exporter's checks (llama.cpp); import it elsewhere.
    export_bundle: bool = True

    def __post_init__(self) -> None:
        for name in ("self_prompts", "edit_prompts", "output_vocabulary"):
            if getattr(self, name) < 0:
                flag = f"--{name.replace('_', '-')}"
                raise ConfigError(f"{flag} is {getattr(self, name)}", fix="use 0 or more")
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
        keys = (
            *("target", "samples", "prompt_tokens", "new_tokens", "seed", "extra_prompts"),
            *("system_prompt", "self_prompts", "edit_prompts"),
        )
        payload: dict[str, Any] = {k: str(getattr(self, k)) for k in keys}
        payload["corpus"] = [str(p) for p in self.corpus]
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
