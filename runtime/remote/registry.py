"""The remote targets by the protocol they speak, and which one a URL speaks when the caller
does not say: ``edgespec serve`` answers ``GET /v1/verify/info``, a serving engine answers
404 there (its engine is then found by :data:`edgespec.runtime.remote.openai.ENGINES`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from edgespec.errors import ConfigError, RemoteUnavailableError
from edgespec.runtime.remote.edgespec_server import ServerTarget
from edgespec.runtime.remote.openai import OpenAITarget
from edgespec.runtime.remote.target import RemoteTarget
from edgespec.runtime.remote.transport import DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)

#: Protocol name → remote target class. A new protocol is one module and one line here.
REMOTE_TARGETS: dict[str, Callable[..., RemoteTarget]] = {
    "edgespec": ServerTarget,
    "openai": OpenAITarget,
}
#: What ``--remote-api`` takes: a protocol, or "auto" (asked of the URL).
REMOTE_APIS = ("auto", *REMOTE_TARGETS)


def remote_target(
    url: str,
    *,
    api: str = "auto",
    model: str | None = None,
    api_key: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RemoteTarget:
    """The remote target at ``url``: ``api`` names its protocol, or "auto" asks the URL
    (a model name means a serving engine). ``timeout_s``: each request's deadline, retries
    included."""
    if api not in REMOTE_APIS:
        raise ConfigError(f"unknown remote api {api!r}", fix=f"use one of {REMOTE_APIS}")
    if model is not None and api == "edgespec":
        raise ConfigError(
            "a remote model name is for a serving engine, not 'edgespec serve'",
            fix="drop --remote-model, or pass --remote-api openai",
        )
    connection: dict[str, Any] = {"api_key": api_key, "timeout_s": timeout_s}
    if api == "openai" or model is not None:
        target = OpenAITarget(url, model=model, **connection)
        if _answers_as_edgespec(url, connection):
            log.warning(
                "%s is 'edgespec serve': its OpenAI routes verify at a fraction of the speed of "
                "its own protocol (drop --remote-api openai)",
                url,
            )
        return target
    server = ServerTarget(url, **connection)
    if api == "edgespec" or _speaks_edgespec(server):
        return server
    server.close()
    return OpenAITarget(url, **connection)


def _speaks_edgespec(server: ServerTarget) -> bool:
    """Whether ``server``'s URL is ``edgespec serve``: only a definite "no such route" (404)
    means a serving engine; a URL where nothing answers yet, or that fails, keeps edgespec's
    protocol, whose requests then wait out its deadline or say what is wrong."""
    try:
        exchange = server.request("GET", "/v1/verify/info", retry=False)
    except RemoteUnavailableError:
        return True
    return exchange.status != 404


def _answers_as_edgespec(url: str, connection: dict[str, Any]) -> bool:
    probe = ServerTarget(url, **connection)
    try:
        return probe.answers_as_edgespec()
    finally:
        probe.close()
