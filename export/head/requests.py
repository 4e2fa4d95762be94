"""The requests a head's target answers for its training data: the built-in mix (chat
requests, code tasks, edits of standard-library functions) and requests the target writes
itself, each through the target's chat template; never a benchmark or held-out prompt."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import numpy as np

from edgespec.export.distill.config import BUILTIN_CODE_TASKS, BUILTIN_SUBJECTS, BUILTIN_TEMPLATES
from edgespec.export.distill.edit_prompts import edit_requests
from edgespec.export.head.data import SAMPLED_TEMPERATURE, FeatureTeacher, Log

#: Requests kept out of training: the head's acceptance by draft position is measured on them.
HELD_OUT = 16


def requests(edit_prompts: int, seed: int) -> list[str]:
    """The built-in mix: chat requests, code tasks, edits of standard-library functions;
    shuffled by ``seed``. None of them is a benchmark prompt (benchmarks/prompts)."""
    texts = [t.format(s) for t in BUILTIN_TEMPLATES for s in BUILTIN_SUBJECTS]
    texts += [f"Write a Python function that {task}." for task in BUILTIN_CODE_TASKS]
    texts += edit_requests(edit_prompts, seed)
    order = np.random.default_rng(seed).permutation(len(texts))
    return [texts[i] for i in order]


def chat_prompt(template: str | None, request: str, *, reply: bool = True) -> str:
    """``request`` as the user's message through ``template``, opening the assistant's turn
    (``reply``) or not."""
    if not template:
        return request
    import jinja2

    messages = [{"role": "user", "content": request}]
    rendered = jinja2.Environment(autoescape=False).from_string(template)
    return rendered.render(messages=messages, add_generation_prompt=reply, bos_token="")


def benchmark_prompts() -> frozenset[str]:
    """Every prompt of the package's benchmark sets (``edgespec bench --prompts``), stripped:
    none may enter a head's training data."""
    from importlib.resources import files

    found: set[str] = set()
    for entry in (files("edgespec") / "data" / "prompts").iterdir():
        if entry.name.endswith(".json"):
            for item in json.loads(entry.read_text(encoding="utf-8")):
                found.add((item["prompt"] if isinstance(item, dict) else item).strip())
    return frozenset(found)


#: Stands in for the user's message while the template is rendered; the text before it is
#: the user turn's opening.
_MARK = "\x00USER\x00"
#: Tokens a self-written request may take (longer ones are dropped: the turn did not close).
SELF_REQUEST_TOKENS = 48


def self_written_requests(
    teacher: FeatureTeacher,
    template: str | None,
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
    count: int,
    *,
    seed: int,
    excluded: frozenset[str],
    log: Log,
) -> list[str]:
    """Up to ``count`` distinct user requests the target writes itself after its template's
    user-turn opening (sampled, kept where it closed the turn: Magpie's trick, requests like
    its users'), none of them in ``excluded``. Tries at most four times ``count``."""
    if count <= 0 or not template:
        return []
    opening = encode(chat_prompt(template, _MARK, reply=False).split(_MARK)[0])
    found: dict[str, None] = {}
    started = time.monotonic()
    for attempt in range(4 * count):
        if len(found) >= count:
            break
        rng = np.random.default_rng(seed * 1_000_003 + attempt)
        written = teacher.written(
            opening, SELF_REQUEST_TOKENS, temperature=SAMPLED_TEMPERATURE, rng=rng
        )
        text = decode(written).strip() if written else ""
        if len(text) >= 8 and text not in excluded:
            found.setdefault(text, None)
        if (attempt + 1) % 100 == 0:
            rate = (attempt + 1) / max(time.monotonic() - started, 1e-9)
            log(f"head: {len(found)} self-written requests of {count} ({rate:.1f} tries/s)")
    requests = list(found)
    log(f"head: {len(requests)} self-written requests, e.g. {requests[:3]}")
    return requests
