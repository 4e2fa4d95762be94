"""One verification round on a serving engine as one batched request of k + 1 token-id prompts.

A round that drafted d_1..d_k after the committed history H sends the prompts H, H + d_1, ...,
H + d_1..d_k in one request, each asking for one next token. Prompt i's next token is the
target's token after H + d_1..d_i, so the answers are exactly the k + 1 rows a local verify
pass would give (the engine's own greedy tokens, or its sampling distribution there), in one
round trip and one batched engine pass. No history is echoed: each prompt reuses a cached
prefix (llama-server: each slot's KV cache by longest common prefix; vLLM: its block prefix
cache), so the engine computes the new tokens of the round, about (k + 1)(k + 2) / 2 of them,
whatever the length of the history.

Two request shapes:
- llama.cpp's ``llama-server``: ``POST /completion`` with token-id prompts (no BOS added),
  ``n_predict`` 1, ``return_tokens`` and ``cache_prompt``; its answer names token ids and
  reports per prompt the tokens it computed (``timings.prompt_n``) and its time. Sampled rounds
  ask for ``n_probs`` = top-k with ``post_sampling_probs``: the distribution it samples from,
  whole when top-k bounds its support.
- vLLM (and OpenAI-compatible engines that take token-id prompt lists): ``POST
  /v1/completions`` with the prompt list, ``max_tokens`` 1, temperature 0, ``logprobs`` 1 and
  ``return_tokens_as_token_ids``. Greedy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, RemoteError
from edgespec.runtime.verifiers.http import Connection, TrafficMeter, raise_for_status
from edgespec.runtime.verifiers.openai_echo import TOKEN_ID_KEY

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


@dataclass(frozen=True, kw_only=True)
class NextToken:
    """The engine's answer for one prompt: its next ``token``; for a sampled round the
    distribution it drew from (``support`` ids with ``probs``); the prompt tokens it computed
    (``computed``; -1 when it does not say) and its milliseconds for this prompt (None: not
    reported)."""

    token: int
    support: tuple[int, ...] = ()
    probs: tuple[float, ...] = ()
    computed: int = -1
    server_ms: float | None = None


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
    target: Connection,
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


def openai_prompts_round(
    target: Connection,
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
