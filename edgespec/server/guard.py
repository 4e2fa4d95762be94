"""The server's front door: ASGI middleware that runs before FastAPI reads or parses anything.

:class:`RequestGuard` checks the API key from the headers alone, so that a client without it
gets its 401 before one byte of its body is read. It then reads the body itself, whatever the
transfer encoding (chunked included), storing at most ``max_body_bytes`` and giving up on a
client that sends it too slowly; and it refuses a JSON body that is not UTF-8, nests too
deeply, holds a list longer than any request needs, or a string that is not Unicode text (a
lone surrogate such as ``"\\ud800"``, which JSON can spell but no tokenizer can take), naming
the field. Only then does FastAPI see the request, with the body already read.

:class:`StatusCounter` counts every answer's status for ``/metrics``; the 500s, which escape
it, are counted by the app's exception handler.
"""

from __future__ import annotations

import hmac
import json
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import anyio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Longest ``detail`` of an error answer: the first problems, never the whole input.
MAX_DETAIL_CHARS = 1000
#: Paths answered without the API key (``/health`` then says up or down, nothing more).
PUBLIC_PATHS = frozenset({"/health"})


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """``max_items``: the longest JSON list (or object) anywhere in a body; the app sets it to
    the longest a valid request holds (a prompt of the whole context, a q_draft row of the
    whole vocabulary). ``read_timeout_s``: time to send the whole body. ``drain_bytes``: how
    much of an over-limit body is read and dropped before the 413, so that a client that is
    still sending reads the answer instead of a reset connection."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_depth: int = 32
    max_items: int = 65536
    read_timeout_s: float = 30.0
    drain_bytes: int = 1024 * 1024


def bounded(detail: str) -> str:
    return detail if len(detail) <= MAX_DETAIL_CHARS else detail[: MAX_DETAIL_CHARS - 3] + "..."


def refusal(
    status: int, detail: str, *, close: bool = False, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error answer; ``close`` when the request's body was not read to its end (the
    connection cannot carry another request, and must not read the rest)."""
    extra = dict(headers or {})
    if close:
        extra["connection"] = "close"
    return JSONResponse({"detail": bounded(detail)}, status_code=status, headers=extra)


def authorized(headers: Headers, api_key: str | None) -> bool:
    """Whether the request carries ``Authorization: Bearer KEY`` (constant-time compare)."""
    if api_key is None:
        return True
    given = headers.get("authorization", "").encode("utf-8", "replace")
    return hmac.compare_digest(given, f"Bearer {api_key}".encode())


def json_problem(body: bytes, *, max_depth: int, max_items: int) -> str | None:
    """Why ``body`` is not acceptable JSON text, or None. Walks the document once, without
    recursion; field paths are built only for the answer."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as error:
        return f"the body is not valid UTF-8 (byte {error.start})"
    except RecursionError:
        return f"the body nests deeper than {max_depth} levels"
    except ValueError as error:  # JSONDecodeError, or an integer of thousands of digits
        return f"the body is not valid JSON: {str(error)[:120]}"
    if isinstance(data, str):
        return None if _is_text(data) else "the body is a string that is not Unicode text"
    stack: list[tuple[Any, str, int]] = [(data, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if not isinstance(value, (list, dict)):
            continue
        if depth > max_depth:
            return f"the body nests deeper than {max_depth} levels (at '{path}')"
        if len(value) > max_items:
            return f"'{path or 'body'}' holds {len(value)} items, more than {max_items}"
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and not _is_text(key):
                return f"a key in '{path or 'body'}' holds a lone surrogate (not Unicode text)"
            if isinstance(item, str) and not _is_text(item):
                return f"'{_join(path, key)}' holds a lone surrogate (not Unicode text)"
            if isinstance(item, (list, dict)):
                stack.append((item, _join(path, key), depth + 1))
    return None


def _is_text(value: str) -> bool:
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    shown = json.dumps(key)[1:-1]  # ASCII, escaped: the key came from the client
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return f"{path}.{shown}" if path else shown


class _Refused(Exception):
    def __init__(self, response: JSONResponse) -> None:
        self.response = response


class _ClientGone(Exception):
    """The client disconnected while sending its body: nothing to answer."""


class RequestGuard:
    """The key, then the body, read under :class:`RequestLimits` (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, limits: RequestLimits) -> None:
        self.app = app
        self.api_key = api_key
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        public = scope["path"] in PUBLIC_PATHS
        if public and _declares_body(headers):
            # Anyone may ask for /health: it reads nothing (a body would be read for no one).
            await refusal(413, "this route takes no body; send none", close=True)(
                scope, receive, send
            )
            return
        if not public and not authorized(headers, self.api_key):
            answer = refusal(
                401,
                "missing or wrong API key; send Authorization: Bearer KEY",
                close=True,
                headers={"WWW-Authenticate": "Bearer"},
            )
            await answer(scope, receive, send)
            return
        try:
            body = await self._read_body(headers, receive)
            if body and scope["method"] == "POST":
                limits = self.limits
                problem = json_problem(body, max_depth=limits.max_depth, max_items=limits.max_items)
                if problem is not None:
                    raise _Refused(refusal(422, f"{problem}; send a valid request"))
        except _Refused as refused:
            await refused.response(scope, receive, send)
            return
        except _ClientGone:
            return
        await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, headers: Headers, receive: Receive) -> bytes:
        """The whole body, or :class:`_Refused` (413 past the limit, 408 past the time)."""
        limits = self.limits
        declared = headers.get("content-length")
        if not _declares_body(headers):
            return b""
        over = declared is not None and (
            not declared.isdigit() or int(declared) > limits.max_body_bytes
        )
        chunks: list[bytes] = []
        size = 0
        with anyio.move_on_after(limits.read_timeout_s) as deadline:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone()
                piece = message.get("body", b"")
                size += len(piece)
                over = over or size > limits.max_body_bytes
                if not over:
                    chunks.append(piece)
                elif size > limits.max_body_bytes + limits.drain_bytes:
                    break  # stop reading: the rest is never read
                if not message.get("more_body", False):
                    if over:
                        raise _Refused(self._too_large(ended=True))
                    return b"".join(chunks)
        if deadline.cancelled_caught:
            raise _Refused(
                refusal(
                    408,
                    f"the body took over {limits.read_timeout_s:g} s to arrive; send it at once",
                    close=True,
                )
            )
        raise _Refused(self._too_large(ended=False))

    def _too_large(self, *, ended: bool) -> JSONResponse:
        limit = self.limits.max_body_bytes
        return refusal(
            413, f"the request body is over {limit} bytes; send a smaller one", close=not ended
        )


def _declares_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    return chunked or (length is not None and length != "0")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then listens to the client."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


class StatusCounter:
    """Counts each answer by status (``responses_<status>``, and ``errors_<status>`` from 400
    on) in ``counters``: the store's, which ``/metrics`` reports."""

    def __init__(self, app: ASGIApp, *, counters: Counter[str]) -> None:
        self.app = app
        self.counters = counters

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                count_status(self.counters, int(message["status"]))
            await send(message)

        await self.app(scope, receive, counted)


def count_status(counters: Counter[str], status: int) -> None:
    counters[f"responses_{status}"] += 1
    if status >= 400:
        counters[f"errors_{status}"] += 1
