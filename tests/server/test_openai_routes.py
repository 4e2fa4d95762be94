"""The OpenAI-compatible routes with the ``openai`` client, and latency on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.engine.remote import remote_profile
from edgespec.measure.delay_proxy import DelayProxy
from edgespec.protocol.server_info import ServerInfo
from edgespec.runtime.k_policy import AutoK
from edgespec.runtime.remote.edgespec_server import ServerTarget
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions

from support.servers import FAKE_PROFILE, ThreadServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server(local: Engine) -> Iterator[ThreadServer]:
    app = create_app(local, options=ServerOptions(api_key="sk-test"), profile=FAKE_PROFILE)
    with ThreadServer(app) as running:
        yield running


def test_openai_client_streams_a_chat_completion(server: ThreadServer) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)
    stream = client.chat.completions.create(
        model="edgespec",
        messages=[{"role": "user", "content": "def add(a, b):"}],
        max_tokens=24,
        stream=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).models.list()


def test_completions_equal_the_engine_greedy_output(server: ThreadServer, local: Engine) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)
    prompt = "import os\nimport sys\n\nclass "
    answer = client.completions.create(model="edgespec", prompt=prompt, max_tokens=32)
    assert answer.choices[0].text == local.generate(prompt, max_new_tokens=32).text
    streamed = client.completions.create(
        model="edgespec", prompt=prompt, max_tokens=32, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == answer.choices[0].text


def test_auto_k_grows_with_the_round_trip_time() -> None:
    info = ServerInfo(
        vocab_size=8,
        max_length=64,
        eos_token_ids=(0,),
        tokenizer_sha256="",
        max_k=8,
        target_step_s=0.004,
        verify_cost=tuple(1.0 + 0.15 * w for w in range(9)),
    )
    chosen = [
        AutoK(remote_profile(info, rtt_s=rtt, draft_step_s=0.0005), alpha=0.6).next_k()
        for rtt in (0.0, 0.02, 0.08)
    ]
    assert chosen[0] < chosen[1] < chosen[2], chosen


def test_injected_latency_keeps_results_identical(
    pair: tuple[Path, Path], local: Engine, server: ThreadServer
) -> None:
    prompt = "def fibonacci(n):\n    if n"
    expected = local.generate(prompt, max_new_tokens=32)
    measured = []
    for rtt in (0.02, 0.08):
        with DelayProxy(server.url, rtt_s=rtt) as proxy:
            remote = ServerTarget(proxy.url, api_key="sk-test")
            engine = Engine.load(draft=pair[1], remote=remote)
            measured.append(remote.measure_rtt())
            for k in ("auto", 4):
                assert engine.generate(prompt, k=k, max_new_tokens=32).tokens == expected.tokens
    # Auto k's first choice from the cost model with each measured round trip (the draft
    # step held fixed: measuring it on a busy machine is noisier than the 60 ms between the
    # two round trips); later choices also learn this pair's (low) alpha.
    info = remote.info()
    chosen = [
        AutoK(remote_profile(info, rtt_s=rtt, draft_step_s=0.0004)).next_k() for rtt in measured
    ]
    # The proxy delays each direction by half the round trip: at least that much is measured.
    assert measured[0] >= 0.02 and measured[1] >= 0.08
    assert measured[1] > measured[0]
    assert chosen[1] >= chosen[0] >= 1, (measured, chosen)


def test_completions_score_the_prompt_and_completion(server: ThreadServer, local: Engine) -> None:
    """Legacy ``logprobs`` with ``echo``: every prompt position's top token and the sent
    token's log-probability (None for the first), then the completion's."""
    import httpx

    prompt = local.encode("def add(a, b):\n    return")
    body = {
        "prompt": prompt,
        "max_tokens": 3,
        "echo": True,
        "logprobs": 2,
        "return_tokens_as_token_ids": True,
    }
    headers = {"Authorization": "Bearer sk-test"}
    answer = httpx.post(f"{server.url}/v1/completions", json=body, headers=headers).json()
    choice = answer["choices"][0]
    expected = local.generate(prompt, max_new_tokens=3)
    logprobs = choice["logprobs"]
    tokens = [*prompt, *expected.tokens]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in tokens]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, len(tokens)):
        top = logprobs["top_logprobs"][position]
        own = logprobs["token_logprobs"][position]
        assert own <= 0.0 and top[f"token_id:{tokens[position]}"] == own
        if position >= len(prompt):  # greedy completion: each token is the top one
            assert own == max(top.values())
    assert choice["text"] == local.tokenizer.decode(prompt) + expected.text

    refused = httpx.post(
        f"{server.url}/v1/completions",
        json={"prompt": [0, local.vocab_size], "max_tokens": 1},
        headers=headers,
    )
    assert refused.status_code == 422 and "token ids" in refused.text


def test_logprobs_are_scored_in_slices_within_a_bound(local: Engine) -> None:
    """The scoring pass runs in chunks of positions, each reduced in slices: its numbers are
    one whole pass's log-softmax. The positions a request may score and the model time it may
    take are bounded; each refusal is a 422 that says which bound and how to stay within it."""
    import numpy as np

    from edgespec.server.scoring import ScoreLimits

    from support.servers import client_for

    prompt = [3 + (7 * i) % (local.vocab_size - 3) for i in range(200)]  # two chunks of passes
    body = {
        "prompt": prompt,
        "max_tokens": 2,
        "echo": True,
        "logprobs": 3,
        "return_tokens_as_token_ids": True,
    }
    client = client_for(local, scoring=ScoreLimits(max_positions=202))
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    logprobs = answer.json()["choices"][0]["logprobs"]
    tokens = [int(name.removeprefix("token_id:")) for name in logprobs["tokens"]]
    assert tokens[:200] == prompt and len(tokens) == 202
    target = local.target
    logits = np.array(target.forward(tokens[:-1], target.new_cache()), dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    expected = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    own = np.array(logprobs["token_logprobs"][1:])
    np.testing.assert_allclose(own, expected[np.arange(201), tokens[1:]], atol=1e-4)
    for position in (1, 127, 128, 129, 201):  # both sides of the chunk's edge
        top = sorted(logprobs["top_logprobs"][position].values(), reverse=True)[:3]
        np.testing.assert_allclose(top, np.sort(expected[position - 1])[::-1][:3], atol=1e-4)

    over = client.post("/v1/completions", json={**body, "max_tokens": 3})
    assert over.status_code == 422
    assert "200 prompt tokens + 3 of max_tokens = 203 positions" in over.json()["detail"]
    assert "more than the 202 this server scores per request" in over.json()["detail"]

    slow = client_for(local, scoring=ScoreLimits(max_positions=256, max_seconds=1e-9))
    stopped = slow.post("/v1/completions", json=body)
    assert stopped.status_code == 422
    detail = stopped.json()["detail"]
    assert "scoring stopped after" in detail and "at position 128 of 202" in detail
    assert "past the 1e-09 s this server scores per request" in detail
    assert slow.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2}).status_code == 200


def test_the_engine_verifier_with_token_ids_on_edgespec_serve(
    pair: tuple[Path, Path], local: Engine, server: ThreadServer
) -> None:
    """The engine verifier's token-id path (vLLM's shape) against a real server: edgespec
    serve's completions answer echo + logprobs + return_tokens_as_token_ids."""
    from edgespec.runtime.remote.openai import OpenAITarget

    target = OpenAITarget(server.url + "/v1", api_key="sk-test")
    hybrid = Engine.load(draft=pair[1], remote=target)
    for prompt in ("def fibonacci(n):\n    if n", "import os\n\nclass "):
        expected = local.generate(prompt, max_new_tokens=24, k=3)
        result = hybrid.generate(prompt, max_new_tokens=24, k=3)
        assert result.error is None and result.tokens == expected.tokens
    assert target.serving_engine().prompt_format == "ids"  # type: ignore[attr-defined]


REFUSED = [
    ("/v1/completions", {"n": 2}, "'n'"),
    ("/v1/completions", {"best_of": 3}, "'best_of'"),
    ("/v1/completions", {"presence_penalty": 0.5}, "'presence_penalty'"),
    ("/v1/completions", {"frequency_penalty": -1.0}, "'frequency_penalty'"),
    ("/v1/completions", {"logit_bias": {"5": 100}}, "'logit_bias'"),
    ("/v1/completions", {"suffix": "\n"}, "'suffix'"),
    ("/v1/completions", {"n": 2, "stream": True}, "'n'"),
    ("/v1/chat/completions", {"n": 3}, "'n'"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2}, "'logprobs'"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "'response_format'"),
    ("/v1/chat/completions", {"tools": [{"type": "function"}]}, "'tools'"),
    (
        "/v1/chat/completions",
        {"stream": True, "stream_options": {"include_usage": True}},
        "'stream_options'",
    ),
]


def _body(route: str, **fields: object) -> dict[str, object]:
    if route == "/v1/completions":
        return {"model": "edgespec", "prompt": "def add(a, b):", "max_tokens": 2, **fields}
    messages = [{"role": "user", "content": "def add(a, b):"}]
    return {"model": "edgespec", "messages": messages, "max_tokens": 2, **fields}


@pytest.mark.parametrize(("route", "fields", "named"), REFUSED)
def test_fields_that_would_change_the_answer_are_refused(
    server: ThreadServer, route: str, fields: dict[str, object], named: str
) -> None:
    """Each is a 422 in the routes' one-line ``detail`` format, naming the field, before
    anything is generated (a refused stream is a plain JSON error, not an event stream)."""
    import httpx

    headers = {"Authorization": "Bearer sk-test"}
    answer = httpx.post(f"{server.url}{route}", json=_body(route, **fields), headers=headers)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert named in detail and "; leave" in detail and "\n" not in detail


def test_unknown_models_are_refused_and_neutral_fields_accepted(server: ThreadServer) -> None:
    import httpx
    import openai

    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)
    served = [model.id for model in client.models.list()]
    assert served == ["edgespec"]
    with pytest.raises(openai.NotFoundError) as refused:
        client.completions.create(model="gpt-4o", prompt="def add(a, b):", max_tokens=2)
    assert 'model "gpt-4o" is not served' in refused.value.response.json()["detail"]
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert 'model "gpt-4o" is not served' in refused.value.response.json()["detail"]
    headers = {"Authorization": "Bearer sk-test"}
    # No model, and the values that change nothing (n=1, zero penalties, no bias, no tools),
    # are answered as before; the answer names the served model.
    neutral = {"n": 1, "presence_penalty": 0, "logit_bias": {}, "user": "u1", "best_of": 1}
    for route in ("/v1/completions", "/v1/chat/completions"):
        body = _body(route, **neutral)
        del body["model"]
        answer = httpx.post(f"{server.url}{route}", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        assert answer.json()["model"] == "edgespec" and len(answer.json()["choices"]) == 1
    chat = client.chat.completions.create(
        model="edgespec",
        messages=[{"role": "user", "content": "def add(a, b):"}],
        max_completion_tokens=3,
        tools=[],
        n=1,
    )
    assert chat.usage is not None and chat.usage.completion_tokens <= 3
