"""Servers as subprocesses on 127.0.0.1, ready once their health route answers; standard
library only, so that the benchmarks' harness (``benchmarks/harness.py``) starts its servers
with these where edgespec is not installed."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    """Whether ``GET url`` answers 200 within a second."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.HTTPError):
        return False


class ServerProcess:
    """A server started as a subprocess from ``args``, ready when ``GET url + health_path``
    answers 200; ``kill`` and ``start`` it again. A context manager that stops it. Its
    output goes to ``log`` (else nowhere); ``start_timeout_s`` bounds each start."""

    start_timeout_s = 120.0

    def __init__(
        self,
        args: list[str],
        *,
        port: int,
        health_path: str = "/health",
        log: Path | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        self.args = args
        self.url = f"http://127.0.0.1:{port}"
        self.health_path = health_path
        self.log = log
        if start_timeout_s is not None:
            self.start_timeout_s = start_timeout_s
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        """Starts it; the seconds until its health route answered."""
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        where = f" (log: {self.log})" if self.log else ""
        started = time.monotonic()
        # Run outside the checkout, as a deployed server runs: the package under test is the
        # installed one (test_first_minutes checks ``python -m edgespec`` inside the checkout).
        if self.log is None:
            sink: int = subprocess.DEVNULL
            self.process = subprocess.Popen(
                self.args, env=env, stderr=sink, cwd=tempfile.gettempdir()
            )
        else:
            with self.log.open("w") as out:  # the server keeps its own copy of the descriptor
                self.process = subprocess.Popen(
                    self.args, env=env, stdout=out, stderr=subprocess.STDOUT,
                    cwd=tempfile.gettempdir(),
                )  # fmt: skip
        while True:
            assert self.process.poll() is None, f"{self.args[:4]} exited{where}"
            elapsed = time.monotonic() - started
            assert elapsed < self.start_timeout_s, f"{self.args[:4]} did not start{where}"
            if answers(self.url + self.health_path):
                return elapsed
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


#: Where ``tools/build_llama_server.sh`` puts llama.cpp's programs ($EDGESPEC_LLAMA_CPP_DIR).
LLAMA_CPP_DIR = Path(
    os.environ.get("EDGESPEC_LLAMA_CPP_DIR", Path.home() / ".cache" / "edgespec" / "llama.cpp")
)


def llama_server_binary() -> Path | None:
    """llama.cpp's ``llama-server`` built by ``tools/build_llama_server.sh``, or None."""
    found = LLAMA_CPP_DIR / "bin" / "llama-server"
    return found if os.access(found, os.X_OK) else None


class LlamaServerProcess(ServerProcess):
    """llama.cpp's ``llama-server`` (``binary``) with ``args`` on ``port`` of 127.0.0.1,
    its output in a log file of the temporary directory."""

    def __init__(
        self, binary: Path, args: list[str], *, port: int, start_timeout_s: float = 300.0
    ) -> None:
        log = Path(tempfile.gettempdir()) / f"llama-server-{port}.log"
        command = [str(binary), *args, "--host", "127.0.0.1", "--port", str(port)]
        super().__init__(command, port=port, log=log, start_timeout_s=start_timeout_s)


class LlamaServer(LlamaServerProcess):
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
        args = ["-m", str(model), "-np", str(slots), *pool, "-t", str(threads), "--no-webui"]
        args += ["--no-cache-idle-slots"] if keep_idle_slots else []
        super().__init__(binary, args, port=port, start_timeout_s=ServerProcess.start_timeout_s)


#: Where ``tools/install_vllm.sh`` puts vLLM's CPU build ($EDGESPEC_VLLM_DIR): a virtual
#: environment of its own (its torch is the CPU wheel, its other dependencies pinned apart).
VLLM_DIR = Path(os.environ.get("EDGESPEC_VLLM_DIR", Path.home() / ".cache" / "edgespec" / "vllm"))


def vllm_python() -> Path | None:
    """The Python of the vLLM environment ``tools/install_vllm.sh`` makes, or None."""
    found = VLLM_DIR / "bin" / "python"
    return found if os.access(found, os.X_OK) else None


class VllmServer(ServerProcess):
    """vLLM's OpenAI-compatible server on a Hugging Face ``model`` folder, float32, eager
    (no graph capture on the CPU), prefix caching on with blocks of ``block_size`` tokens (its
    prefix cache keeps whole blocks), its output in a log file of the temporary directory.
    ``python -m vllm.entrypoints.openai.api_server``: the package's ``vllm serve`` script
    fails on the CPU build (``PackageNotFoundError: vllm``)."""

    start_timeout_s = 300.0

    def __init__(
        self,
        *,
        model: Path,
        port: int,
        block_size: int = 32,
        max_model_len: int = 2048,
        threads: int = 2,
    ) -> None:
        python = vllm_python()
        assert python is not None, "install vLLM first: bash tools/install_vllm.sh"
        log = Path(tempfile.gettempdir()) / f"vllm-{port}.log"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        command = [
            str(python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model), "--served-model-name", model.name,
            "--dtype", "float32", "--enforce-eager", "--enable-prefix-caching",
            "--block-size", str(block_size), "--max-model-len", str(max_model_len),
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        super().__init__(command, port=port, health_path="/v1/models", log=log)
