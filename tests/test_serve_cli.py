"""``edgespec serve``'s command line: its help, and a taken port reported before the model loads."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.errors import ConfigError
from edgespec.server.run import check_port

from servers import free_port


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
