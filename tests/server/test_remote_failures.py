"""A real ``edgespec serve`` subprocess killed mid-generation: recovery, or the fallbacks;
and stopped with SIGTERM."""

from __future__ import annotations

import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from edgespec.api import Engine, Result
from edgespec.runtime.remote.edgespec_server import ServerTarget

from support.servers import ProcessServer, free_port

pytestmark = pytest.mark.integration

PROMPT = "def fibonacci(n):\n    if n"
NEW_TOKENS = 96


@pytest.fixture(scope="module")
def expected(pair: tuple[Path, Path]) -> tuple[int, ...]:
    local = Engine.load(target=pair[0], draft=pair[1])
    return local.generate(PROMPT, k=3, max_new_tokens=NEW_TOKENS).tokens


def run_with_kill(
    engine: Engine, server: ProcessServer, *, restart: bool, **options: object
) -> tuple[Engine, object]:
    generation = engine.stream_deltas(PROMPT, k=3, max_new_tokens=NEW_TOKENS, **options)  # type: ignore[arg-type]
    for count, _ in enumerate(generation):
        if count == 2:
            server.kill()
            if restart:
                server.start()
    return engine, generation.result


def test_server_restarted_mid_generation_loses_nothing(
    pair: tuple[Path, Path], expected: tuple[int, ...]
) -> None:
    with ProcessServer(target=pair[0], draft=pair[1], port=free_port()) as server:
        engine = Engine.load(draft=pair[1], remote=server.url)
        _, result = run_with_kill(engine, server, restart=True)
        assert result.error is None  # type: ignore[attr-defined]
        assert result.tokens == expected  # type: ignore[attr-defined]
        stats = result.stats.remote  # type: ignore[attr-defined]
        assert stats["reopens"] >= 1  # the restarted server had lost the session


def test_fallbacks_when_the_server_stays_down(
    pair: tuple[Path, Path], expected: tuple[int, ...]
) -> None:
    port = free_port()
    with ProcessServer(target=pair[0], draft=pair[1], port=port) as server:
        quick = ServerTarget(server.url, retries=2, backoff_s=0.01, timeout_s=5)
        failing = Engine.load(draft=pair[1], remote=quick)
        _, result = run_with_kill(failing, server, restart=False)
        assert result.finish_reason == "error"  # type: ignore[attr-defined]
        assert "did not answer" in result.error  # type: ignore[attr-defined]
        partial = result.tokens  # type: ignore[attr-defined]
        assert 0 < len(partial) < NEW_TOKENS and partial == expected[: len(partial)]

        server.start()
        quick = ServerTarget(server.url, retries=2, backoff_s=0.01, timeout_s=5)
        local = Engine.load(target=pair[0], draft=pair[1], remote=quick, fallback="local")
        _, result = run_with_kill(local, server, restart=False)
        assert result.tokens == expected  # type: ignore[attr-defined]
        assert result.stats.fell_back and not result.stats.lossy  # type: ignore[attr-defined]

        server.start()
        quick = ServerTarget(server.url, retries=2, backoff_s=0.01, timeout_s=5)
        drafting = Engine.load(draft=pair[1], remote=quick, fallback="draft")
        _, result = run_with_kill(drafting, server, restart=False)
        assert len(result.tokens) == NEW_TOKENS or result.finish_reason == "eos"  # type: ignore[attr-defined]
        assert result.stats.fell_back and result.stats.lossy  # type: ignore[attr-defined]


CLIENTS = 16
#: How long the server stays down: longer than the old client's whole retry window (6.2 s
#: counting from the first failure, less the time the restarted server takes to answer).
DOWN_S = 5.0


def test_sixteen_clients_ride_out_a_restart(
    pair: tuple[Path, Path], expected: tuple[int, ...]
) -> None:
    """Killed while 16 clients are mid-generation, restarted 5 s later: within the clients'
    default deadline (30 s), so every one finishes with the local greedy tokens."""
    with ProcessServer(target=pair[0], draft=pair[1], port=free_port()) as server:
        engines = [Engine.load(draft=pair[1], remote=server.url) for _ in range(CLIENTS)]
        started = threading.Barrier(CLIENTS + 1)
        killed = threading.Event()
        results: list[Result | None] = [None] * CLIENTS

        def client(index: int) -> None:
            generation = engines[index].stream_deltas(PROMPT, k=3, max_new_tokens=NEW_TOKENS)
            for count, _ in enumerate(generation):
                if count == 0:
                    started.wait()
                    killed.wait()
            results[index] = generation.result

        threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        started.wait()  # every client holds a session, mid-generation
        server.kill()
        killed.set()  # their next rounds meet a dead server
        time.sleep(DOWN_S)
        server.start()
        for thread in threads:
            thread.join()
    for result in results:
        assert result is not None and result.error is None, result and result.error
        assert result.tokens == expected
        assert result.stats.remote["reopens"] >= 1  # type: ignore[index]


def test_sigterm_drains_within_the_grace_and_exits_0(pair: tuple[Path, Path]) -> None:
    server = ProcessServer(
        target=pair[0], draft=pair[1], port=free_port(), extra=("--shutdown-grace", "1")
    )
    with server:
        # A request in flight that never ends on its own: its body is never finished.
        stuck = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        stuck.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"prompt": '
        )
        remote = Engine.load(draft=pair[1], remote=server.url)
        assert remote.generate(PROMPT, k=3, max_new_tokens=8).error is None
        assert server.process is not None
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=120) == 0  # a hang guard, not a speed check
        stuck.close()


def test_a_server_known_to_be_down_is_skipped_until_it_answers(
    pair: tuple[Path, Path], expected: tuple[int, ...]
) -> None:
    with ProcessServer(target=pair[0], draft=pair[1], port=free_port()) as server:
        quick = ServerTarget(server.url, retries=2, backoff_s=0.01, timeout_s=5)
        engine = Engine.load(target=pair[0], draft=pair[1], remote=quick, fallback="local")
        health = engine._source.health
        assert health is not None and health.down is None
        health.every_s = 0.05
        _, first = run_with_kill(engine, server, restart=False)
        assert first.tokens == expected and first.stats.fell_back  # type: ignore[attr-defined]
        assert "--fallback" not in first.stats.fell_back  # type: ignore[attr-defined]

        # The next generation does not wait the server's deadline out again: no request.
        second = engine.generate(PROMPT, k=3, max_new_tokens=NEW_TOKENS)
        assert second.tokens == expected
        assert second.stats.remote is None
        assert second.stats.fell_back is not None and "down for" in second.stats.fell_back

        server.start()  # the background probe finds it again
        for _ in range(400):
            if health.down is None:
                break
            time.sleep(0.05)
        third = engine.generate(PROMPT, k=3, max_new_tokens=NEW_TOKENS)
        assert third.tokens == expected and third.stats.fell_back is None
        assert third.stats.remote is not None and third.stats.remote["round_trips"] > 0
        engine.close()
