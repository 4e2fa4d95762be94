"""Verification by a remote target (``edgespec serve``) over protocol v1 (see ``wire``).

:class:`RemoteTarget` is the connection: one ``httpx.Client`` (keep-alive), timeouts, retries
with exponential backoff, byte counts. :class:`RemoteVerifier` is one generation's session on
it. The client owns the token history: when the server lost the session (restart, idle TTL,
eviction) it re-opens it from its own tokens and resends the round, and because a round names
the absolute position of its last token, a resent round is idempotent. Nothing is lost or
duplicated. When the server stays unreachable, :class:`RemoteUnavailableError` is raised
before anything of the failed round is committed.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import RemoteError, RemoteUnavailableError
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.verifiers.base import Verdict
from edgespec.runtime.verifiers.wire import (
    OpenRequest,
    OpenResponse,
    ServerInfo,
    VerifyRequest,
    VerifyResponse,
    WireError,
    uniforms_used,
)

#: Statuses worth retrying: the server is restarting, overloaded or behind a failing proxy.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Statuses that mean "this session is gone or out of step": re-open it from the history.
REOPEN_STATUSES = frozenset({404, 409})
#: Re-opens tried for one round (a busy server may evict a session again at once).
MAX_REOPENS = 3


@dataclass(frozen=True, kw_only=True)
class Exchange:
    """One answered HTTP request: status, JSON body, and the body bytes each way."""

    status: int
    data: Any
    sent: int
    received: int
    attempts: int


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
    rtt_share_by_round: tuple[float, ...]


class RemoteTarget:
    """A verification server: base ``url``, bearer ``api_key``, retry and timeout policy.

    ``simulated_rtt_s`` adds that delay to every exchange (half before sending, half after
    answering): the bench and the tests use it as a latency proxy on loopback.
    """

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 5,
        backoff_s: float = 0.2,
        simulated_rtt_s: float = 0.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.simulated_rtt_s = simulated_rtt_s
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout_s)
        self.client.headers.update(headers)
        self._info: ServerInfo | None = None

    def request(self, method: str, path: str, body: Any = None, *, retry: bool = True) -> Exchange:
        """Sends one request, retrying transport failures and 429/5xx with backoff."""
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        attempts = 1 + (self.retries if retry else 0)
        problem = ""
        for attempt in range(attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                if self.simulated_rtt_s:
                    time.sleep(self.simulated_rtt_s / 2)
                response = self.client.request(
                    method,
                    self.url + path,
                    content=content,
                    headers={"Content-Type": "application/json"} if content else None,
                )
                if self.simulated_rtt_s:
                    time.sleep(self.simulated_rtt_s / 2)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
                continue
            if response.status_code in RETRY_STATUSES or response.status_code >= 500:
                problem = f"HTTP {response.status_code}"
                continue
            try:
                data = response.json()
            except ValueError:
                data = {"detail": response.text}
            return Exchange(
                status=response.status_code,
                data=data,
                sent=len(content or b""),
                received=len(response.content),
                attempts=attempt + 1,
            )
        raise RemoteUnavailableError(
            f"the verification server {self.url} did not answer {method} {path} after "
            f"{attempts} attempt(s) ({problem})",
            fix="check that 'edgespec serve' runs there, or use --fallback local/draft",
        )

    def info(self) -> ServerInfo:
        """The server's target description (fetched once)."""
        if self._info is None:
            exchange = self.request("GET", "/v1/verify/info")
            _raise_for_status(exchange, "GET /v1/verify/info")
            self._info = ServerInfo.from_json(exchange.data)
        return self._info

    def measure_rtt(self, *, repeats: int = 3) -> float:
        """The fastest of ``repeats`` ``GET /health`` exchanges, in seconds."""
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            self.request("GET", "/health")
            best = min(best, time.perf_counter() - started)
        return best

    def close(self) -> None:
        self.client.close()


def _raise_for_status(exchange: Exchange, what: str) -> None:
    if exchange.status >= 400:
        detail = exchange.data.get("detail") if isinstance(exchange.data, dict) else exchange.data
        raise RemoteError(
            f"the verification server refused {what}: HTTP {exchange.status} {detail}"
        )


class RemoteVerifier:
    """One generation's session on a :class:`RemoteTarget`.

    Rejection rounds send the k + 1 next draws of the generation's generator (without taking
    them) and then take as many as the server's acceptance test used, so the generator ends
    where a local verifier would have left it: remote sampling equals local sampling.
    """

    def __init__(self, target: RemoteTarget, *, q_format: str | None = None) -> None:
        self.target = target
        self.max_length = target.info().max_length
        self.q_format = q_format
        self.suggested_k = target.info().max_k
        self._history: list[int] = []
        self._session_id: str | None = None
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)
        self._round_trips = self._sent = self._received = self._reopens = self._retries = 0
        self._rounds_s = self._network_s = 0.0
        self._shares: list[float] = []

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._sampling, self._rng = sampling, rng
        self._history = list(prompt)
        self._open()

    def _exchange(self, method: str, path: str, body: Any = None) -> Exchange:
        exchange = self.target.request(method, path, body)
        self._round_trips += 1
        self._sent += exchange.sent
        self._received += exchange.received
        self._retries += exchange.attempts - 1
        return exchange

    def _open(self) -> None:
        request = OpenRequest(prompt=tuple(self._history), sampling=self._sampling)
        exchange = self._exchange("POST", "/v1/verify/sessions", request.to_json())
        _raise_for_status(exchange, "opening a session")
        opened = OpenResponse.from_json(exchange.data)
        self._session_id = opened.session_id
        self.suggested_k = opened.suggested_k

    def verify(self, last_token: int, draft: Draft) -> Verdict:
        if last_token != self._history[-1]:
            raise ValueError(f"last token {last_token} is not the history's {self._history[-1]}")
        started = time.perf_counter()
        k = len(draft.tokens)
        rejection = not self._sampling.greedy and self._sampling.mode == "rejection"
        uniforms: tuple[float, ...] = ()
        if rejection:
            state = self._rng.bit_generator.state
            uniforms = tuple(float(self._rng.random()) for _ in range(k + 1))
            self._rng.bit_generator.state = state
        request = VerifyRequest(
            position=len(self._history) - 1,
            last_token=last_token,
            draft=draft.tokens,
            q_draft=draft.q_draft if rejection and k else None,
            uniforms=uniforms,
        )
        body = request.to_json(q_format=self.q_format)
        exchange = self._exchange("POST", f"/v1/verify/sessions/{self._session_id}/rounds", body)
        for _ in range(MAX_REOPENS):
            if exchange.status not in REOPEN_STATUSES:
                break
            self._reopens += 1
            self._open()
            path = f"/v1/verify/sessions/{self._session_id}/rounds"
            exchange = self._exchange("POST", path, body)
        _raise_for_status(exchange, "a verification round")
        try:
            answer = VerifyResponse.from_json(exchange.data, k=k)
        except WireError as error:
            raise RemoteError(f"the server's answer is malformed: {error.problem}") from error
        if rejection:
            for _ in range(uniforms_used(answer.n_accepted, k)):
                self._rng.random()
        self._history.extend(answer.tokens)
        self.suggested_k = answer.suggested_k
        elapsed = time.perf_counter() - started
        network = max(elapsed - answer.verify_s, 0.0)
        self._rounds_s += elapsed
        self._network_s += network
        self._shares.append(network / elapsed if elapsed > 0 else 0.0)
        return Verdict(tokens=answer.tokens, n_accepted=answer.n_accepted, elapsed_s=elapsed)

    def traffic(self) -> Traffic:
        return Traffic(
            round_trips=self._round_trips,
            bytes_sent=self._sent,
            bytes_received=self._received,
            rounds_s=self._rounds_s,
            network_s=self._network_s,
            reopens=self._reopens,
            retries=self._retries,
            rtt_share_by_round=tuple(self._shares),
        )

    def close(self) -> None:
        """Closes the server's session (best effort: it expires by itself otherwise)."""
        if self._session_id is None:
            return
        with contextlib.suppress(RemoteUnavailableError):
            self.target.request("DELETE", f"/v1/verify/sessions/{self._session_id}", retry=False)
        self._session_id = None
