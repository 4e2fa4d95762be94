"""``edgespec serve`` in process: validation (4xx, never 5xx), API key, metrics, session limits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgespec.api import Engine
from edgespec.errors import ConfigError, UnknownSessionError
from edgespec.protocol import SESSION_SECRET_HEADER
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions
from edgespec.server.run import check_binding
from edgespec.server.sessions import StoreLimits

from support.servers import FAKE_PROFILE, client_for

pytestmark = pytest.mark.integration

GREEDY = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0, "mode": "rejection"}


@pytest.fixture(scope="module")
def engine(exported: Callable[..., Path]) -> Engine:
    return Engine.load(target=exported("llama", "fp32"), draft=exported("mistral", "fp32"))


@pytest.fixture(scope="module")
def client(engine: Engine) -> Any:
    return client_for(engine)


def open_session(
    client: Any, prompt: list[int] | None = None, sampling: dict[str, Any] = GREEDY
) -> tuple[str, dict[str, str]]:
    """A session's id and the header its rounds and delete must carry (its secret)."""
    answer = client.post(
        "/v1/verify/sessions", json={"prompt": prompt or [5, 6, 7], "sampling": sampling}
    )
    assert answer.status_code == 200, answer.text
    opened = answer.json()
    return str(opened["session_id"]), {SESSION_SECRET_HEADER: opened["session_secret"]}


def test_round_trip_and_idempotent_retry(client: Any) -> None:
    session, secret = open_session(client)
    body = {"position": 2, "last_token": 7, "draft": [8, 9, 10]}
    path = f"/v1/verify/sessions/{session}/rounds"
    first = client.post(path, json=body, headers=secret).json()
    again = client.post(path, json=body, headers=secret).json()
    assert first["tokens"] == again["tokens"] and first["length"] == again["length"]
    assert first["length"] == 3 + first["n_accepted"]
    assert client.delete(f"/v1/verify/sessions/{session}", headers=secret).status_code == 200
    assert client.post(path, json=body, headers=secret).status_code == 404


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 422),
        (b'{"position": "two", "last_token": 1, "draft": []}', 422),
        (b'{"position": 2, "last_token": 1, "draft": [1, 2, "x"]}', 422),
        (b'{"position": 2, "last_token": 1, "draft": ' + str([1] * 5000).encode() + b"}", 422),
        (b'{"position": 2, "last_token": 100000, "draft": []}', 422),
        (b'{"position": 2, "last_token": -1, "draft": []}', 422),
        (b'{"position": 2, "last_token": 1, "draft": [99999999999999999999999]}', 422),
        (b'{"position": 100000, "last_token": 1, "draft": [1]}', 422),
        (b'{"position": -3, "last_token": 1, "draft": [1]}', 422),
        (b'{"position": 9, "last_token": 1, "draft": [1]}', 409),
        (b'{"position": 2, "last_token": 1, "draft": [1], "uniforms": [NaN]}', 422),
        (b'{"position": 2, "last_token": 1, "draft": [1], "protocol": 7}', 422),
        (b"[]", 422),
    ],
)
def test_malformed_rounds_get_a_4xx_with_a_message(client: Any, body: bytes, status: int) -> None:
    session, secret = open_session(client)
    answer = client.post(
        f"/v1/verify/sessions/{session}/rounds",
        content=body,
        headers={"Content-Type": "application/json", **secret},
    )
    assert answer.status_code == status, answer.text
    assert answer.json()["detail"]
    assert client.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": [], "sampling": GREEDY},
        {"prompt": [1] * 100000, "sampling": GREEDY},
        {"prompt": [1, 2], "sampling": {**GREEDY, "temperature": 1e300}},
        {"prompt": [1, 2], "sampling": {**GREEDY, "seed": 2**70}},
        {"prompt": [1, 2], "sampling": {**GREEDY, "mode": "beam"}},
        {"prompt": [1, 2], "sampling": {**GREEDY, "top_k": -1}},
        {"prompt": "hello", "sampling": GREEDY},
    ],
)
def test_malformed_opens_get_a_4xx(client: Any, body: dict[str, Any]) -> None:
    answer = client.post("/v1/verify/sessions", json=body)
    assert 400 <= answer.status_code < 500, answer.text


def test_rejection_round_without_q_draft_is_refused(client: Any) -> None:
    session, secret = open_session(client, [1, 2], {**GREEDY, "temperature": 0.8})
    path = f"/v1/verify/sessions/{session}/rounds"
    answer = client.post(path, json={"position": 1, "last_token": 2, "draft": [3]}, headers=secret)
    assert answer.status_code == 422 and "q_draft" in answer.json()["detail"]


def test_unknown_session_and_oversized_body(engine: Engine) -> None:
    client = client_for(engine, max_body_bytes=1000)
    answer = client.post("/v1/verify/sessions/nope/rounds", json={"position": 0, "last_token": 1})
    assert answer.status_code == 404
    huge = client.post("/v1/verify/sessions", json={"prompt": [1] * 2000, "sampling": GREEDY})
    assert huge.status_code == 413


def test_api_key_is_required_and_checked(engine: Engine) -> None:
    client = client_for(engine, api_key="s3cret")
    assert client.get("/health").status_code == 200  # liveness stays open
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        answer = client.post(
            "/v1/verify/sessions", json={"prompt": [1, 2], "sampling": GREEDY}, headers=headers
        )
        assert answer.status_code == 401 and answer.json()["detail"]
        assert client.get("/metrics", headers=headers).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    opened = client.post(
        "/v1/verify/sessions", json={"prompt": [1, 2], "sampling": GREEDY}, headers=good
    )
    assert opened.status_code == 200


def test_non_loopback_binding_needs_an_api_key() -> None:
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("localhost", None)
    check_binding("0.0.0.0", "key")
    with pytest.raises(ConfigError, match="api-key"):
        check_binding("0.0.0.0", None)
    with pytest.raises(ConfigError):
        check_binding("192.168.1.4", "")


def test_metrics_are_prometheus_text(client: Any) -> None:
    session, secret = open_session(client)
    client.post(
        f"/v1/verify/sessions/{session}/rounds",
        json={"position": 2, "last_token": 7, "draft": [1]},
        headers=secret,
    )
    client.post("/v1/verify/sessions/none/rounds", json={"position": 2, "last_token": 7})
    text = client.get("/metrics").text
    for name in (
        "edgespec_sessions ",
        "edgespec_rounds_total ",
        "edgespec_accepted_tokens_total ",
        "edgespec_verify_seconds_count ",
        'edgespec_errors_total{status="404"}',
        "edgespec_suggested_k ",
    ):
        assert name in text, name


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_idle_sessions_expire_and_the_least_recently_used_is_evicted(engine: Engine) -> None:
    from edgespec.protocol.sessions import OpenRequest
    from edgespec.server.sessions import SessionStore

    clock = FakeClock()
    store = SessionStore(
        engine.target, limits=StoreLimits(max_sessions=2, idle_ttl_s=10), clock=clock
    )
    request = OpenRequest.from_json(
        {"prompt": [1, 2, 3], "sampling": GREEDY}, vocab_size=384, max_length=256
    )
    first = store.open(request)
    second = store.open(request)
    clock.now = 5
    store._get(first.session_id, first.session_secret)  # touch: second is now the LRU
    third = store.open(request)
    assert store.count == 2 and store.counters["sessions_evicted"] == 1
    with pytest.raises(UnknownSessionError):
        store._get(second.session_id, second.session_secret)
    clock.now = 16  # first was used at 5, third opened at 5: both idle for 11 s
    with pytest.raises(UnknownSessionError):
        store._get(third.session_id, third.session_secret)
    assert store.count == 0 and store.counters["sessions_expired"] == 2


def test_idle_sessions_expire_on_a_timer_without_traffic(engine: Engine) -> None:
    """A session idle past the TTL is dropped by the server's timer, with no request to
    trigger it; /metrics then counts it. The wait is bounded: TTL + 5 s."""
    import time

    import httpx

    from support.servers import ThreadServer

    ttl = 0.5
    options = ServerOptions(limits=StoreLimits(idle_ttl_s=ttl), shutdown_grace_s=1)
    app = create_app(engine, options=options, profile=FAKE_PROFILE)
    store = app.state.store
    with ThreadServer(app, options) as server:
        opened = httpx.post(
            f"{server.url}/v1/verify/sessions", json={"prompt": [5, 6, 7], "sampling": GREEDY}
        )
        assert opened.status_code == 200 and store.count == 1 and store.cache_bytes() > 0
        # The store is watched in process, not through /metrics: a request could expire it too.
        deadline = time.monotonic() + ttl + 5
        while store.count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.count == 0, "the idle session was not expired by the timer"
        text = httpx.get(f"{server.url}/metrics").text
    assert "edgespec_sessions 0\n" in text and "edgespec_cache_bytes 0\n" in text
    assert "edgespec_sessions_expired_total 1\n" in text


def test_suggested_k_shrinks_as_the_queue_grows(engine: Engine) -> None:
    from edgespec.server.sessions import SessionStore

    store = SessionStore(engine.target, limits=StoreLimits(max_k=8))
    suggestions = []
    for waiting in range(5):
        store.waiting = waiting
        suggestions.append(store.suggested_k())
    assert suggestions == sorted(suggestions, reverse=True)
    assert suggestions[0] == 8 and suggestions[-1] < 8


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=4),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)
round_bodies = st.fixed_dictionaries(
    {
        "position": st.integers(-5, 300) | json_values,
        "last_token": st.integers(-5, 400) | json_values,
        "draft": st.lists(st.integers(-5, 400), max_size=40) | json_values,
    },
    optional={
        "q_draft": st.fixed_dictionaries(
            {"format": st.sampled_from(["sparse", "fp16", "x"])},
            optional={
                "ids": st.lists(st.lists(st.integers(-2, 400), max_size=3), max_size=3),
                "probs": st.lists(st.lists(st.floats(), max_size=3), max_size=3),
                "rows": st.text(max_size=12),
            },
        )
        | json_values,
        "uniforms": st.lists(st.floats(), max_size=6) | json_values,
        "protocol": st.integers(0, 3) | json_values,
    },
)


def post_json(client: Any, path: str, body: Any, headers: dict[str, str] | None = None) -> Any:
    """Posts ``body`` as Python's json writes it: NaN and Infinity included."""
    content = json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    return client.post(path, content=content, headers=sent)


@given(body=round_bodies, sampling=st.sampled_from(["greedy", "rejection", "match"]))
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_rounds_never_get_a_5xx(client: Any, body: dict[str, Any], sampling: str) -> None:
    settings_json = {**GREEDY, "temperature": 0.0 if sampling == "greedy" else 0.9}
    if sampling == "match":
        settings_json["mode"] = "match"
    session, secret = open_session(client, [1, 2, 3], settings_json)
    path = f"/v1/verify/sessions/{session}/rounds"
    answer = post_json(client, path, body, headers=secret)
    assert answer.status_code < 500, (body, answer.text)


@given(body=json_values)
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_json_on_every_route_never_gets_a_5xx(client: Any, body: Any) -> None:
    for path in (
        "/v1/verify/sessions",
        "/v1/verify/sessions/x/rounds",
        "/v1/completions",
        "/v1/chat/completions",
    ):
        assert post_json(client, path, body).status_code < 500


def test_schemathesis_fuzzing_from_the_openapi_schema_finds_no_5xx(engine: Engine) -> None:
    schemathesis = pytest.importorskip("schemathesis")
    app = create_app(engine, options=ServerOptions(max_new_tokens=8), profile=FAKE_PROFILE)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    labels = []
    for found in schema.get_all_operations():
        operation = found.ok()
        labels.append(operation.label)

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call()
            assert response.status_code < 500, (case.body, response.text)

        check()
    assert "POST /v1/verify/sessions/{session_id}/rounds" in labels
