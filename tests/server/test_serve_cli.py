"""``edgespec serve``'s command line: its help, and a taken port reported before the model loads."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from edgespec.errors import ConfigError
from edgespec.server.run import check_port

from support.servers import free_port
from support.toy_pair import TOY_PAIR


def _serve(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # Outside the checkout, as tests/servers.py runs serve subprocesses.
    return subprocess.run(
        [sys.executable, "-m", "edgespec", "serve", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=cwd,
    )


def test_serve_help_shows_the_defaults(tmp_path: Path) -> None:
    result = _serve("--help", cwd=tmp_path)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--host HOST address to listen on (default: 127.0.0.1;" in text
    assert "--port PORT port to listen on (default: 8700)" in text
    for default in (
        "(default: 64)",
        "(default: 300.0)",
        "(default: 8)",
        "(default: a quarter of the memory available at start; 0: no cap)",
        "(default: 10.0)",  # --shutdown-grace
    ):
        assert default in text


def test_a_port_in_use_fails_in_one_line_before_serving(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        result = _serve("--port", str(port), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"edgespec: error: cannot listen on 127.0.0.1:{port}: ")
    assert "--port N" in lines[0] and "serving on" not in result.stderr


def test_check_port_accepts_a_free_port_and_refuses_out_of_range_ones() -> None:
    check_port("127.0.0.1", free_port())
    for port in (0, 70000):
        with pytest.raises(ConfigError, match=f"port {port} is out of range; pass --port N"):
            check_port("127.0.0.1", port)


def test_requests_are_logged_and_stopping_is_said(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    target, draft = TOY_PAIR / "target", TOY_PAIR / "draft"
    command = [sys.executable, "-m", "edgespec", "serve", "--target", str(target)]
    with tempfile.TemporaryFile("w+") as stderr:
        server = subprocess.Popen(
            [*command, "--draft", str(draft), "--port", str(port), "--shutdown-grace", "1"],
            stderr=stderr,
            cwd=tmp_path,
        )
        try:
            for _ in range(600):  # bounded: at most about a minute
                assert server.poll() is None, "the server exited"
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.1)
            assert httpx.get(url + "/no/such/route?key=secret", timeout=5).status_code == 404
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=60) == 0
        finally:
            if server.poll() is None:
                server.kill()
                server.wait(timeout=30)
        stderr.seek(0)
        lines = stderr.read().strip().splitlines()
    served = [line for line in lines if line.startswith("edgespec: 127.0.0.1 ")]
    assert any(
        line.startswith("edgespec: 127.0.0.1 GET /health 200 ") and line.endswith(" ms")
        for line in served
    ), lines
    # The query string (keys, prompts) stays out of the log.
    assert next(line for line in served if "/no/such/route" in line).startswith(
        "edgespec: 127.0.0.1 GET /no/such/route 404 "
    )
    assert not any("secret" in line for line in lines)
    assert lines[-1] == f"edgespec: stopped serving on {url}"
