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

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

import harness

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MB = 1024 * 1024


def rss_mb(server: harness.ServerProcess) -> float:
    assert server.process is not None
    return float(psutil.Process(server.process.pid).memory_info().rss) / MB


def timed_request(server: harness.ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    """One request, with the server's peak RSS while it ran (sampled every 50 ms)."""
    peak = [rss_mb(server)]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak.append(rss_mb(server))

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
        "rss_after_mb": round(rss_mb(server), 1),
    }


def main() -> None:
    parser = harness.argument_parser(__doc__, part="all", json_out=True, jsonl=False)
    parser.add_argument("--words", type=int, default=1900)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--target", type=Path, default=None)
    parser.add_argument("--draft", type=Path, default=None)
    args = parser.parse_args()
    models = []
    if args.target:
        models += ["--target", str(args.target)]
    if args.draft:
        models += ["--draft", str(args.draft)]
    body = {"prompt": "word " * args.words, "max_tokens": 1, "echo": True, "logprobs": 5}
    report: dict[str, Any] = {"words": args.words}
    bounds = ["--max-scored-positions", "2048"]
    with harness.edgespec_server(["--api-key", KEY, *models, *bounds]) as server:
        report["rss_after_load_mb"] = round(rss_mb(server), 1)
        report["requests"] = [timed_request(server, body) for _ in range(args.requests)]
        time.sleep(args.idle_s)
        report["rss_after_idle_mb"] = round(rss_mb(server), 1)
    with harness.edgespec_server(["--api-key", KEY, *models]) as server:
        report["default_bounds"] = timed_request(server, body)
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
