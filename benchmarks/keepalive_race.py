"""Why a request can end in a read error that the server never logs: the keep-alive race.

    python benchmarks/keepalive_race.py [--unit 0.2] [--requests 300]

A client pool keeps an idle connection for its expiry (httpx and Java: 5 s; aiohttp: 15 s;
Go: 90 s; urllib3: no limit); uvicorn closes an idle one after ``timeout_keep_alive`` (5 s by
default). A request sent on a pooled connection just as the server closes it is lost: the
client reads an error (``ReadError``, ``RemoteProtocolError``), and the server, which never
parsed a request, logs nothing. Scaled to ``--unit`` seconds, with one request every time the
server's idle timeout runs out (give or take a few ms):

* the server closes idle connections before the client's pool lets go of them (1 unit against
  5): requests are lost;
* the server keeps them longer than the client's pool does (2 units against 1, as
  ``edgespec serve`` does: 10 s against its clients' 5 s): the client opens a new connection
  instead, and nothing is lost.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections import Counter

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import harness


def answer(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


APP = Starlette(routes=[Route("/", answer, methods=["POST"])])


def failures(*, server_idle_s: float, client_expiry_s: float, requests: int) -> Counter[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    config = uvicorn.Config(APP, log_level="warning", timeout_keep_alive=server_idle_s)  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    failed: Counter[str] = Counter()
    limits = httpx.Limits(keepalive_expiry=client_expiry_s)
    with httpx.Client(limits=limits) as client:
        for _ in range(requests):
            try:
                client.post(url, content=b"{}")
            except httpx.HTTPError as error:
                failed[type(error).__name__] += 1
            time.sleep(server_idle_s + random.uniform(-0.004, 0.002))
    server.should_exit = True
    thread.join()
    return failed


def main() -> None:
    parser = harness.argument_parser(__doc__, part="all", jsonl=False)
    parser.add_argument("--unit", type=float, default=0.2)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    for server_idle, client_expiry in ((1, 5), (2, 1)):
        failed = failures(
            server_idle_s=server_idle * args.unit,
            client_expiry_s=client_expiry * args.unit,
            requests=args.requests,
        )
        print(
            f"server idle timeout {server_idle} unit(s), client pool expiry {client_expiry}: "
            f"{sum(failed.values())} of {args.requests} requests failed {dict(failed)}"
        )


if __name__ == "__main__":
    main()
