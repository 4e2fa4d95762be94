"""``edgespec serve`` on a real socket: bodies over the limit, chunked, are refused without being
read whole (before the key is known, or past the limit), ``/health`` reads no body, and clients
that send their headers or body too slowly are cut off."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from edgespec.api import Engine
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions

from support.servers import FAKE_PROFILE, ThreadServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(exported: Callable[..., Path]) -> Engine:
    return Engine.load(target=exported("llama", "fp32"), draft=exported("mistral", "fp32"))


def raw_request(port: int, head: str) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)  # a hang guard only
    sock.sendall(head.encode())
    return sock


def send_until_refused(sock: socket.socket, total: int) -> int:
    """Sends a chunked body of ``total`` bytes; returns how much went out before the server
    closed the connection."""
    chunk = b"a" * 65536
    framed = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            sock.sendall(framed)
            sent += len(chunk)
        sock.sendall(b"0\r\n\r\n")
    except OSError:  # reset or broken pipe: the server stopped reading
        pass
    return sent


def read_answer(sock: socket.socket) -> bytes:
    received = b""
    try:
        while b"\r\n\r\n" not in received:
            piece = sock.recv(65536)
            if not piece:
                break
            received += piece
    except OSError:
        pass
    return received


CHUNKED_HEAD = (
    "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    "Transfer-Encoding: chunked\r\n{auth}\r\n"
)
HUGE = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def wire_server(engine: Engine) -> Iterator[ThreadServer]:
    options = ServerOptions(
        api_key="k",
        max_body_bytes=256 * 1024,
        read_timeout_s=1.0,
        header_timeout_s=1.0,
        shutdown_grace_s=1,
    )
    app = create_app(engine, options=options, profile=FAKE_PROFILE)
    with ThreadServer(app, options) as running:
        yield running


def refused_while_sending(port: int, head: str) -> tuple[bytes, int]:
    """Sends ``head`` then a 64 MiB chunked body, reading the answer meanwhile (a server that
    closes the connection resets it, and the answer could be lost if read after); returns the
    answer's head and how much of the body went out."""
    sock = raw_request(port, head)
    answer: list[bytes] = []
    reader = threading.Thread(target=lambda: answer.append(read_answer(sock)))
    reader.start()
    sent = send_until_refused(sock, HUGE)
    reader.join()
    sock.close()
    return answer[0], sent


def test_a_chunked_body_without_the_key_is_refused_unread(wire_server: ThreadServer) -> None:
    answer, sent = refused_while_sending(wire_server.port, CHUNKED_HEAD.format(auth=""))
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert sent < HUGE  # the server closed the connection instead of reading the body


def test_a_chunked_body_over_the_limit_stops_being_read(wire_server: ThreadServer) -> None:
    head = CHUNKED_HEAD.format(auth="Authorization: Bearer k\r\n")
    answer, sent = refused_while_sending(wire_server.port, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < HUGE


def test_health_reads_no_body(wire_server: ThreadServer) -> None:
    head = "GET /health HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    answer, sent = refused_while_sending(wire_server.port, head)
    assert answer.startswith(b"HTTP/1.1 413") and sent < HUGE


def test_slow_headers_and_slow_bodies_are_cut_off(wire_server: ThreadServer) -> None:
    half_headers = raw_request(wire_server.port, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert half_headers.recv(1024) == b""  # closed by the server, no answer
    half_headers.close()
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
        'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"prompt"'
    )
    half_body = raw_request(wire_server.port, head)
    assert read_answer(half_body).startswith(b"HTTP/1.1 408")
    half_body.close()
