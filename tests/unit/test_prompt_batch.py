"""Verification by batched prompts (``prompt_batch``) over a scripted engine: no models, no
server. The real engine is in ``test_llama_server.py``; here every acceptance path is driven
exactly: drafts right for exactly j tokens, sampled rounds against a known distribution, and
the refusals."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, RemoteError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.llama_server import (
    LlamaServerProps,
    llama_server_body,
    llama_server_round,
    sampled_support_size,
)
from edgespec.runtime.remote.prompt_batch import NextToken, PromptBatchVerifier
from edgespec.runtime.remote.transport import Connection, TrafficMeter
from edgespec.runtime.remote.vllm import is_vllm, openai_prompts_round

from support.statistics_checks import chi_square, chi_square_critical

VOCAB = 50
#: The scripted target's sampling distribution after any history: tokens 3..10.
SUPPORT = tuple(range(3, 11))
P_TARGET = np.array([0.3, 0.2, 0.15, 0.1, 0.1, 0.08, 0.05, 0.02])


def greedy_next(sequence: Sequence[int]) -> int:
    """The scripted target's greedy token after ``sequence``."""
    return (sum(sequence) * 7 + len(sequence)) % VOCAB


class ScriptedEngine:
    """Answers a round as an engine would: greedy tokens, or ``P_TARGET`` when sampled."""

    def __init__(self) -> None:
        self.rounds: list[list[list[int]]] = []
        self.uncached: list[int] = []

    def __call__(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: SamplingConfig,
        meter: TrafficMeter,
        uncached: int,
    ) -> list[NextToken]:
        self.rounds.append([list(p) for p in prompts])
        self.uncached.append(uncached)
        if sampling.greedy:
            return [NextToken(token=greedy_next(p), computed=1 + i) for i, p in enumerate(prompts)]
        return [
            NextToken(token=SUPPORT[0], support=SUPPORT, probs=tuple(P_TARGET)) for _ in prompts
        ]


def verifier(engine: ScriptedEngine, *, sampled: bool = True) -> PromptBatchVerifier:
    return PromptBatchVerifier(
        round_request=engine,
        max_length=4096,
        suggested_k=8,
        sampled=sampled,
        sampled_fix="verify on llama-server",
        check_sampling=sampled_support_size,
    )


def target_greedy(prompt: list[int], count: int) -> list[int]:
    sequence = list(prompt)
    for _ in range(count):
        sequence.append(greedy_next(sequence))
    return sequence[len(prompt) :]


@pytest.mark.parametrize("j", range(6))
def test_a_draft_right_for_exactly_j_tokens_keeps_j(j: int) -> None:
    engine = ScriptedEngine()
    checked = verifier(engine)
    prompt = [1, 2, 3]
    checked.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    truth = target_greedy(prompt, 6)
    drafted = truth[:j] + ([(truth[j] + 1) % VOCAB] if j < 5 else [])
    verdict = checked.verify(prompt[-1], Draft(tokens=tuple(drafted)))
    assert verdict.n_accepted == j
    assert list(verdict.tokens) == truth[: j + 1]
    # One request of k + 1 prompts: the history, then the history plus each drafted prefix.
    (sent,) = engine.rounds
    assert sent == [prompt + drafted[:i] for i in range(len(drafted) + 1)]
    assert checked.work().round_tokens == (sum(range(1, len(drafted) + 2)),)


def test_rounds_continue_from_the_committed_tokens() -> None:
    engine = ScriptedEngine()
    checked = verifier(engine)
    prompt = [5, 6]
    checked.begin(prompt, sampling=SamplingConfig(), rng=np.random.default_rng(0))
    truth = target_greedy(prompt, 12)
    made: list[int] = []
    last = prompt[-1]
    while len(made) < 10:
        verdict = checked.verify(last, Draft(tokens=tuple(truth[len(made) : len(made) + 3])))
        made += verdict.tokens
        last = made[-1]
    assert made[:10] == truth[:10]
    # The first round's prompts are all uncached; later ones only past the last history.
    assert engine.uncached[0] == sum(len(p) for p in engine.rounds[0])
    second = engine.rounds[1]
    assert engine.uncached[1] == sum(len(p) - len(engine.rounds[0][0]) for p in second)


def test_sampled_first_token_follows_the_engines_distribution() -> None:
    """χ² at a false-failure rate of 1e-4: a uniform draft over a wider support than the
    target's, verified against P_TARGET, emits tokens distributed as P_TARGET."""
    engine = ScriptedEngine()
    checked = verifier(engine)
    sampling = SamplingConfig(temperature=1.0, top_k=8)
    rng = np.random.default_rng(3)
    q_row = np.zeros(VOCAB)
    q_row[0:12] = 1 / 12  # tokens 0..2 and 11 have p = 0: always rejected
    counts = np.zeros(VOCAB)
    for _ in range(8000):
        checked.begin([1, 2], sampling=sampling, rng=rng)
        token = int(rng.choice(VOCAB, p=q_row))
        verdict = checked.verify(2, Draft(tokens=(token,), q_draft=q_row[None, :]))
        counts[verdict.tokens[0]] += 1
    assert counts[list(set(range(VOCAB)) - set(SUPPORT))].sum() == 0
    statistic, df = chi_square(counts[list(SUPPORT)], P_TARGET)
    assert statistic < chi_square_critical(df), (statistic, df)


def test_match_mode_needs_no_draft_distribution() -> None:
    engine = ScriptedEngine()
    checked = verifier(engine)
    sampling = SamplingConfig(temperature=1.0, top_k=8, mode="match", seed=11)
    checked.begin([1, 2], sampling=sampling, rng=np.random.default_rng(0))
    verdict = checked.verify(2, Draft(tokens=(3, 4)))
    assert all(token in SUPPORT for token in verdict.tokens)


def test_sampling_needs_a_bounding_top_k_and_an_engine_that_returns_its_distribution() -> None:
    engine = ScriptedEngine()
    with pytest.raises(ConfigError, match="--top-k"):
        verifier(engine).begin(
            [1], sampling=SamplingConfig(temperature=0.7), rng=np.random.default_rng(0)
        )
    with pytest.raises(ConfigError, match="distribution it samples from"):
        verifier(engine, sampled=False).begin(
            [1], sampling=SamplingConfig(temperature=0.7, top_k=5), rng=np.random.default_rng(0)
        )
    assert engine.rounds == []  # refused before anything was sent


def test_llama_servers_body_names_every_default_sampler_off() -> None:
    sampled = llama_server_body([[1, 2]], SamplingConfig(temperature=0.8, top_k=20, top_p=0.9))
    assert sampled["samplers"] == ["temperature", "top_k", "top_p"]
    assert sampled["n_probs"] == 20 and sampled["post_sampling_probs"] is True
    assert sampled["min_p"] == 0.0 and sampled["repeat_penalty"] == 1.0
    greedy = llama_server_body([[1, 2], [1, 2, 3]], SamplingConfig())
    assert greedy["temperature"] == 0.0 and greedy["prompt"] == [[1, 2], [1, 2, 3]]


def answering(reply: object) -> Connection:
    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=reply)

    return Connection("http://x", client=httpx.Client(transport=httpx.MockTransport(handle)))


def test_answers_are_read_in_prompt_order_and_checked() -> None:
    reply = [
        {"index": 1, "tokens": [9], "timings/prompt_n": 2, "timings/prompt_ms": 5.0},
        {"index": 0, "tokens": [7], "timings/prompt_n": 1, "timings/prompt_ms": 5.0},
    ]
    answers = llama_server_round(answering(reply), [[1], [1, 2]], SamplingConfig(), TrafficMeter())
    assert [a.token for a in answers] == [7, 9] and [a.computed for a in answers] == [1, 2]
    with pytest.raises(RemoteError, match="answered 2 of 3 prompts"):
        llama_server_round(
            answering(reply), [[1], [1, 2], [1, 2, 3]], SamplingConfig(), TrafficMeter()
        )
    vllm = {
        "choices": [
            {"index": 1, "logprobs": {"tokens": ["token_id:4"]}},
            {"index": 0, "logprobs": {"tokens": ["token_id:8"]}},
        ]
    }
    answers = openai_prompts_round(answering(vllm), "m", [[1], [1, 2]], TrafficMeter())
    assert [a.token for a in answers] == [8, 4]
    with pytest.raises(RemoteError, match="token ids"):
        text_named = {"choices": [{"index": 0, "logprobs": {"tokens": ["def"]}}]}
        openai_prompts_round(answering(text_named), "m", [[1]], TrafficMeter())


def test_engines_are_told_apart_by_their_answers() -> None:
    props = LlamaServerProps.from_json(
        {"total_slots": 5, "default_generation_settings": {"n_ctx": 2048}, "chat_template": "t"}
    )
    assert props is not None and props.total_slots == 5 and props.slot_context == 2048
    assert LlamaServerProps.from_json({"chat": {}}) is None
    assert is_vllm({"data": [{"id": "m", "owned_by": "vllm"}]})
    assert not is_vllm({"data": [{"id": "m", "owned_by": "me"}]})


def test_an_engine_that_neither_batches_nor_echoes_is_refused_before_generating() -> None:
    """An OpenAI-compatible server that is not llama-server or vLLM and returns no prompt
    log-probabilities (as Ollama's routes do) is refused in one line when a generation is
    planned, before any round."""
    from fastapi import FastAPI

    from edgespec.api import Engine

    from support.servers import ThreadServer

    app = FastAPI()
    completions: list[object] = []

    @app.get("/v1/models")
    def models() -> dict[str, object]:
        return {"data": [{"id": "m", "owned_by": "library"}]}

    @app.post("/v1/completions")
    def complete(body: dict[str, object]) -> dict[str, object]:
        completions.append(body)
        return {"choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}]}

    with ThreadServer(app) as server:
        engine = Engine.load(remote=server.url, remote_api="openai", measure_energy=False)
        with pytest.raises(RemoteError, match="neither llama-server nor vLLM"):
            engine.generate("def add(a, b):", max_new_tokens=4)
    assert len(completions) == 1  # the one probe, no round
