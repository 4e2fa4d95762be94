"""Verification servers for tests: in a thread or a subprocess, on 127.0.0.1, bounded waits."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from edgespec.runtime.k_policy import CostProfile

#: A made-up cost curve: the tests need one, not its accuracy.
FAKE_PROFILE = CostProfile(
    target_step_s=0.002, draft_step_s=0.0004, verify_cost=tuple(1.0 + 0.1 * w for w in range(9))
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThreadServer:
    """uvicorn serving ``app`` in a daemon thread, configured as ``edgespec serve`` configures
    it (``options``: its time limits); a context manager that stops it."""

    def __init__(self, app: Any, options: Any = None) -> None:
        import uvicorn

        from edgespec.server.options import ServerOptions
        from edgespec.server.run import uvicorn_config

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        chosen = options or ServerOptions(shutdown_grace_s=1)
        config = uvicorn_config(app, host="127.0.0.1", port=self.port, options=chosen)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the test server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


class ServerProcess:
    """A server started as a subprocess from ``args``, ready when ``GET url + health_path``
    answers 200; ``kill`` and ``start`` it again. A context manager that stops it."""

    start_timeout_s = 120.0

    def __init__(self, args: list[str], *, port: int, health_path: str = "/health") -> None:
        self.args = args
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        # Run outside the checkout, as a deployed server runs: the package under test is the
        # installed one (test_first_minutes checks ``python -m edgespec`` inside the checkout).
        self.process = subprocess.Popen(
            self.args, env=env, stderr=subprocess.DEVNULL, cwd=tempfile.gettempdir()
        )
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            assert self.process.poll() is None, f"{self.args[:4]} exited"
            assert time.monotonic() < deadline, f"{self.args[:4]} did not start"
            try:
                if httpx.get(self.url + self.health_path, timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill()


class ProcessServer(ServerProcess):
    """``edgespec serve`` as a subprocess on ``port``."""

    def __init__(
        self, *, target: Path, draft: Path, port: int, extra: tuple[str, ...] = ()
    ) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "edgespec",
                "serve",
                "--target",
                str(target),
                "--draft",
                str(draft),
                "--port",
                str(port),
                "--max-k",
                "8",
                *extra,
            ],
            port=port,
        )


class LlamaCppServer(ServerProcess):
    """llama-cpp-python's OpenAI-compatible server on a GGUF ``model``: one thread, and
    ``--logits_all`` so that completions can echo prompt log-probabilities."""

    def __init__(self, *, model: Path, port: int) -> None:
        super().__init__(
            [
                sys.executable,
                "-m",
                "llama_cpp.server",
                "--model",
                str(model),
                "--port",
                str(port),
                "--logits_all",
                "true",
                "--n_ctx",
                "256",
                "--n_threads",
                "1",
                "--n_threads_batch",
                "1",
            ],
            port=port,
            health_path="/v1/models",
        )


def client_for(engine: Any, **options: Any) -> Any:
    """An in-process test client of ``edgespec serve``'s app for ``engine`` (no socket)."""
    from fastapi.testclient import TestClient

    from edgespec.server.app import create_app
    from edgespec.server.options import ServerOptions

    app = create_app(engine, options=ServerOptions(**options), profile=FAKE_PROFILE)
    return TestClient(app, raise_server_exceptions=False)


#: Where ``tools/build_llama_server.sh`` puts llama.cpp's programs ($EDGESPEC_LLAMA_CPP_DIR).
LLAMA_CPP_DIR = Path(
    os.environ.get("EDGESPEC_LLAMA_CPP_DIR", Path.home() / ".cache" / "edgespec" / "llama.cpp")
)


def llama_server_binary() -> Path | None:
    """llama.cpp's ``llama-server`` built by ``tools/build_llama_server.sh``, or None."""
    found = LLAMA_CPP_DIR / "bin" / "llama-server"
    return found if os.access(found, os.X_OK) else None


class LlamaServer(ServerProcess):
    """llama.cpp's own ``llama-server`` on a GGUF ``model`` with ``slots`` slots of ``context``
    tokens each and idle slots kept (``--no-cache-idle-slots``), as docs/serving.md deploys it.
    ``unified`` shares one KV pool of ``context`` tokens instead (``--kv-unified``), with the
    server's default ``--cache-idle-slots`` unless ``keep_idle_slots``."""

    def __init__(
        self,
        *,
        model: Path,
        port: int,
        slots: int = 5,
        context: int = 4096,
        threads: int = 2,
        unified: bool = False,
        keep_idle_slots: bool = True,
    ) -> None:
        binary = llama_server_binary()
        assert binary is not None, "build llama-server first: bash tools/build_llama_server.sh"
        pool = ["--kv-unified", "-c", str(context)] if unified else ["-c", str(context * slots)]
        super().__init__(
            [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-np",
                str(slots),
                *pool,
                "-t",
                str(threads),
                "--no-webui",
                *(["--no-cache-idle-slots"] if keep_idle_slots else []),
            ],
            port=port,
        )
