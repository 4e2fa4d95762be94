"""``edgespec serve`` probed as an attacker would, in process: no input gets a 5xx or a large
answer, text that is not Unicode is refused naming the field, lists and ``max_tokens`` are
bounded, text work stays outside the model's turn, sessions belong to their opener, the
OpenAPI pages need the key, and every status is counted in ``/metrics``. On a real socket:
``test_server_wire.py``. The numbers of a whole flood: ``benchmarks/serve_abuse.py``."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.api import Engine
from edgespec.protocol import SESSION_SECRET_HEADER
from edgespec.runtime import text as runtime_text
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions

from support.servers import FAKE_PROFILE, client_for

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "mode": "rejection"}
KEY = {"Authorization": "Bearer k"}
#: The most an error answer may weigh: the first problems, never the input.
MAX_ERROR_BYTES = 4096


@pytest.fixture(scope="module")
def engine(exported: Callable[..., Path]) -> Engine:
    return Engine.load(target=exported("llama", "fp32"), draft=exported("mistral", "fp32"))


@pytest.fixture(scope="module")
def client(engine: Engine) -> Any:
    return client_for(engine, max_new_tokens=4)


def post_raw(client: Any, path: str, body: bytes, **headers: str) -> Any:
    return client.post(path, content=body, headers={"Content-Type": "application/json", **headers})


# --- lone surrogates -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 1}', "'prompt'"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\udfff"}]}',
         "'messages[0].content'"),
        ("/v1/chat/completions", b'{"messages": [{"role": "\\ud800", "content": "a"}]}',
         "'messages[0].role'"),
        ("/v1/completions", b'{"prompt": "a", "model": "\\ud800"}', "'model'"),
        ("/v1/completions", b'{"prompt": "a", "stop": ["x", "\\udc00"]}', "'stop[1]'"),
        ("/v1/completions", b'{"prompt": "a", "user": "\\ud800"}', "'user'"),
        ("/v1/completions", b'{"prompt": "a", "\\ud800": 1}', "a key in 'body'"),
        ("/v1/verify/sessions", b'{"prompt": [1], "sampling": {"mode": "\\ud800"}}',
         "'sampling.mode'"),
    ],
)  # fmt: skip
def test_lone_surrogates_get_a_422_naming_the_field(
    client: Any, path: str, body: bytes, field: str
) -> None:
    answer = post_raw(client, path, body)
    assert answer.status_code == 422, answer.text
    detail = answer.json()["detail"]
    assert field in detail and "surrogate" in detail


# --- the fuzz: no 5xx, small answers -----------------------------------------------------------

text_with_surrogates = st.text(
    alphabet=st.characters(codec=None, categories=["Cs", "L", "N", "P", "Zs"]), max_size=6
)
token_counts = st.one_of(
    st.integers(-3, 10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([10001.0, 1e30, "8", True, None, [1]]),
)


def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


def huge_list(count: int, item: bytes) -> bytes:
    return b"[" + b",".join([item] * count) + b"]"


def sizes(*extremes: int) -> st.SearchStrategy[int]:
    """The sizes that matter (limits and their neighbours, the issue's floods), or any between
    (hypothesis alone favours small integers)."""
    return st.sampled_from(extremes) | st.integers(min(extremes), max(extremes))


@st.composite
def abusive_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    """A route and a raw body: surrogates in text fields, deep nesting, huge lists, huge stop
    lists, float or huge max_tokens, or bodies over the size limit."""
    kind = draw(st.sampled_from(["text", "nesting", "list", "stop", "max_tokens", "oversized"]))
    route = draw(
        st.sampled_from(["/v1/completions", "/v1/chat/completions", "/v1/verify/sessions"])
    )
    if kind == "text":
        value = draw(text_with_surrogates)
        field = draw(st.sampled_from(["prompt", "model", "stop", "user", "role", "content"]))
        body: Any = {"prompt": "a", "messages": [{"role": "user", "content": "a"}]}
        if field in ("role", "content"):
            body["messages"][0][field] = value
        else:
            body[field] = value
        return route, json.dumps(body).encode()  # json escapes lone surrogates as \udXXX
    if kind == "nesting":
        depth = draw(sizes(1, 33, 1000, 100_000))
        inner = nested(depth, draw(st.sampled_from(["list", "object"])))
        return route, b'{"prompt": ' + inner + b', "max_tokens": 1}'
    if kind == "list":
        count = draw(sizes(1, 384, 385, 65_537, 1_000_001))
        item = draw(st.sampled_from([b'"a"', b"1", b"-1", b"1.5", b"{}"]))
        return route, b'{"prompt": ' + huge_list(count, item) + b', "max_tokens": 1}'
    if kind == "stop":
        count = draw(sizes(1, 16, 17, 38_000))
        length = draw(sizes(1, 100, 256, 257))
        stop = huge_list(count, b'"' + b"x" * length + b'"')
        return "/v1/completions", b'{"prompt": "a", "max_tokens": 2, "stop": ' + stop + b"}"
    if kind == "max_tokens":
        body = {"prompt": "def", "max_tokens": draw(token_counts)}
        return route, json.dumps(body).encode()
    return route, b'{"prompt": "' + b"a" * (4 * 1024 * 1024) + b'"}'


@given(case=abusive_bodies(), chunked=st.booleans())
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_abuse_never_gets_a_5xx_and_errors_stay_small(
    client: Any, case: tuple[str, bytes], chunked: bool
) -> None:
    route, body = case
    sent: Any = body
    if chunked:  # a generator body travels with Transfer-Encoding: chunked

        def pieces() -> Iterator[bytes]:
            for start in range(0, len(body), 65536):
                yield body[start : start + 65536]

        sent = pieces()
    answer = client.post(route, content=sent, headers={"Content-Type": "application/json"})
    assert answer.status_code < 500, answer.text[:300]
    if answer.status_code >= 400:
        assert len(answer.content) <= MAX_ERROR_BYTES
        assert answer.json()["detail"]


def test_huge_prompt_lists_get_a_small_422_at_once(client: Any) -> None:
    # 1,000,001 strings in 4 MB: refused by length before any item is validated
    body = b'{"prompt": ' + huge_list(1_000_001, b'"a"') + b"}"
    answer = post_raw(client, "/v1/completions", body)
    assert answer.status_code == 422 and len(answer.content) <= MAX_ERROR_BYTES
    assert "1000001 items" in answer.json()["detail"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"prompt": ' + nested(40, "list") + b"}", "nests deeper"),
        (b'{"prompt": ' + nested(100_000, "object") + b"}", "nests deeper"),
        (b'{"prompt": "\xff\xfe"}', "not valid UTF-8"),
        (b'{"prompt": ' + b"9" * 5000 + b"}", "not valid JSON"),
    ],
)
def test_nesting_and_bad_encodings_get_a_422(client: Any, body: bytes, needle: str) -> None:
    answer = post_raw(client, "/v1/completions", body)
    assert answer.status_code == 422 and needle in answer.json()["detail"]


@pytest.mark.parametrize(
    ("max_tokens", "status"),
    [(10001.0, 422), (4.0, 422), (10001, 422), (10**30, 422), (0, 422), ("3", 422), (3, 200)],
)
def test_max_tokens_is_an_integer_within_the_context(
    client: Any, max_tokens: Any, status: int
) -> None:
    answer = client.post("/v1/completions", json={"prompt": "def", "max_tokens": max_tokens})
    assert answer.status_code == status, answer.text


def test_length_refusals_name_max_tokens_and_the_context(client: Any, engine: Engine) -> None:
    """In the request's own terms: its field names and the model's context, nothing internal."""
    context = engine.max_length
    huge = client.post("/v1/completions", json={"prompt": "def", "max_tokens": 10**9})
    assert huge.status_code == 422
    detail = huge.json()["detail"]
    assert f"max_tokens 1000000000 is more than the model's context of {context}" in detail
    chat = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 10**9},
    )
    assert chat.status_code == 422 and "max_completion_tokens" in chat.json()["detail"]
    prompt = " ".join(["def"] * (2 * context))  # fits the characters' bound, not the context
    long = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 4})
    assert long.status_code == 422
    detail = long.json()["detail"]
    assert f"in the model's context of {context} tokens" in detail and "of prompt" in detail
    assert "max_new_tokens" not in detail and f"at most {context - 1} tokens" in detail
    messages = [{"role": "user", "content": prompt}]
    chat = client.post("/v1/chat/completions", json={"messages": messages})
    assert chat.status_code == 422 and "tokens of messages leave" in chat.json()["detail"]
    ids = client.post("/v1/completions", json={"prompt": [5] * context, "max_tokens": 1})
    assert ids.status_code == 422 and f"context of {context}" in ids.json()["detail"]


@pytest.mark.parametrize(
    ("stop", "status"),
    [(["x"] * 17, 422), (["x" * 257], 422), ("x" * 257, 422), (["\n" * 256] * 16, 200)],
)
def test_stop_lists_are_bounded(client: Any, stop: Any, status: int) -> None:
    answer = client.post("/v1/completions", json={"prompt": "def", "max_tokens": 3, "stop": stop})
    assert answer.status_code == status, answer.text


def test_stop_strings_and_detokenization_run_outside_the_model_turn(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    inside = threading.local()
    seen: list[tuple[str, bool]] = []

    def turn(work: Callable[[], Any]) -> Any:
        inside.now = True
        try:
            return work()
        finally:
            inside.now = False

    def spy(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            seen.append((name, getattr(inside, "now", False)))
            return method(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(
        runtime_text.StopMatcher, "feed", spy("feed", runtime_text.StopMatcher.feed)
    )
    monkeypatch.setattr(runtime_text.TextStream, "push", spy("push", runtime_text.TextStream.push))
    generation = engine.stream_deltas(
        "def fib", max_new_tokens=24, stop=["never appears"] * 3, model_turn=turn
    )
    assert "".join(delta.text for delta in generation)
    assert {name for name, _ in seen} == {"feed", "push"}
    assert not any(held for _, held in seen)


# --- the key, the pages, the sessions ----------------------------------------------------------


def test_openapi_pages_need_the_key_and_health_hides_counts(engine: Engine) -> None:
    guarded = client_for(engine, api_key="k")
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect", "/metrics"):
        assert guarded.get(path).status_code == 401, path
        assert guarded.get(path, headers=KEY).status_code == 200, path
    assert "sessions" not in guarded.get("/health").json()
    assert guarded.get("/health").json()["status"] == "ok"
    assert "sessions" in guarded.get("/health", headers=KEY).json()
    assert "sessions" in client_for(engine).get("/health").json()  # no key: all are trusted


def test_sessions_belong_to_their_opener(engine: Engine) -> None:
    shared = client_for(engine, api_key="k")  # both clients hold the server's key
    opened = shared.post(
        "/v1/verify/sessions", json={"prompt": [5, 6, 7], "sampling": GREEDY}, headers=KEY
    ).json()
    session, secret = opened["session_id"], opened["session_secret"]
    path = f"/v1/verify/sessions/{session}"
    round_body = {"position": 2, "last_token": 7, "draft": [8, 9]}
    for intruder in ({}, {SESSION_SECRET_HEADER: "guess"}, {SESSION_SECRET_HEADER: secret[:-1]}):
        headers = {**KEY, **intruder}
        stolen = shared.post(f"{path}/rounds", json=round_body, headers=headers)
        assert stolen.status_code == 404 and session not in stolen.text
        assert shared.delete(path, headers=headers).status_code == 404
    other = shared.post(
        "/v1/verify/sessions", json={"prompt": [1, 2], "sampling": GREEDY}, headers=KEY
    ).json()
    crossed = {**KEY, SESSION_SECRET_HEADER: other["session_secret"]}
    assert shared.post(f"{path}/rounds", json=round_body, headers=crossed).status_code == 404
    owner = {**KEY, SESSION_SECRET_HEADER: secret}
    answered = shared.post(f"{path}/rounds", json=round_body, headers=owner)
    assert answered.status_code == 200 and answered.json()["length"] >= 3  # untouched
    assert shared.delete(path, headers=owner).status_code == 200


def test_every_status_is_counted_500s_included(engine: Engine) -> None:
    from fastapi.testclient import TestClient

    app = create_app(engine, options=ServerOptions(max_body_bytes=2048), profile=FAKE_PROFILE)

    @app.get("/fail")
    def fail() -> None:
        raise RuntimeError("a bug")

    client = TestClient(app, raise_server_exceptions=False)
    failed = client.get("/fail")
    assert failed.status_code == 500 and len(failed.content) <= MAX_ERROR_BYTES
    assert client.post("/v1/completions", content=b"[" * 3000).status_code == 413
    assert post_raw(client, "/v1/completions", b'{"prompt": "\\ud800"}').status_code == 422
    assert client.get("/nowhere").status_code == 404
    text = client.get("/metrics").text
    for status in (500, 413, 422, 404):
        assert f'edgespec_responses_total{{status="{status}"}} 1' in text, status
        assert f'edgespec_errors_total{{status="{status}"}} 1' in text, status


# --- the cache budget ----------------------------------------------------------------------------


def test_the_cache_budget_evicts_the_least_recently_used(engine: Engine) -> None:
    from edgespec.errors import ConfigError
    from edgespec.protocol.sessions import OpenRequest
    from edgespec.server.sessions import SessionStore, StoreLimits, full_session_bytes

    with pytest.raises(ConfigError, match="--max-cache-mb"):
        SessionStore(engine.target, limits=StoreLimits(max_cache_bytes=1000))
    budget = full_session_bytes(engine.target)  # one whole-context session
    store = SessionStore(engine.target, limits=StoreLimits(max_cache_bytes=budget))
    request = OpenRequest.from_json(
        {"prompt": list(range(1, 201)), "sampling": GREEDY}, vocab_size=384, max_length=256
    )
    store.open(request)
    store.open(request)  # two caches of 199 tokens exceed 256 tokens' worth
    assert store.count == 1 and store.counters["sessions_evicted"] == 1
    assert store.cache_bytes() <= budget
