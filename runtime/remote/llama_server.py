"""llama.cpp's ``llama-server`` as the remote target: found by its ``GET /props`` (slots, each
slot's context, the chat format), verified by batched prompts (:mod:`.prompt_batch`) on
``POST /completion``, and priced by the measured cost of a round of w prompts.

A round that drafted d_1..d_k after the committed history H sends the prompts H, H + d_1, ...,
H + d_1..d_k in one request with token-id prompts (no BOS added), ``n_predict`` 1,
``return_tokens`` and ``cache_prompt``: each slot reuses its KV cache by longest common prefix,
so a later round computes about (k + 1)(k + 2) / 2 new tokens whatever the length of the
history. Its answer names token ids and reports per prompt the tokens it computed
(``timings.prompt_n``) and its time. Sampled rounds ask for ``n_probs`` = top-k with
``post_sampling_probs``: the distribution it samples from, whole when top-k bounds its support.

Devices that start together share the slots: a probe round that finds its history gone is
retried, and refused as the server's setting only while no other client's work shows in
``GET /slots``.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, RemoteError, RemoteUnavailableError
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.prompt_batch import NextToken, PromptBatchVerifier
from edgespec.runtime.remote.target import OpenAIConnection
from edgespec.runtime.remote.transport import Peer, TrafficMeter, raise_for_status
from edgespec.runtime.remote.vocabulary import probe_history

#: The most tokens of a sampled distribution llama-server is asked to return per position: its
#: support is whole only when top-k is at most this.
MAX_SAMPLED_SUPPORT = 256
#: What llama-server's answer is trimmed to (``response_fields``): its generation settings and
#: prompt echo would otherwise make every answer kilobytes long.
LLAMA_SERVER_FIELDS = (
    "index",
    "tokens",
    "stop_type",
    "completion_probabilities",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/predicted_ms",
)
#: Timed rounds per width when measuring the engine's round cost (the fastest one counts).
COST_REPEATS = 2


log = logging.getLogger(__name__)
#: A round of 5 prompts priced above this many one-prompt rounds: the server's passes widen at a
#: price (a CPU server; a GPU's is about 1.4), which the device is told at connection.
STEEP_ROUND_COST = 2.0


def detect(target: OpenAIConnection) -> LlamaServerEngine | None:
    """llama-server when ``GET /props`` answers as it does."""
    props = llama_server_props(target)
    return None if props is None else LlamaServerEngine(target, props)


class LlamaServerEngine:
    """llama-server behind an ``OpenAITarget``: k up to its slots less one (a round takes
    k + 1), generations up to one slot's context, rounds priced by its measured T(w)."""

    name = "llama-server"
    #: It returns the distribution it samples from (``post_sampling_probs``).
    greedy_only = False

    def __init__(self, target: OpenAIConnection, props: LlamaServerProps) -> None:
        self.target = target
        self.props = props

    def info(self, described: ServerInfo) -> ServerInfo:
        props, target = self.props, self.target
        if props.total_slots < 2:
            raise RemoteError(
                f"llama-server at {target.url} has {props.total_slots} slot: a verification "
                "round sends k + 1 prompts at once and needs at least 2",
                fix="restart it with -np 5 -c 10240 --no-cache-idle-slots (k + 1 slots for "
                "each device that drafts k tokens, no --kv-unified; docs/serving.md)",
            )
        max_k = min(described.max_k, props.total_slots - 1)
        max_length = described.max_length
        if props.slot_context:
            given = max_length if target.max_length_given else props.slot_context
            max_length = min(given, props.slot_context)
        step_s, verify_cost = llama_server_round_cost(target, max_k)
        if len(verify_cost) >= 5 and verify_cost[4] > STEEP_ROUND_COST:
            log.warning(
                "llama-server at %s prices a round of 5 prompts at %.1f one-prompt rounds (a "
                "CPU server): verifying there can be slower than the server decoding alone, and "
                "its CPU kernels are not batch invariant, so greedy output can part from its "
                "own where two tokens nearly tie (docs/serving.md)",
                target.url,
                verify_cost[4],
            )
        return replace(
            described,
            max_length=max_length,
            max_k=max_k,
            target_step_s=step_s,
            verify_cost=verify_cost,
        )

    def verifier(self, pieces: TokenPieces) -> PromptBatchVerifier:
        target = self.target
        info = target.info()
        return PromptBatchVerifier(
            round_request=lambda prompts, sampling, meter, uncached: llama_server_round(
                target, prompts, sampling, meter, timeout_s=target.round_deadline(uncached)
            ),
            max_length=info.max_length,
            suggested_k=info.max_k,
            sampled=True,
            sampled_fix="",
            check_sampling=sampled_support_size,
        )


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


def llama_server_props(target: Peer) -> LlamaServerProps | None:
    """llama-server's ``/props``, or None when the engine is another one (no such route)."""
    try:
        exchange = target.request("GET", "/props", retry=False)
    except RemoteUnavailableError:
        return None  # the models route, asked next with retries, says whether it is down
    return LlamaServerProps.from_json(exchange.data) if exchange.status == 200 else None


def sampled_support_size(sampling: SamplingConfig) -> int:
    """How many tokens of the distribution a sampled round must get back: top-k, which bounds
    the engine's sampling support. Raises when top-k does not bound it."""
    if not 0 < sampling.top_k <= MAX_SAMPLED_SUPPORT:
        raise ConfigError(
            f"sampled verification on llama-server needs the whole distribution it samples "
            f"from, which it returns only when top-k bounds it (top-k {sampling.top_k})",
            fix=f"pass --top-k between 1 and {MAX_SAMPLED_SUPPORT} (e.g. --top-k 40), or use "
            "temperature 0",
        )
    return sampling.top_k


def llama_server_body(prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> dict[str, Any]:
    """The ``/completion`` body of one round. Every sampler the server might apply by default
    (penalties, min-p, DRY, XTC, ...) is named off, so its distribution is edgespec's transform:
    temperature, then top-k, then top-p."""
    body: dict[str, Any] = {
        "prompt": [list(prompt) for prompt in prompts],
        "n_predict": 1,
        "cache_prompt": True,
        "return_tokens": True,
        "stream": False,
        "response_fields": list(LLAMA_SERVER_FIELDS),
        "repeat_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "dry_multiplier": 0.0,
        "xtc_probability": 0.0,
        "min_p": 0.0,
        "typical_p": 1.0,
        "top_n_sigma": -1.0,
        "mirostat": 0,
    }
    if sampling.greedy:
        # Temperature 0 keeps the top logit alone: the server's own greedy choice.
        body.update(temperature=0.0, samplers=["temperature"])
    else:
        body.update(
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            samplers=["temperature", "top_k", "top_p"],
            n_probs=sampled_support_size(sampling),
            post_sampling_probs=True,
        )
    return body


def llama_server_round(
    target: Peer,
    prompts: Sequence[Sequence[int]],
    sampling: SamplingConfig,
    meter: TrafficMeter,
    *,
    timeout_s: float | None = None,
) -> list[NextToken]:
    """The next token after each of ``prompts`` (in order), from one ``POST /completion``
    (``timeout_s``: its deadline, when the round's work needs more than the connection's)."""
    body = llama_server_body(prompts, sampling)
    exchange = meter.record(target.request("POST", "/completion", body, timeout_s=timeout_s))
    raise_for_status(exchange, "a verification request", peer=target.peer)
    results = exchange.data if isinstance(exchange.data, list) else [exchange.data]
    if len(results) != len(prompts):
        raise RemoteError(
            f"{target.peer} answered {len(results)} of {len(prompts)} prompts of a round"
        )
    try:
        ordered = sorted(results, key=lambda result: int(result.get("index", 0)))
        return [_llama_server_next(result, sampled=not sampling.greedy) for result in ordered]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise RemoteError(
            f"{target.peer}'s answer to a round is not llama-server's ({error!r})",
            fix="serve the target on llama.cpp's llama-server, vLLM or 'edgespec serve'",
        ) from error


def _llama_server_next(result: dict[str, Any], *, sampled: bool) -> NextToken:
    tokens = result["tokens"]
    if len(tokens) != 1:
        raise ValueError(f"{len(tokens)} tokens for one prompt")
    support: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    if sampled:
        top = result["completion_probabilities"][0]["top_probs"]
        support = tuple(int(entry["id"]) for entry in top)
        probs = tuple(float(entry["prob"]) for entry in top)
    prompt_ms = result.get("timings/prompt_ms")
    predicted_ms = result.get("timings/predicted_ms")
    return NextToken(
        token=int(tokens[0]),
        support=support,
        probs=probs,
        computed=int(result.get("timings/prompt_n", -1)),
        server_ms=None if prompt_ms is None else float(prompt_ms) + float(predicted_ms or 0.0),
    )


def llama_server_round_cost(target: Peer, max_k: int) -> tuple[float, tuple[float, ...]]:
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
    target: Peer, prompts: list[list[int]], history: list[int], meter: TrafficMeter
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


def _others_at_work(target: Peer) -> bool:
    """Whether ``/slots`` shows a slot processing now (this probe's rounds have returned, so
    the work is another client's); False where the server does not answer it."""
    exchange = target.request("GET", "/slots", retry=False)
    slots = exchange.data if exchange.status == 200 else None
    return isinstance(slots, list) and any(
        isinstance(slot, dict) and slot.get("is_processing") for slot in slots
    )


def _round_ms(answers: Sequence[NextToken]) -> float:
    return max((answer.server_ms or 0.0) for answer in answers)
