"""What ``edgespec serve`` is configured with: authentication, the session store's limits,
body and time limits."""

from __future__ import annotations

from dataclasses import dataclass, field

from edgespec.errors import ConfigError
from edgespec.server.scoring import ScoreLimits
from edgespec.server.sessions import StoreLimits


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """``api_key`` None: no authentication (loopback only, checked by ``edgespec serve``).

    ``read_timeout_s`` bounds the time a client takes to send a body, ``header_timeout_s``
    the time to send a request's headers (on a new or a kept-alive connection), and
    ``shutdown_grace_s`` how long a stopping server lets requests in flight finish."""

    api_key: str | None = None
    limits: StoreLimits = field(default_factory=StoreLimits)
    max_body_bytes: int = 4 * 1024 * 1024
    #: Longest completion the OpenAI-compatible routes generate.
    max_new_tokens: int = 1024
    #: The scoring work (completions ``logprobs``) one request may ask for.
    scoring: ScoreLimits = field(default_factory=ScoreLimits)
    read_timeout_s: float = 30.0
    header_timeout_s: float = 10.0
    shutdown_grace_s: float = 10.0

    def __post_init__(self) -> None:
        times = (self.read_timeout_s, self.header_timeout_s, self.shutdown_grace_s)
        if self.max_body_bytes < 1 or min(times) <= 0:
            raise ConfigError(
                "the body limit and the time limits must be positive",
                fix="e.g. --shutdown-grace 10",
            )
