"""A real ``edgespec serve`` subprocess killed mid-generation: recovery, or the fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.runtime.verifiers.remote import ServerTarget

from servers import ProcessServer, free_port

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
        remote = ServerTarget(server.url, retries=10, backoff_s=0.1, timeout_s=30)
        engine = Engine.load(draft=pair[1], remote=remote)
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
