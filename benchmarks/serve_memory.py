"""``edgespec serve``'s memory and model time under long ``echo`` + ``logprobs`` requests.

    python benchmarks/serve_memory.py [--words 1900] [--requests 4] [--idle-s 5] [--json OUT]
                                      [--target DIR --draft DIR]

Starts ``edgespec serve --api-key`` (the default model, or ``--target``) on a free loopback
port with ``--max-scored-positions 2048`` (the whole context of the default model, so that the
longest request is measured), then:

1. sends ``--requests`` times ``POST /v1/completions {"prompt": "word " * WORDS,
   "max_tokens": 1, "echo": true, "logprobs": 5}``, one at a time, sampling the server's RSS
   every 50 ms; prints each request's status, time and peak RSS, and the RSS after each;
2. waits ``--idle-s`` seconds and reads the RSS again;
3. restarts the server with the default bounds and sends the same request once: the status
   and detail of the refusal, and its time.

The RSS "after load" is read once the server answers ``/health``; it includes the measured
cost curve's passes (``edgespec serve`` measures them before it listens).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``edgespec serve`` in a subprocess (outside the checkout), stopped on exit."""

    def __init__(self, extra: list[str]) -> None:
        self.url = ""
        self.extra = extra
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Server:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "edgespec", "serve", "--port", str(port)]
        self.process = subprocess.Popen(
            [*command, "--api-key", KEY, *self.extra],
            cwd=tempfile.gettempdir(),
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "edgespec serve exited"
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError("edgespec serve did not answer within 600 s")

    def rss_mb(self) -> float:
        assert self.process is not None
        return float(psutil.Process(self.process.pid).memory_info().rss) / MB

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=60)


def timed_request(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    """One request, with the server's peak RSS while it ran (sampled every 50 ms)."""
    peak = [server.rss_mb()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak.append(server.rss_mb())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    answer = httpx.post(server.url + "/v1/completions", json=body, headers=AUTH, timeout=600)
    elapsed = time.perf_counter() - started
    done.set()
    sampler.join()
    shown = answer.json().get("detail") if answer.status_code != 200 else None
    return {
        "status": answer.status_code,
        "detail": shown,
        "seconds": round(elapsed, 2),
        "peak_rss_mb": round(max(peak), 1),
        "rss_after_mb": round(server.rss_mb(), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--words", type=int, default=1900)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--json", default=None, metavar="OUT")
    args = parser.parse_args()
    models = []
    if args.target:
        models += ["--target", str(args.target)]
    if args.draft:
        models += ["--draft", str(args.draft)]
    body = {"prompt": "word " * args.words, "max_tokens": 1, "echo": True, "logprobs": 5}
    report: dict[str, Any] = {"words": args.words}
    with Server([*models, "--max-scored-positions", "2048"]) as server:
        report["rss_after_load_mb"] = round(server.rss_mb(), 1)
        report["requests"] = [timed_request(server, body) for _ in range(args.requests)]
        time.sleep(args.idle_s)
        report["rss_after_idle_mb"] = round(server.rss_mb(), 1)
    with Server(models) as server:
        report["default_bounds"] = timed_request(server, body)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
