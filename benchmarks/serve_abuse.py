"""``edgespec serve`` under abuse: a flood of hostile requests, then a restart under 16 clients.

    python benchmarks/serve_abuse.py [--rounds 50] [--clients 16] [--down-s 5] [--json OUT]

Starts ``edgespec serve`` (the built-in pair, ``--api-key``) on a free loopback port, then:

1. the flood: ``--rounds`` times each hostile request below (lone surrogates in every text
   field, deep nesting, a 1,000,001-item prompt, 38,000 stop strings, float and huge
   ``max_tokens``, invalid UTF-8, 64 MiB chunked bodies with and without the key, 5 MB and
   64 MiB bodies with a Content-Length, another client's session, the OpenAPI pages without
   the key), 8 at a time, while one verification client runs rounds (and before it, 200
   requests with 38,000 stop strings alone, and nothing); then 200 connections
   that send half their headers and wait;
2. the restart: ``--clients`` clients generate 200 tokens each through
   ``Engine.load(remote=URL)``; once all are mid-generation the server is killed, and started
   again ``--down-s`` seconds later;
3. SIGTERM.

Prints the statuses, the client-side errors, the server's RSS before and after the flood,
the verification client's round times, the restart window and whether every client finished
token-identical to local decoding, and the exit status after SIGTERM.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psutil

from edgespec.api import Engine

import harness

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT = "def fibonacci(n):\n    if n"
MiB = 1024 * 1024


def rss_mb(server: harness.ServerProcess) -> float:
    assert server.process is not None
    return float(psutil.Process(server.process.pid).memory_info().rss) / MiB


def post(path: str, body: bytes, *, headers: dict[str, str] | None = None) -> Callable[[], int]:
    def send() -> int:
        sent = {"Content-Type": "application/json", **AUTH, **(headers or {})}
        with httpx.Client(timeout=60) as client:
            return client.post(URL[0] + path, content=body, headers=sent).status_code

    return send


def get(path: str, headers: dict[str, str]) -> Callable[[], int]:
    return lambda: httpx.get(URL[0] + path, headers=headers, timeout=60).status_code


def chunked(total: int, *, key: bool) -> Callable[[], int]:
    """A raw chunked POST of ``total`` bytes; its status, or -1 when no answer was read.
    Records how much the client could send before the server closed the connection."""

    def send() -> int:
        host, port = URL[0].removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)), timeout=60)
        auth = f"Authorization: Bearer {KEY}\r\n" if key else ""
        sock.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{auth}"
            "Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n".encode()
        )
        answer: list[bytes] = []
        reader = threading.Thread(target=lambda: answer.append(_read_head(sock)))
        reader.start()
        chunk = b"a" * 65536
        sent = 0
        try:
            while sent < total:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
        except OSError:
            pass
        SENT_BEFORE_CLOSE.append(sent)
        reader.join()
        sock.close()
        head = answer[0] if answer else b""
        return int(head.split()[1]) if head.startswith(b"HTTP/1.1") else -1

    return send


def _read_head(sock: socket.socket) -> bytes:
    """The answer's status line and headers (empty when the server closed first)."""
    lines = []
    with contextlib.suppress(OSError), sock.makefile("rb") as stream:
        for line in stream:
            if line == b"\r\n":
                break
            lines.append(line)
    return b"".join(lines)


URL: list[str] = [""]
SENT_BEFORE_CLOSE: list[int] = []


def hostile_requests(session: tuple[str, str]) -> dict[str, Callable[[], int]]:
    """One sender per kind of hostile request; ``session`` is another client's (id, secret)."""
    session_id, secret = session
    stop = json.dumps(["x" * 100] * 38_000).encode()
    strings = b"[" + b",".join([b'"a"'] * 1_000_001) + b"]"
    huge = b"1" + b"0" * 30 + b"}"
    rounds = f"/v1/verify/sessions/{session_id}/rounds"
    round_body = json.dumps({"position": 2, "last_token": 7, "draft": [8]}).encode()
    return {
        "surrogate prompt": post("/v1/completions", b'{"prompt": "\\ud800", "max_tokens": 1}'),
        "surrogate chat content": post(
            "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\udfff"}]}'
        ),
        "surrogate chat role": post(
            "/v1/chat/completions", b'{"messages": [{"role": "\\ud800", "content": "a"}]}'
        ),
        "surrogate model": post("/v1/completions", b'{"prompt": "a", "model": "\\ud800"}'),
        "nesting 100,000 deep": post("/v1/completions", b'{"prompt": ' + b"[" * 100_000 + b"}"),
        "1,000,001 prompt strings": post("/v1/completions", b'{"prompt": ' + strings + b"}"),
        "38,000 stop strings": post(
            "/v1/completions", b'{"prompt": "a", "max_tokens": 2, "stop": ' + stop + b"}"
        ),
        "max_tokens 10001.0": post("/v1/completions", b'{"prompt": "a", "max_tokens": 10001.0}'),
        "max_tokens 1e30": post("/v1/completions", b'{"prompt": "a", "max_tokens": 1e30}'),
        "max_tokens 10**30": post("/v1/completions", b'{"prompt": "a", "max_tokens": ' + huge),
        "invalid UTF-8": post("/v1/completions", b'{"prompt": "\xff\xfe"}'),
        "64 MiB chunked, no key": chunked(64 * MiB, key=False),
        "64 MiB chunked, key": chunked(64 * MiB, key=True),
        "5 MB Content-Length": post("/v1/completions", b'{"prompt": "' + b"a" * 5_000_000 + b'"}'),
        "64 MiB Content-Length": post("/v1/completions", b'{"prompt": "' + b"a" * 64 * MiB + b'"}'),
        "another client's session": post(rounds, round_body),
        "another client's session, guessed secret": post(
            rounds, round_body, headers={"Edgespec-Session-Secret": secret[::-1]}
        ),
        "OpenAPI pages, no key": get("/openapi.json", {}),
        "valid completion": post("/v1/completions", b'{"prompt": "def f(", "max_tokens": 16}'),
    }  # fmt: skip


def flood(senders: dict[str, Callable[[], int]], rounds: int) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    failures: Counter[str] = Counter()

    def one(name: str) -> None:
        try:
            statuses[f"{name}: {senders[name]()}"] += 1
        except httpx.HTTPError as error:  # the connection failed: no status was read
            failures[f"{name}: {type(error).__name__}"] += 1

    names = [name for _ in range(rounds) for name in senders]
    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))
    return {
        "requests": len(names),
        "seconds": round(time.monotonic() - started, 1),
        "statuses": dict(statuses),
        "client_errors": dict(failures),
    }


def verifier_rounds(stop: threading.Event) -> list[float]:
    """A verification client's round times (ms) until ``stop``."""
    with httpx.Client(headers=AUTH, timeout=60) as client:
        opened = client.post(
            URL[0] + "/v1/verify/sessions",
            json={"prompt": [5, 6, 7], "sampling": {"temperature": 0, "top_k": 0, "top_p": 1,
                                                    "seed": 0, "mode": "match"}},
        ).json()  # fmt: skip
        path = f"{URL[0]}/v1/verify/sessions/{opened['session_id']}/rounds"
        headers = {"Edgespec-Session-Secret": opened["session_secret"]}
        times = []
        while not stop.is_set():
            started = time.perf_counter()
            client.post(path, json={"position": 2, "last_token": 7, "draft": [8, 9, 10]},
                        headers=headers)  # fmt: skip
            times.append((time.perf_counter() - started) * 1e3)
    return times


def rounds_during(work: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
    """``work``'s result, and a verification client's round times (ms) meanwhile."""
    stop = threading.Event()
    times: list[list[float]] = []
    timer = threading.Thread(target=lambda: times.append(verifier_rounds(stop)))
    timer.start()
    result = work()
    stop.set()
    timer.join()
    return result, summary(times[0])


def summary(times: list[float]) -> dict[str, float]:
    return {
        "rounds": len(times),
        "median": round(statistics.median(times), 1),
        "max": round(max(times), 1),
    }


def half_headers(count: int, wait_s: float) -> int:
    """Opens ``count`` connections that send half their headers; returns how many the server
    closed within ``wait_s``."""
    host, port = URL[0].removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(count)]
    for sock in socks:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        sock.settimeout(wait_s)
    closed = 0
    for sock in socks:
        with contextlib.suppress(OSError):
            closed += sock.recv(1) == b""
        sock.close()
    return closed


def restart_under_clients(
    server: harness.ServerProcess, clients: int, down_s: float
) -> dict[str, Any]:
    local = Engine.load()
    expected = local.generate(PROMPT, max_new_tokens=200).tokens
    engines = [Engine.load(remote=server.url, api_key=KEY) for _ in range(clients)]
    started, killed = threading.Barrier(clients + 1), threading.Event()
    results: list[Any] = [None] * clients

    def client(index: int) -> None:
        generation = engines[index].stream_deltas(PROMPT, max_new_tokens=200)
        for count, _ in enumerate(generation):
            if count == 0:
                started.wait()
                killed.wait()
        results[index] = generation.result

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    started.wait()
    assert server.process is not None
    server.process.kill()
    server.process.wait()
    down_at = time.monotonic()
    killed.set()
    time.sleep(down_s)
    startup_s = server.start()
    window_s = time.monotonic() - down_at
    for thread in threads:
        thread.join()
    return {
        "clients": clients,
        "down_s": down_s,
        "restart_window_s": round(window_s, 2),
        "cold_start_s": round(startup_s, 2),
        "identical_to_local": sum(r.tokens == expected and r.error is None for r in results),
        "reopens": sum(r.stats.remote["reopens"] for r in results),
        "retries": sum(r.stats.remote["retries"] for r in results),
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, part="all", json_out=True, jsonl=False)
    parser.add_argument("--rounds", type=int, default=50, help="times each request is sent")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--down-s", type=float, default=5.0)
    args = parser.parse_args()
    # No start deadline: the restart is timed from the kill to the first answer.
    server = harness.edgespec_server(["--api-key", KEY], start_timeout_s=float("inf"))
    URL[0] = server.url
    report: dict[str, Any] = {"cold_start_s": round(server.start(), 2)}
    with httpx.Client(headers=AUTH) as client:
        opened = client.post(URL[0] + "/v1/verify/sessions", json={"prompt": [1, 2, 3]}).json()
    report["rss_before_mb"] = round(rss_mb(server), 1)
    report["round_ms_idle"] = rounds_during(lambda: time.sleep(5.0))[1]
    senders = hostile_requests((opened["session_id"], opened["session_secret"]))
    stop_only = {"38,000 stop strings": senders["38,000 stop strings"]}
    report["stop_lists"], report["round_ms_during_stop_lists"] = rounds_during(
        lambda: flood(stop_only, 200)
    )
    report["flood"], report["round_ms_during_flood"] = rounds_during(
        lambda: flood(senders, args.rounds)
    )
    report["rss_after_mb"] = round(rss_mb(server), 1)
    report["chunked_bytes_sent_before_close_mb_max"] = round(max(SENT_BEFORE_CLOSE) / MiB, 1)
    report["half_header_connections_closed"] = f"{half_headers(200, 30.0)} of 200"
    report["restart"] = restart_under_clients(server, args.clients, args.down_s)
    assert server.process is not None
    server.process.send_signal(signal.SIGTERM)
    report["sigterm_exit_status"] = server.process.wait(timeout=120)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
