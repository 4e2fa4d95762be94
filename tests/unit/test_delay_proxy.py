"""The TCP delay proxy behind ``--rtt-ms``: bytes pass unchanged, each exchange pays at least
the round trip, and a proxy to a dead server drops connections instead of hanging."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from edgespec.errors import ConfigError
from edgespec.measure.delay_proxy import DelayProxy


class Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def echo_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_bytes_pass_unchanged_and_each_exchange_pays_the_round_trip(echo_url: str) -> None:
    payload = bytes(range(256)) * 1024  # 256 KiB: several chunks each way
    with DelayProxy(echo_url, rtt_s=0.05) as proxy, httpx.Client() as client:
        assert proxy.url.endswith("/v1") and str(proxy.port) in proxy.url
        for _ in range(3):  # one keep-alive connection, three exchanges
            started = time.perf_counter()
            answer = client.post(proxy.url + "/echo", content=payload)
            assert time.perf_counter() - started >= 0.05
            assert answer.content == payload


def test_a_dead_upstream_drops_the_connection() -> None:
    with DelayProxy("http://127.0.0.1:9", rtt_s=0.01) as proxy, pytest.raises(httpx.TransportError):
        httpx.get(proxy.url + "/health", timeout=5)


@pytest.mark.parametrize("url", ["ftp://host/", "127.0.0.1:80", "http:///path"])
def test_unproxiable_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="cannot proxy"):
        DelayProxy(url, rtt_s=0.01)
