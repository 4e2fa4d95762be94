"""What an OpenAI-compatible engine is and what it allows, asked before any generation: which
engine answers (llama-server by its ``GET /props``, vLLM by ``owned_by`` in ``GET /v1/models``),
its slots and context per slot, whether its tokenizer is the draft's (``POST /tokenize`` of a
probe text), and the cost of a round of w prompts on it (measured with a probe history)."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.config import SamplingConfig
from edgespec.errors import IncompatiblePairError, RemoteError, RemoteUnavailableError
from edgespec.runtime.verifiers.engine_rounds import NextToken, llama_server_round
from edgespec.runtime.verifiers.http import Connection, TrafficMeter

#: The engines told apart: llama.cpp's server, vLLM, and other engines that echo prompts with
#: log-probabilities (llama-cpp-python's server).
LLAMA_SERVER, VLLM, ECHO = "llama-server", "vllm", "echo"
#: The engines that verify by batched prompts (``prompt_batch``); the others echo.
BATCHED_PROMPT_ENGINES = frozenset({LLAMA_SERVER, VLLM})
#: Text whose tokenization tells two tokenizers apart: code, digits, accents, CJK, emoji.
VOCABULARY_PROBE = (
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 1234567 Grüße, "
    "東京 🙂\n\nThe quick brown fox jumps over the lazy dog."
)
#: Timed rounds per width when measuring the engine's round cost (the fastest one counts).
COST_REPEATS = 2


@dataclass(frozen=True, kw_only=True)
class LlamaServerProps:
    """What ``GET /props`` tells: slots, each slot's context, and the chat format's parts."""

    total_slots: int
    slot_context: int
    chat_template: str
    bos_token: str
    eos_token: str

    @classmethod
    def from_json(cls, data: Any) -> LlamaServerProps | None:
        """None when ``data`` is not llama-server's answer."""
        if not isinstance(data, dict) or "total_slots" not in data:
            return None
        settings = data.get("default_generation_settings") or {}
        return cls(
            total_slots=int(data["total_slots"]),
            slot_context=int(settings.get("n_ctx") or 0),
            chat_template=str(data.get("chat_template") or ""),
            bos_token=str(data.get("bos_token") or ""),
            eos_token=str(data.get("eos_token") or ""),
        )


def llama_server_props(target: Connection) -> LlamaServerProps | None:
    """llama-server's ``/props``, or None when the engine is another one (no such route)."""
    try:
        exchange = target.request("GET", "/props", retry=False)
    except RemoteUnavailableError:
        return None  # the models route, asked next with retries, says whether it is down
    return LlamaServerProps.from_json(exchange.data) if exchange.status == 200 else None


def is_vllm(models: Any) -> bool:
    entries = models.get("data") if isinstance(models, dict) else None
    return any(
        isinstance(entry, dict) and entry.get("owned_by") == "vllm" for entry in entries or ()
    )


def check_vocabulary(target: Connection, model: str, draft_ids: list[int]) -> None:
    """Raises :class:`IncompatiblePairError` when the engine tokenizes
    :data:`VOCABULARY_PROBE` into other ids than the draft's tokenizer (``draft_ids``): drafted
    token ids would then name other tokens there. Engines without ``/tokenize`` are not asked.
    """
    # One body both engines read: llama-server's "content"/"add_special", vLLM's "prompt"/
    # "add_special_tokens" (each ignores the other's fields).
    body = {
        "content": VOCABULARY_PROBE,
        "add_special": False,
        "model": model,
        "prompt": VOCABULARY_PROBE,
        "add_special_tokens": False,
    }
    exchange = target.request("POST", "/tokenize", body, retry=False)
    tokens = exchange.data.get("tokens") if isinstance(exchange.data, dict) else None
    if exchange.status != 200 or not isinstance(tokens, list):
        return
    served = [int(token["id"]) if isinstance(token, dict) else int(token) for token in tokens]
    if served != draft_ids:
        first = next(
            (
                i
                for i, pair in enumerate(zip(served, draft_ids, strict=False))
                if len(set(pair)) > 1
            ),
            min(len(served), len(draft_ids)),
        )
        raise IncompatiblePairError(
            f"the served model's tokenizer is not the draft's: a probe text tokenizes into "
            f"{len(served)} ids there and {len(draft_ids)} here, first differing at token "
            f"{first}",
            fix="draft with a model of the served model's family (the same tokenizer), or "
            "serve the target the draft was made for",
        )


def probe_history(target: Connection, length: int = 32) -> list[int]:
    """Token ids of the probe text by the engine's own tokenizer, ``length`` of them."""
    exchange = target.request("POST", "/tokenize", {"content": VOCABULARY_PROBE}, retry=False)
    tokens = exchange.data.get("tokens") if isinstance(exchange.data, dict) else None
    if exchange.status != 200 or not tokens:
        raise RemoteError(f"{target.peer} did not tokenize a probe text")
    ids = [int(token["id"]) if isinstance(token, dict) else int(token) for token in tokens]
    return (ids * (length // len(ids) + 1))[:length]


def llama_server_round_cost(target: Connection, max_k: int) -> tuple[float, tuple[float, ...]]:
    """The engine's seconds for a round of one prompt, T(1), and T(w)/T(1) for rounds of
    w = 1..max_k + 1 prompts, each computing what a round computes after a prefilled probe
    history: the fastest of :data:`COST_REPEATS` rounds per w, by the engine's own timings.

    Raises :class:`RemoteError` when a round recomputes the history: the server then clears
    idle slots (``--kv-unified`` with its default ``--cache-idle-slots``), so every round
    would cost the whole history."""
    history = probe_history(target)
    meter = TrafficMeter()
    greedy = SamplingConfig()
    # The history into every slot a round may use (as a generation's first round does).
    llama_server_round(target, [history] * (max_k + 1), greedy, meter)
    best = [float("inf")] * (max_k + 1)
    for repeat in range(COST_REPEATS):
        # Drafted tokens differ every repeat, so no slot holds a round's prompts already.
        drafted = [history[(repeat * 7 + 3 * i) % len(history)] for i in range(max_k)]
        for width in range(1, max_k + 2):
            prompts = [history + drafted[:i] for i in range(width)]
            answers = _round_in_kept_slots(target, prompts, history, meter)
            best[width - 1] = min(best[width - 1], _round_ms(answers))
    step_ms = max(best[0], 1e-3)
    return step_ms / 1000.0, tuple(ms / step_ms for ms in best)


#: Tries of a probe round whose slots other clients' rounds took (a jittered wait before each).
SLOT_TRIES = 4


def _round_in_kept_slots(
    target: Connection, prompts: list[list[int]], history: list[int], meter: TrafficMeter
) -> list[NextToken]:
    """A probe round whose prompts find the history in their slots (or, while other clients
    keep taking them, the last try's).

    A round that recomputes the history means its slots lost it: either the server clears
    idle slots (every round, whoever else uses it), or other devices' rounds landed in them
    (devices that start together share the slots). The second passes: the history goes back
    in and the round is tried again after a jittered wait, and while another client's work
    shows in ``/slots`` a taken round is only counted, never refused. Only a round that
    recomputes with no other client at work is the server's setting."""
    greedy = SamplingConfig()
    others = False
    for attempt in range(SLOT_TRIES):
        answers = llama_server_round(target, prompts, greedy, meter)
        if max(answer.computed for answer in answers) < len(history):
            return answers
        others = others or _others_at_work(target)
        time.sleep(random.uniform(0.05, 0.25) * (attempt + 1))
        llama_server_round(target, [history] * len(prompts), greedy, meter)
    if others:
        return answers  # timed while shared: the k policy learns the real rounds
    raise RemoteError(
        f"llama-server at {target.url} recomputes the whole history in every round: it clears "
        "idle slots (--kv-unified with --cache-idle-slots, its default)",
        fix="restart it with --no-cache-idle-slots (or without --kv-unified); docs/serving.md "
        "has the flags",
    )


def _others_at_work(target: Connection) -> bool:
    """Whether ``/slots`` shows a slot processing now (this probe's rounds have returned, so
    the work is another client's); False where the server does not answer it."""
    exchange = target.request("GET", "/slots", retry=False)
    slots = exchange.data if exchange.status == 200 else None
    return isinstance(slots, list) and any(
        isinstance(slot, dict) and slot.get("is_processing") for slot in slots
    )


def _round_ms(answers: Sequence[NextToken]) -> float:
    return max((answer.server_ms or 0.0) for answer in answers)
