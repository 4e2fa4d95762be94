"""The client's retries follow a deadline, with jittered backoff; the options that set it; the
server's default cache budget. No models, no server: an in-process transport."""

from __future__ import annotations

import httpx
import pytest

from edgespec.cli.main import build_parser
from edgespec.engine.assembly import remote_target
from edgespec.errors import ConfigError, RemoteUnavailableError
from edgespec.runtime.remote.edgespec_server import ServerTarget
from edgespec.runtime.remote.transport import DEFAULT_TIMEOUT_S, Connection


def refusing(
    calls: list[int], *, answer_after: int | None = None, answer_first: bool = True
) -> httpx.Client:
    """A client whose server answered once (unless not ``answer_first``), then refuses
    connections (then answers again, after ``answer_after`` calls)."""

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if (answer_first and len(calls) == 1) or (
            answer_after is not None and len(calls) > answer_after
        ):
            return httpx.Response(200, json={"status": "ok"})
        raise httpx.ConnectError("Connection refused", request=request)

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_retries_go_on_until_the_deadline_not_a_count() -> None:
    calls: list[int] = []
    connection = Connection(
        "http://x", timeout_s=0.3, backoff_s=0.001, max_backoff_s=0.002, client=refusing(calls)
    )
    connection.request("GET", "/health")  # it answered once: from now on it may be restarting
    with pytest.raises(RemoteUnavailableError, match="did not answer GET /health after"):
        connection.request("GET", "/health")
    assert len(calls) > 7  # more than the old fixed count of retries: the deadline decides


def test_a_server_back_within_the_deadline_answers() -> None:
    calls: list[int] = []
    connection = Connection(
        "http://x", timeout_s=30, backoff_s=0.001, max_backoff_s=0.002,
        client=refusing(calls, answer_after=20),
    )  # fmt: skip
    connection.request("GET", "/health")
    exchange = connection.request("GET", "/health")
    assert exchange.status == 200 and exchange.attempts == 20


def test_a_retry_count_still_caps_the_attempts() -> None:
    calls: list[int] = []
    connection = Connection(
        "http://x", timeout_s=30, retries=2, backoff_s=0.001, client=refusing(calls)
    )
    connection.request("GET", "/health")
    with pytest.raises(RemoteUnavailableError, match="after 3 attempt"):
        connection.request("GET", "/health")
    assert len(calls) == 4
    with pytest.raises(RemoteUnavailableError):
        connection.request("DELETE", "/x", retry=False)
    assert len(calls) == 5


def test_an_address_where_nothing_ever_answered_fails_at_once() -> None:
    """A refused connection or a name that does not resolve at the first request is a wrong
    address: one attempt, not 30 s of retries."""
    calls: list[int] = []
    connection = Connection(
        "http://x", timeout_s=30, backoff_s=0.001, client=refusing(calls, answer_first=False)
    )
    with pytest.raises(RemoteUnavailableError, match="after 1 attempt"):
        connection.request("GET", "/health")
    assert len(calls) == 1
    unresolvable = Connection("http://edgespec-test.invalid:1", timeout_s=30)
    with pytest.raises(RemoteUnavailableError, match="after 1 attempt"):
        unresolvable.request("GET", "/health")


def test_backoff_doubles_up_to_its_cap_with_jitter() -> None:
    connection = Connection("http://x", backoff_s=0.2, max_backoff_s=2.0)
    for attempts, ceiling in ((1, 0.2), (2, 0.4), (4, 1.6), (5, 2.0), (30, 2.0)):
        pauses = {connection.backoff(attempts) for _ in range(50)}
        assert all(ceiling / 2 <= pause <= ceiling for pause in pauses)
        assert len(pauses) > 1  # jittered: clients that lost one server do not return in step


def test_the_deadline_reaches_the_remote_target_from_every_entry_point() -> None:
    assert DEFAULT_TIMEOUT_S >= 30
    assert ServerTarget("http://x").timeout_s == DEFAULT_TIMEOUT_S
    built = remote_target("http://x", timeout_s=45.0)
    assert built is not None and built.timeout_s == 45.0
    args = build_parser().parse_args(["generate", "hi", "--remote", "http://x"])
    assert args.remote_timeout == DEFAULT_TIMEOUT_S
    args = build_parser().parse_args(["generate", "hi", "--remote-timeout", "60"])
    assert args.remote_timeout == 60.0
    with pytest.raises(ConfigError, match="remote-timeout"):
        Connection("http://x", timeout_s=0)


def test_the_serve_cache_budget_defaults_to_a_share_of_available_memory() -> None:
    pytest.importorskip("uvicorn")
    from edgespec.server.run import default_cache_mb

    assert default_cache_mb(8 * 2**30) == 2048.0
    assert default_cache_mb() > 0
    assert build_parser().parse_args(["serve"]).max_cache_mb is None
    assert build_parser().parse_args(["serve", "--max-cache-mb", "0"]).max_cache_mb == 0.0


def test_idle_connections_outlast_the_clients_pools() -> None:
    """A server that closes idle connections when its clients' pools may still reuse them
    loses requests without a trace (benchmarks/keepalive_race.py shows it)."""
    pytest.importorskip("uvicorn")
    from edgespec.server.options import ServerOptions
    from edgespec.server.run import uvicorn_config

    config = uvicorn_config(object(), host="127.0.0.1", port=1, options=ServerOptions())
    assert config.timeout_keep_alive > httpx.Limits().keepalive_expiry  # httpx: 5 s
