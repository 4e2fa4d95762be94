"""One stderr line per request: ``edgespec: <client> <method> <path> <status> <ms> ms``.

ASGI middleware around the whole app, so it sees every answer, the guard's refusals and the
500s Starlette writes for unexpected failures included. The time runs from the request's start
to its last body byte sent; a request cut before it was answered (a client gone, a server
stopping) is logged with status 0. The query string is left out: keys and prompts stay out of
logs.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class AccessLog:
    """Writes one line per HTTP request to ``stream`` (default: the current ``sys.stderr``)."""

    def __init__(self, app: ASGIApp, *, stream: TextIO | None = None) -> None:
        self.app = app
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def timed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            elapsed_ms = (time.perf_counter() - started) * 1e3
            client = scope["client"][0] if scope.get("client") else "-"
            print(
                f"edgespec: {client} {scope['method']} {scope['path']} {status} "
                f"{elapsed_ms:.1f} ms",
                file=self.stream or sys.stderr,
                flush=True,
            )
