"""Starts the server: loads the engine, measures its target's cost curve, runs uvicorn.

uvicorn is adjusted in two places. Its HTTP protocol closes a connection whose request headers
do not arrive in time (uvicorn times out only idle kept-alive connections, so a client could
hold a connection open by sending headers a byte at a time). And its server ends the process
normally after a signal-driven shutdown (uvicorn re-raises the signal, so SIGTERM, which it
drains gracefully, ended with the exit status of a killed process).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from edgespec.api import Engine
from edgespec.errors import ConfigError
from edgespec.runtime.costs import measure_costs
from edgespec.server.access_log import AccessLog
from edgespec.server.app import create_app
from edgespec.server.options import ServerOptions


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, api_key: str | None) -> None:
    """Anything but loopback needs an API key."""
    if not is_loopback(host) and not api_key:
        raise ConfigError(
            f"binding {host} would expose the server without authentication",
            fix="pass --api-key KEY (or set EDGESPEC_API_KEY), or bind 127.0.0.1",
        )


def check_port(host: str, port: int) -> None:
    """Binds ``host:port`` and lets it go, so that a taken port is reported in one line before
    the model loads (uvicorn would report it after, in its own words). Binds as uvicorn does:
    with SO_REUSEADDR, so a port left in TIME_WAIT by a stopped server counts as free."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not 1 <= port <= 65535:
        raise ConfigError(f"port {port} is out of range", fix="pass --port N with N in 1..65535")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            reason = error.strerror or str(error)
            if error.errno == errno.EADDRINUSE:
                fix = f"pass --port N for a free port, or stop the process listening on {port}"
            elif error.errno == errno.EACCES:
                fix = "pass --port N with N above 1023, or run with the rights to bind it"
            else:
                fix = "pass --host with an address of this machine (default 127.0.0.1)"
            raise ConfigError(f"cannot listen on {address}: {reason}", fix=fix) from error


#: Share of the memory available at start that the sessions' KV caches may hold by default.
DEFAULT_CACHE_SHARE = 0.25


def default_cache_mb(available_bytes: int | None = None) -> float:
    """The default ``--max-cache-mb``: a quarter of the memory available now."""
    if available_bytes is None:
        available_bytes = int(psutil.virtual_memory().available)
    return round(DEFAULT_CACHE_SHARE * available_bytes / 2**20, 1)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection when a request's headers have not arrived
    ``header_timeout_s`` after it opened or after its previous answer."""

    header_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_deadline()

    def _arm_header_deadline(self) -> None:
        # A new request replaces ``cycle``: the same cycle at the deadline means no request
        # began meanwhile (uvicorn's own keep-alive timer is reset by every byte received).
        waiting_after = self.cycle

        def expire() -> None:
            if self.cycle is waiting_after and not self.transport.is_closing():
                self.transport.close()

        self.loop.call_later(self.header_timeout_s, expire)


class Server(uvicorn.Server):
    """uvicorn's server; a SIGINT or SIGTERM drains it and the process then exits normally."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def uvicorn_config(app: Any, *, host: str, port: int, options: ServerOptions) -> uvicorn.Config:
    class Protocol(GuardedH11Protocol):
        header_timeout_s = options.header_timeout_s

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        http=Protocol,
        # An idle kept-alive connection is closed after header_timeout_s (10 s): longer than
        # clients keep idle connections (httpx and Java: 5 s). When both are 5 s (uvicorn's
        # default), a request sent as the server closes the connection fails with a read
        # error and nothing in the server's log.
        timeout_keep_alive=max(1, round(options.header_timeout_s)),
        timeout_graceful_shutdown=max(1, round(options.shutdown_grace_s)),
    )


def serve(
    *,
    target: Path | None,
    draft: Path | None,
    host: str,
    port: int,
    options: ServerOptions,
    threads: int = 0,
    context: int | None = None,
    access_log: bool = True,
) -> None:
    """Blocks serving until SIGINT or SIGTERM, then drains (``options.shutdown_grace_s``).
    ``access_log``: one stderr line per request (see :mod:`edgespec.server.access_log`);
    ``context``: each session's (None: the default, 4,096 or the model's own if shorter)."""
    check_binding(host, options.api_key)
    check_port(host, port)
    # Without ONNX Runtime's arena, a long request's buffers go back when it ends (with it,
    # the server kept the largest request's: docs/serving.md, the scoring pass's memory).
    # drafter "none": the server verifies, so a target alone gets no catalog draft beside it.
    engine = Engine.load(
        target=target,
        draft=draft,
        drafter=None if draft else "none",
        threads=threads,
        context=context,
        memory_arena=False,
    )
    assert engine.target is not None  # loaded without remote=, so a local target
    profile = measure_costs(engine.target, None, max_width=options.limits.max_k + 1)
    app = create_app(engine, options=options, profile=profile)
    served = AccessLog(app) if access_log else app
    Server(uvicorn_config(served, host=host, port=port, options=options)).run()
