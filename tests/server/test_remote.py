"""Remote verification on loopback: remote output equals local output, sessions survive loss."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.runtime.remote.edgespec_server import ServerTarget
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions
from edgespec.server.sessions import StoreLimits

from support.servers import FAKE_PROFILE, ThreadServer

pytestmark = pytest.mark.integration

PROMPTS = ("def fibonacci(n):\n    if n", "import os\nimport sys\n\nclass ")


@pytest.fixture(scope="module")
def server(local: Engine) -> Iterator[ThreadServer]:
    with ThreadServer(create_app(local, profile=FAKE_PROFILE)) as running:
        yield running


def remote_engine(pair: tuple[Path, Path], url: str, **options: object) -> Engine:
    return Engine.load(draft=pair[1], remote=ServerTarget(url, **options))  # type: ignore[arg-type]


def test_remote_greedy_equals_local_greedy(
    pair: tuple[Path, Path], local: Engine, server: ThreadServer
) -> None:
    remote = remote_engine(pair, server.url)
    assert remote.target is None  # nothing of the target is loaded on the device
    for prompt in PROMPTS:
        expected = local.generate(prompt, drafter="none", max_new_tokens=48)
        for drafter, k in (("model", 1), ("model", 4), ("model", 8), ("ngram", 3), ("none", 0)):
            result = remote.generate(prompt, drafter=drafter, k=k, max_new_tokens=48)
            assert result.tokens == expected.tokens, (drafter, k)
            assert result.text == expected.text
            traffic = result.stats.remote
            assert traffic["round_trips"] == result.stats.rounds + 1  # + the open
            assert traffic["bytes_sent_per_token"] > 0
            assert 0.0 <= traffic["rtt_share"] <= 1.0


@pytest.mark.parametrize(
    "sampling",
    [
        {"temperature": 0.8, "top_k": 20, "seed": 3},
        {"temperature": 1.0, "seed": 11},
        {"temperature": 0.7, "top_p": 0.9, "seed": 5},
        {"temperature": 0.9, "seed": 7, "sampling_mode": "match"},
    ],
)
def test_remote_sampling_equals_local_sampling(
    pair: tuple[Path, Path], local: Engine, server: ThreadServer, sampling: dict
) -> None:
    remote = remote_engine(pair, server.url)
    for prompt in PROMPTS:
        for k in (1, 4):
            expected = local.generate(prompt, k=k, max_new_tokens=40, **sampling)
            result = remote.generate(prompt, k=k, max_new_tokens=40, **sampling)
            assert result.tokens == expected.tokens, (prompt, k)


def test_32_concurrent_sessions(
    pair: tuple[Path, Path], local: Engine, server: ThreadServer
) -> None:
    # Each request waits behind up to 31 others: on a loaded machine the client's default 30 s
    # deadline is a latency test, which this is not (a failed round is named below).
    remote = remote_engine(pair, server.url, timeout_s=300)
    prompts = [f"{PROMPTS[i % 2]}{'x' * (i % 5)} = {i}" for i in range(32)]
    seeds = list(range(32))
    results: dict[int, tuple[int, ...]] = {}
    errors: list[BaseException] = []

    def run(index: int) -> None:
        try:
            options = {"temperature": 0.8, "top_k": 40, "seed": seeds[index]} if index % 2 else {}
            result = remote.generate(prompts[index], k=4, max_new_tokens=128, **options)
            assert result.error is None, (index, result.error)
            results[index] = result.tokens
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not errors, errors[:3]
    assert len(results) == 32
    for index in range(32):
        options = {"temperature": 0.8, "top_k": 40, "seed": seeds[index]} if index % 2 else {}
        expected = local.generate(prompts[index], k=4, max_new_tokens=128, **options)
        assert results[index] == expected.tokens, index


def test_evicted_sessions_are_reopened_from_the_client_history(
    pair: tuple[Path, Path], local: Engine
) -> None:
    limits = StoreLimits(max_sessions=1)
    app = create_app(local, options=ServerOptions(limits=limits), profile=FAKE_PROFILE)
    with ThreadServer(app) as running:
        remote = remote_engine(pair, running.url)
        first = remote.stream_deltas(PROMPTS[0], k=3, max_new_tokens=40)
        second = remote.stream_deltas(PROMPTS[1], k=3, max_new_tokens=40)
        # Interleaved: each round of one evicts the other's session.
        iterators = [iter(first), iter(second)]
        while iterators:
            for iterator in list(iterators):
                if next(iterator, None) is None:
                    iterators.remove(iterator)
        for generation, prompt in ((first, PROMPTS[0]), (second, PROMPTS[1])):
            assert generation.result is not None
            expected = local.generate(prompt, k=3, max_new_tokens=40)
            assert generation.result.tokens == expected.tokens
            assert generation.result.stats.remote["reopens"] > 0
        assert app.state.store.counters["sessions_evicted"] > 0


def test_a_draft_of_another_tokenizer_is_refused(
    pair: tuple[Path, Path], server: ThreadServer
) -> None:
    """The server's target reads back as the draft's tokens: a draft of another vocabulary is
    refused at load with one line, the same tokenizer passes."""
    from dataclasses import replace

    from edgespec.engine.planning import check_remote_tokenizer
    from edgespec.errors import IncompatiblePairError
    from edgespec.manifest import load_bundle
    from edgespec.runtime.model import OnnxModel

    target = ServerTarget(server.url)
    draft = OnnxModel(load_bundle(pair[1]))
    info = target.info()
    check_remote_tokenizer(info, draft, target)  # the pair's own tokenizer
    other = replace(info, tokenizer_sha256="0" * 64, vocab_size=info.vocab_size + 1000)
    with pytest.raises(IncompatiblePairError, match="vocabulary of"):
        check_remote_tokenizer(other, draft, target)


def test_a_url_is_asked_what_it_speaks(
    pair: tuple[Path, Path],
    local: Engine,
    server: ThreadServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``remote_api`` "auto" (the default) finds 'edgespec serve' by its info route, and a URL
    where nothing answers yet keeps edgespec's protocol (its deadline then applies); naming
    "openai" for 'edgespec serve' works, and says in one line what it costs."""
    from edgespec.runtime.remote.openai import OpenAITarget
    from edgespec.runtime.remote.registry import remote_target

    found = Engine.load(draft=pair[1], remote=server.url)
    assert isinstance(found.remote, ServerTarget)
    expected = local.generate(PROMPTS[0], drafter="none", max_new_tokens=16)
    assert found.generate(PROMPTS[0], max_new_tokens=16, k=3).tokens == expected.tokens
    assert isinstance(remote_target("http://127.0.0.1:9", timeout_s=0.5), ServerTarget)

    caplog.clear()
    named = Engine.load(draft=pair[1], remote=server.url, remote_api="openai")
    assert isinstance(named.remote, OpenAITarget)
    said = [r.message for r in caplog.records if "edgespec serve" in r.message]
    assert len(said) == 1 and "drop --remote-api openai" in said[0]
