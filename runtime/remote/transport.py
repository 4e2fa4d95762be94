"""The HTTP connection under every remote verifier: one ``httpx.Client`` (keep-alive), a
deadline per request with retries inside it (jittered exponential backoff), and the bytes each
exchange sent and received.

Retrying is safe because every verification request names absolute positions: a resent
request gives the answer the first one would have. Until something has answered at the URL, a
refused connection or a name that does not resolve fails at once: that is a wrong address (or
a server not started), not a restart to wait out. The deadline, not a count of retries, is
the guarantee: a server that is back (restarted, reloaded) within ``timeout_s`` of a request's
first attempt answers it. The jitter keeps clients that lost the same server from all coming
back at the same instant.

The first failed attempt of a request is logged (logger ``edgespec.runtime.remote.transport``,
level WARNING: the CLI prints it on stderr) with how long the retries may last, so a wait for
a server that is down is never silent. A URL that answers but is some other web server fails at
the first request, in one line (:meth:`Connection.check_peer`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from edgespec.errors import ConfigError, RemoteError, RemoteUnavailableError

#: Statuses worth retrying: the server is restarting, overloaded or behind a failing proxy.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: The default deadline of one request, retries included: long enough for a server to restart
#: (a cold ``edgespec serve``'s restart: docs/serving.md, "Under abuse (measured)").
DEFAULT_TIMEOUT_S = 30.0
#: The longest excerpt of an answer's body an error message quotes.
QUOTED_CHARS = 200
#: Where a request's first failure is reported.
log = logging.getLogger(__name__)
#: The least time one attempt is given, even at the deadline (to connect and be answered).
MIN_ATTEMPT_S = 0.5


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One answered HTTP request: status, JSON body, and the body bytes each way."""

    status: int
    data: Any
    sent: int
    received: int
    attempts: int
    #: False when the body was not JSON (a web page): ``data`` is then ``{"detail": text}``.
    is_json: bool = True


class Peer(Protocol):
    """What a request to a peer needs: where it is, its name in messages, and the request
    (a :class:`Connection`, or a target around one)."""

    url: str
    peer: str

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Exchange: ...


class Connection:
    """A verifying peer at base ``url`` with bearer ``api_key``.

    A request is tried until ``timeout_s`` after its first attempt (or ``retries`` + 1
    attempts, when a count is given), pausing ``backoff_s``, then twice as long each time up to
    ``max_backoff_s``, each pause drawn between half and all of that.

    Subclasses name the peer and the fix for :class:`RemoteUnavailableError`, the cheap
    ``health_path`` that :meth:`measure_rtt` times, and what kind of server the URL must be
    (``kind``, ``kind_fix``: see :meth:`check_peer`).
    """

    peer = "the remote target"
    fix = "check that the server runs there, or use --fallback local/draft"
    health_path = "/health"
    kind = "the remote target"
    kind_fix = "check the URL"

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        retries: int | None = None,
        backoff_s: float = 0.2,
        max_backoff_s: float = 2.0,
        client: httpx.Client | None = None,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"{url!r} is not an http:// or https:// URL",
                fix="pass the server's address, e.g. http://127.0.0.1:8700",
            )
        if not timeout_s > 0 or (retries is not None and retries < 0):
            raise ConfigError(
                f"a remote timeout of {timeout_s} s with {retries} retries cannot be tried",
                fix="pass --remote-timeout SECONDS above 0 (default 30)",
            )
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._jitter = random.Random()
        #: Whether anything has answered at this URL: until then a refused connection or an
        #: unresolvable name fails at once instead of being retried until the deadline.
        self.reached = False
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout_s)
        self.client.headers.update(headers)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        retry: bool = True,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Exchange:
        """Sends one request, retrying transport failures and 429/5xx until the deadline
        (``timeout_s`` after the first attempt; default the connection's)."""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        sent_headers = dict(headers or {})
        if content:
            sent_headers["Content-Type"] = "application/json"
        started = time.monotonic()
        deadline = started + (timeout_s or self.timeout_s)
        limit = 1 if not retry else None if self.retries is None else 1 + self.retries
        attempts, problem = 0, ""
        while True:
            attempts += 1
            try:
                response = self.client.request(
                    method,
                    self.url + path,
                    content=content,
                    headers=sent_headers,
                    timeout=max(deadline - time.monotonic(), MIN_ATTEMPT_S),
                )
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
                if isinstance(error, httpx.ConnectError) and not self.reached:
                    # Nothing has ever answered here: a name that does not resolve or a port
                    # nothing listens on is a wrong address, not a restart to wait out.
                    break
            else:
                self.reached = True
                if response.status_code not in RETRY_STATUSES and response.status_code < 500:
                    return _exchange(response, sent=len(content or b""), attempts=attempts)
                problem = f"HTTP {response.status_code}: {_excerpt(response.text)}"
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (limit is not None and attempts >= limit):
                break
            if attempts == 1:
                log.warning(
                    "%s %s did not answer %s %s (%s); retrying for up to %g s",
                    self.peer,
                    self.url,
                    method,
                    path,
                    problem,
                    self.timeout_s,
                )
            time.sleep(min(self.backoff(attempts), remaining))
        raise RemoteUnavailableError(
            f"{self.peer} {self.url} did not answer {method} {path} after {attempts} "
            f"attempt(s) in {time.monotonic() - started:.1f} s ({problem})",
            fix=self.fix,
        )

    def check_peer(self, exchange: Exchange, path: str) -> None:
        """Raises :class:`RemoteError` in one line when the answer to the first request,
        ``GET path``, shows that the URL is some other web server: a 404 (the route is not
        there) or a body that is not JSON (a web page, quoted by no error message)."""
        # A 401/403 page may come from a proxy in front of the right server: raise_for_status
        # names the key instead.
        if exchange.status == 404 or (not exchange.is_json and exchange.status not in (401, 403)):
            raise RemoteError(
                f"{self.url} is not {self.kind} (HTTP {exchange.status} from {self.url}{path})",
                fix=self.kind_fix,
            )

    def backoff(self, attempts: int) -> float:
        """The pause after the ``attempts``-th failure: exponential, capped, jittered."""
        ceiling = min(self.max_backoff_s, self.backoff_s * 2 ** (attempts - 1))
        return ceiling * self._jitter.uniform(0.5, 1.0)

    def measure_rtt(self, *, repeats: int = 3) -> float:
        """The fastest of ``repeats`` ``GET health_path`` exchanges, in seconds."""
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            self.request("GET", self.health_path)
            best = min(best, time.perf_counter() - started)
        return best

    def close(self) -> None:
        self.client.close()


def _exchange(response: httpx.Response, *, sent: int, attempts: int) -> Exchange:
    try:
        data, is_json = response.json(), True
    except ValueError:
        data, is_json = {"detail": _excerpt(response.text)}, False
    return Exchange(
        status=response.status_code,
        data=data,
        sent=sent,
        received=len(response.content),
        attempts=attempts,
        is_json=is_json,
    )


def _excerpt(text: str) -> str:
    """The start of an answer's body on one line (a proxy's error page spans many)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= QUOTED_CHARS else flat[:QUOTED_CHARS] + " ..."


def raise_for_status(
    exchange: Exchange, what: str, *, peer: str = "the verification server"
) -> None:
    """Raises :class:`RemoteError` naming ``what`` was refused, for a 4xx answer."""
    if exchange.status >= 400:
        detail = exchange.data.get("detail") if isinstance(exchange.data, dict) else exchange.data
        if isinstance(exchange.data, dict) and detail is None:
            detail = exchange.data.get("error") or exchange.data
        fix = (
            "pass the server's key with --api-key (or $EDGESPEC_API_KEY; api_key= in Python)"
            if exchange.status in (401, 403)
            else None
        )
        raise RemoteError(f"{peer} refused {what}: HTTP {exchange.status} {detail}", fix=fix)


@dataclass(frozen=True, kw_only=True)
class Traffic:
    """What one generation sent and received. ``network_s`` = round time minus server time."""

    round_trips: int
    bytes_sent: int
    bytes_received: int
    rounds_s: float
    network_s: float
    reopens: int
    retries: int
    #: Empty when the peer does not report its compute time (an OpenAI-compatible engine).
    rtt_share_by_round: tuple[float, ...]


class TrafficMeter:
    """Counts one generation's exchanges and times its rounds into a :class:`Traffic`."""

    def __init__(self) -> None:
        self.round_trips = self.sent = self.received = self.retries = self.reopens = 0
        self.rounds_s = self.network_s = 0.0
        self.shares: list[float] = []

    def record(self, exchange: Exchange) -> Exchange:
        self.round_trips += 1
        self.sent += exchange.sent
        self.received += exchange.received
        self.retries += exchange.attempts - 1
        return exchange

    def round(self, started: float, *, server_s: float | None) -> float:
        """Closes a round begun at ``perf_counter()`` = ``started`` of which the peer spent
        ``server_s`` computing (None: not reported); returns the round's seconds."""
        elapsed = time.perf_counter() - started
        self.rounds_s += elapsed
        if server_s is not None:
            network = max(elapsed - server_s, 0.0)
            self.network_s += network
            self.shares.append(network / elapsed if elapsed > 0 else 0.0)
        return elapsed

    def traffic(self) -> Traffic:
        return Traffic(
            round_trips=self.round_trips,
            bytes_sent=self.sent,
            bytes_received=self.received,
            rounds_s=self.rounds_s,
            network_s=self.network_s,
            reopens=self.reopens,
            retries=self.retries,
            rtt_share_by_round=tuple(self.shares),
        )
