"""The JVM client (android_bridge) built with javac and tested from pytest: its JUnit suite
(protocol and policy vectors, loop, retries, re-open, budgets), and its command-line client
against a real ``edgespec serve`` on loopback: token-identical to the Python client, a killed
server gives a clean error with the partial tokens, a restarted server is recovered from.

Needs a JDK (javac, jar, java) and the junit4 and libandroid-json-org-java jars; without them
these tests skip and say what to install.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgespec.api import Engine
from edgespec.runtime.remote.edgespec_server import ServerTarget

from support.servers import ProcessServer, free_port


def _load_build_helper():
    """android_bridge/build.py, imported under its own name (it is not in the package)."""
    path = Path(__file__).resolve().parents[2] / "android_bridge" / "build.py"
    spec = importlib.util.spec_from_file_location("edgespec_android_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


bridge_build = _load_build_helper()

PROMPTS = ("def fibonacci(n):\n    if n", "import os\nimport sys\n\nclass ")
NEW_TOKENS = 48


@pytest.fixture(scope="module")
def bridge(tmp_path_factory: pytest.TempPathFactory) -> bridge_build.Built:
    try:
        return bridge_build.build(tmp_path_factory.mktemp("android_bridge"))
    except bridge_build.Unavailable as missing:
        pytest.skip(f"the JVM toolchain is not here: {missing}")


def test_junit_suite_passes(bridge: bridge_build.Built) -> None:
    done = bridge_build.run_junit(bridge)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "OK (" in done.stdout
    ran = int(done.stdout.rsplit("OK (", 1)[1].split()[0])
    assert ran >= 20, done.stdout


def test_android_source_set_is_compiled_but_not_packaged_with_stubs(
    bridge: bridge_build.Built,
) -> None:
    listing = subprocess.run(
        ["jar", "--list", "--file", str(bridge.android_jar)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "dev/edgespec/bridge/android/AndroidBattery.class" in listing
    assert "android/os/" not in listing  # the stubs stay out: a device has the real classes


# --- against a real server --------------------------------------------------------------


class SlowStartServer(ProcessServer):
    """``edgespec serve`` as a subprocess, with a start deadline for a heavily shared CPU."""

    start_timeout_s = 900.0


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[ProcessServer]:
    with SlowStartServer(target=pair[0], draft=pair[1], port=free_port()) as running:
        yield running


def ensure_running(server: ProcessServer) -> None:
    if server.process is None or server.process.poll() is not None:
        server.start()


def jvm_args(bridge: bridge_build.Built, url: str, prompt: list[int], **options: Any) -> list:
    command = ["java", "-cp", bridge.classpath(), "dev.edgespec.bridge.Cli", "--url", url]
    command += ["--prompt-ids", ",".join(map(str, prompt))]
    for name, value in {"max-new-tokens": NEW_TOKENS, **options}.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    return command


def run_jvm(bridge: bridge_build.Built, url: str, prompt: list[int], **options: Any) -> dict:
    done = subprocess.run(
        jvm_args(bridge, url, prompt, **options),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.integration
def test_jvm_greedy_equals_python_client_and_target_greedy(
    bridge: bridge_build.Built, pair: tuple[Path, Path], local: Engine, server: ProcessServer
) -> None:
    ensure_running(server)
    remote = Engine.load(draft=pair[1], remote=ServerTarget(server.url))
    for text in PROMPTS:
        prompt = local.encode(text)
        expected = local.generate(prompt, drafter="none", max_new_tokens=NEW_TOKENS).tokens
        python = remote.generate(prompt, drafter="ngram", k=3, max_new_tokens=NEW_TOKENS)
        assert python.tokens == expected
        for k in (0, 1, 3, 8):
            jvm = run_jvm(bridge, server.url, prompt, k=k)
            assert tuple(jvm["tokens"]) == expected, k
            assert jvm["reopens"] == 0 and jvm["retries"] == 0
            if k == 3:  # the same drafter, round for round
                assert jvm["rounds"] == python.stats.rounds
        auto = run_jvm(bridge, server.url, prompt, k="auto")
        assert tuple(auto["tokens"]) == expected


@pytest.mark.integration
def test_jvm_sampling_match_equals_python_and_rejection_runs(
    bridge: bridge_build.Built, pair: tuple[Path, Path], local: Engine, server: ProcessServer
) -> None:
    ensure_running(server)
    sampling = {"temperature": 0.9, "top_k": 20, "seed": 7}
    prompt = local.encode(PROMPTS[0])
    expected = local.generate(
        prompt, sampling_mode="match", k=4, max_new_tokens=NEW_TOKENS, **sampling
    ).tokens
    jvm = run_jvm(bridge, server.url, prompt, k=4, mode="match", **sampling)
    assert tuple(jvm["tokens"]) == expected
    # Rejection rounds (one-hot q_draft for the lookup drafter, the JVM's own uniforms) are
    # accepted by the server; their draws differ from numpy's, so only the shape is checked.
    rejection = run_jvm(bridge, server.url, prompt, k=4, mode="rejection", **sampling)
    assert len(rejection["tokens"]) == NEW_TOKENS or rejection["finish_reason"] == "eos"
    assert all(0 <= t < local.vocab_size for t in rejection["tokens"])


def paused_jvm(
    bridge: bridge_build.Built, url: str, prompt: list[int], **options: Any
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        jvm_args(bridge, url, prompt, pause_after_round=2, **options),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    problem = process.stderr.read() if process.stderr and not line else ""
    assert json.loads(line) == {"paused": 2}, line + problem
    return process


@pytest.mark.integration
def test_killed_server_gives_a_clean_error_with_the_partial_tokens(
    bridge: bridge_build.Built, local: Engine, server: ProcessServer
) -> None:
    ensure_running(server)
    prompt = local.encode(PROMPTS[1])
    expected = local.generate(prompt, drafter="none", max_new_tokens=NEW_TOKENS).tokens
    process = paused_jvm(bridge, server.url, prompt, k=3, retries=2, backoff_ms=50)
    server.kill()
    out, err = process.communicate("\n", timeout=900)
    assert process.returncode == 3, out + err
    answer = json.loads(out.strip().splitlines()[-1])
    partial = tuple(answer["partial_tokens"])
    assert len(partial) >= 3 and partial == expected[: len(partial)]
    assert "did not answer" in answer["error"] and "after 3 attempt(s)" in answer["error"]
    assert "Exception" not in err  # a clean message, no stack trace


@pytest.mark.integration
def test_restarted_server_is_recovered_from(
    bridge: bridge_build.Built, local: Engine, server: ProcessServer
) -> None:
    ensure_running(server)
    prompt = local.encode(PROMPTS[0])
    expected = local.generate(prompt, drafter="none", max_new_tokens=NEW_TOKENS).tokens
    process = paused_jvm(bridge, server.url, prompt, k=3)
    server.kill()
    server.start()  # same port, no sessions: the client re-opens from its own history
    out, err = process.communicate("\n", timeout=900)
    assert process.returncode == 0, out + err
    answer = json.loads(out.strip().splitlines()[-1])
    assert tuple(answer["tokens"]) == expected
    assert answer["reopens"] >= 1
