"""vLLM as the remote target: found by ``owned_by`` "vllm" in ``GET /v1/models``, verified by
batched prompts (:mod:`.prompt_batch`) on ``POST /v1/completions``: the k + 1 prompts
"history + the first i drafted tokens" as token-id lists, ``max_tokens`` 1, temperature 0,
``logprobs`` 1 and ``return_tokens_as_token_ids``. Greedy only: its log-probabilities are not
the distribution it samples from.

vLLM's prefix cache keeps whole blocks (``--block-size``; 128 tokens by default on the CPU
build, 32 the smallest), so each prompt of a round recomputes its tail past the history's last
full block: about (k + 1) * (history mod block) + (k + 1)(k + 2) / 2 tokens a round. The k + 1
prompts share the history's full blocks (one copy of its KV per device).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from edgespec.errors import RemoteError
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.remote.pieces import TOKEN_ID_KEY, TokenPieces
from edgespec.runtime.remote.prompt_batch import NextToken, PromptBatchVerifier
from edgespec.runtime.remote.target import OpenAIConnection
from edgespec.runtime.remote.transport import Peer, TrafficMeter, raise_for_status
from edgespec.runtime.remote.vocabulary import probe_history

#: The probe history's length: two of the smallest blocks, so that how much of a prompt's
#: tail vLLM recomputes depends on its block size as a generation's would.
PROBE_HISTORY = 80
#: Timed rounds per width (the fastest one counts).
COST_REPEATS = 2


def detect(target: OpenAIConnection) -> VllmEngine | None:
    """vLLM when its model listing says so."""
    return VllmEngine(target) if is_vllm(target.models()) else None


class VllmEngine:
    """vLLM behind an ``OpenAITarget``: greedy rounds by batched token-id prompts."""

    name = "vllm"
    greedy_only = True

    def __init__(self, target: OpenAIConnection) -> None:
        self.target = target

    def info(self, described: ServerInfo) -> ServerInfo:
        """The engine's cost of a round of w prompts, measured at connection (wall clock less
        the round trip: vLLM reports no timings per request)."""
        step_s, verify_cost = vllm_round_cost(self.target, described.max_k)
        return replace(described, target_step_s=step_s, verify_cost=verify_cost)

    def verifier(self, pieces: TokenPieces) -> PromptBatchVerifier:
        target = self.target
        info = target.info()
        return PromptBatchVerifier(
            round_request=lambda prompts, sampling, meter, uncached: openai_prompts_round(
                target, target.model, prompts, meter, timeout_s=target.round_deadline(uncached)
            ),
            max_length=info.max_length,
            suggested_k=info.max_k,
            sampled=False,
            sampled_fix="use temperature 0 with vLLM (its log-probabilities are not the "
            "distribution it samples from), or verify on llama-server or 'edgespec serve'",
        )


def is_vllm(models: Any) -> bool:
    entries = models.get("data") if isinstance(models, dict) else None
    return any(
        isinstance(entry, dict) and entry.get("owned_by") == "vllm" for entry in entries or ()
    )


def openai_prompts_round(
    target: Peer,
    model: str,
    prompts: Sequence[Sequence[int]],
    meter: TrafficMeter,
    *,
    timeout_s: float | None = None,
) -> list[NextToken]:
    """The greedy next token after each of ``prompts``, from one ``POST /v1/completions``
    (vLLM: token ids named ``token_id:N``; llama-server's form of it names them by ``id``)."""
    body = {
        "model": model,
        "prompt": [list(prompt) for prompt in prompts],
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": 1,
        "return_tokens_as_token_ids": True,
    }
    exchange = meter.record(target.request("POST", "/v1/completions", body, timeout_s=timeout_s))
    raise_for_status(exchange, "a verification request", peer=target.peer)
    try:
        choices = sorted(exchange.data["choices"], key=lambda choice: int(choice["index"]))
        if len(choices) != len(prompts):
            raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
        return [NextToken(token=_choice_token(choice["logprobs"])) for choice in choices]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise RemoteError(
            f"{target.peer} did not name the token ids of a batched completion ({error!r})",
            fix="use an engine that takes token-id prompt lists and returns token ids "
            "(vLLM, llama-server)",
        ) from error


def _choice_token(logprobs: dict[str, Any]) -> int:
    if "content" in logprobs:  # llama-server's form: entries with the token's id
        return int(logprobs["content"][0]["id"])
    named = TOKEN_ID_KEY.fullmatch(str(logprobs["tokens"][0]))
    if named is None:
        raise ValueError(f"token {logprobs['tokens'][0]!r} is not named by its id")
    return int(named.group(1))


def vllm_round_cost(target: OpenAIConnection, max_k: int) -> tuple[float, tuple[float, ...]]:
    """The engine's seconds for a round of one prompt, T(1), and T(w)/T(1) for rounds of
    w = 1..max_k + 1 prompts after a probe history: the fastest of :data:`COST_REPEATS`
    rounds per w by the wall clock, less the connection's round trip."""
    history = probe_history(target, PROBE_HISTORY, target.model)
    meter = TrafficMeter()
    openai_prompts_round(target, target.model, [history] * (max_k + 1), meter)
    rtt = target.measure_rtt()
    best = [float("inf")] * (max_k + 1)
    for repeat in range(COST_REPEATS):
        drafted = [history[(repeat * 7 + 3 * i) % len(history)] for i in range(max_k)]
        for width in range(1, max_k + 2):
            prompts = [history + drafted[:i] for i in range(width)]
            started = time.perf_counter()
            openai_prompts_round(target, target.model, prompts, meter)
            best[width - 1] = min(best[width - 1], time.perf_counter() - started - rtt)
    step_s = max(best[0], 1e-4)
    return step_s, tuple(max(s, 1e-4) / step_s for s in best)
