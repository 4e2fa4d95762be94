"""Verification servers for tests: in a thread or a subprocess, on 127.0.0.1, bounded waits
(the subprocesses and llama.cpp's server: :mod:`support.processes`)."""

from __future__ import annotations

import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edgespec.runtime.k_policy import CostProfile

from support.processes import (
    LLAMA_CPP_DIR,
    LlamaServer,
    ServerProcess,
    free_port,
    llama_server_binary,
)

__all__ = [
    "FAKE_PROFILE",
    "LLAMA_CPP_DIR",
    "LlamaCppServer",
    "LlamaServer",
    "ProcessServer",
    "ServerProcess",
    "ThreadServer",
    "client_for",
    "free_port",
    "llama_server_binary",
]

#: A made-up cost curve: the tests need one, not its accuracy.
FAKE_PROFILE = CostProfile(
    target_step_s=0.002, draft_step_s=0.0004, verify_cost=tuple(1.0 + 0.1 * w for w in range(9))
)


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
