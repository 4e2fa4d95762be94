"""Starts the server: loads the engine, measures its target's cost curve, runs uvicorn."""

from __future__ import annotations

import errno
import ipaddress
import socket
from pathlib import Path

from edgespec.api import Engine
from edgespec.errors import ConfigError
from edgespec.runtime.profile import measure_costs
from edgespec.server.app import ServerOptions, create_app


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


def serve(
    *,
    target: Path | None,
    draft: Path | None,
    host: str,
    port: int,
    options: ServerOptions,
    threads: int = 0,
) -> None:
    """Blocks serving until interrupted."""
    import uvicorn

    check_binding(host, options.api_key)
    check_port(host, port)
    engine = Engine.load(target=target, draft=draft, threads=threads)
    assert engine.target is not None  # loaded without remote=, so a local target
    profile = measure_costs(engine.target, None, max_width=options.limits.max_k + 1)
    app = create_app(engine, options=options, profile=profile)
    uvicorn.run(app, host=host, port=port, log_level="warning")
