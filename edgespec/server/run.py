"""Starts the server: loads the engine, measures its target's cost curve, runs uvicorn."""

from __future__ import annotations

import ipaddress
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
    engine = Engine.load(target=target, draft=draft, threads=threads)
    assert engine.target is not None  # loaded without remote=, so a local target
    profile = measure_costs(engine.target, None, max_width=options.limits.max_k + 1)
    app = create_app(engine, options=options, profile=profile)
    uvicorn.run(app, host=host, port=port, log_level="warning")
