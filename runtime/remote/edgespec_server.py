"""Verification by a remote target (``edgespec serve``) over protocol v1 (see ``wire``).

:class:`ServerTarget` is the connection (a :class:`~edgespec.runtime.remote.transport.Connection`:
keep-alive, retries with jittered backoff until a deadline, 30 s by default).
:class:`RemoteVerifier` is one generation's session on it. The client owns the token history:
when the server lost the session (restart, idle TTL, eviction) it re-opens it from its own
tokens and resends the round, and because a round names the absolute position of its last token,
a resent round is idempotent. Nothing is lost or duplicated. When the server stays unreachable,
:class:`RemoteUnavailableError` is raised before anything of the failed round is committed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ProtocolError, RemoteError, RemoteUnavailableError
from edgespec.protocol import SESSION_SECRET_HEADER
from edgespec.protocol.server_info import ChatFormat, ServerInfo
from edgespec.protocol.sessions import (
    OpenRequest,
    OpenResponse,
    VerifyRequest,
    VerifyResponse,
    uniforms_used,
)
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.remote.pieces import TokenPieces
from edgespec.runtime.remote.transport import (
    Connection,
    Exchange,
    Traffic,
    TrafficMeter,
    raise_for_status,
)
from edgespec.runtime.verifiers.base import Verdict

#: Statuses that mean "this session is gone or out of step": re-open it from the history.
REOPEN_STATUSES = frozenset({404, 409})
#: Re-opens tried for one round (a busy server may evict a session again at once).
MAX_REOPENS = 3


class ServerTarget(Connection):
    """A verification server (``edgespec serve``): base ``url``, bearer ``api_key``, and
    ``timeout_s``, the deadline of each request, retries included (see :class:`Connection`)."""

    peer = "the verification server"
    fix = "check that 'edgespec serve' runs there, or use --fallback local/draft"
    health_path = "/health"
    kind = "an edgespec server"
    kind_fix = (
        "pass the address 'edgespec serve' prints (e.g. http://127.0.0.1:8700), or "
        "--remote-api openai for an OpenAI-compatible engine"
    )
    #: The protocol it speaks (the engine's verifier registry is keyed by it).
    api = "edgespec"
    #: Protocol v1 carries q_draft, so sampled drafts verify losslessly.
    greedy_only = False

    _info: ServerInfo | None = None

    def info(self) -> ServerInfo:
        """The server's target description (fetched once)."""
        if self._info is None:
            exchange = self.request("GET", "/v1/verify/info")
            self.check_peer(exchange, "/v1/verify/info")
            raise_for_status(exchange, "GET /v1/verify/info")
            self._info = ServerInfo.from_json(exchange.data)
        return self._info

    def chat_format(self) -> ChatFormat | None:
        """The target's chat format (None: the server's tokenizer has none)."""
        return self.info().chat

    def verifier(self, pieces: Callable[[], TokenPieces]) -> RemoteVerifier:
        """One generation's session (the draft's tokenizer is checked against the server's
        ``tokenizer_sha256`` when the pair is planned, so ``pieces`` is not needed)."""
        return RemoteVerifier(self)

    def answers_as_edgespec(self) -> bool:
        """Whether the URL answers ``GET /v1/verify/info`` as ``edgespec serve`` does (one
        try, no retries; False when nothing answers)."""
        try:
            exchange = self.request("GET", "/v1/verify/info", retry=False)
        except RemoteUnavailableError:
            return False
        return (
            exchange.status == 200
            and isinstance(exchange.data, dict)
            and ("max_k" in exchange.data and "vocab_size" in exchange.data)
        )


class RemoteVerifier:
    """One generation's session on a :class:`ServerTarget`.

    Rejection rounds send the k + 1 next draws of the generation's generator (without taking
    them) and then take as many as the server's acceptance test used, so the generator ends
    where a local verifier would have left it: remote sampling equals local sampling.
    """

    def __init__(self, target: ServerTarget, *, q_format: str | None = None) -> None:
        self.target = target
        self.max_length = target.info().max_length
        self.q_format = q_format
        self.suggested_k = target.info().max_k
        self._history: list[int] = []
        self._session_id: str | None = None
        #: The session's secret, sent with its rounds and delete (none from an older server).
        self._secret: dict[str, str] = {}
        self._sampling = SamplingConfig()
        self._rng = np.random.default_rng(0)
        self.meter = TrafficMeter()

    def begin(
        self, prompt: Sequence[int], *, sampling: SamplingConfig, rng: np.random.Generator
    ) -> None:
        self._sampling, self._rng = sampling, rng
        self._history = list(prompt)
        self._open()

    def _exchange(self, method: str, path: str, body: Any = None) -> Exchange:
        return self.meter.record(self.target.request(method, path, body, headers=self._secret))

    def _open(self) -> None:
        request = OpenRequest(prompt=tuple(self._history), sampling=self._sampling)
        self._secret = {}
        exchange = self._exchange("POST", "/v1/verify/sessions", request.to_json())
        raise_for_status(exchange, "opening a session")
        opened = OpenResponse.from_json(exchange.data)
        self._session_id = opened.session_id
        if opened.session_secret is not None:
            self._secret = {SESSION_SECRET_HEADER: opened.session_secret}
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
            self.meter.reopens += 1
            self._open()
            path = f"/v1/verify/sessions/{self._session_id}/rounds"
            exchange = self._exchange("POST", path, body)
        raise_for_status(exchange, "a verification round")
        try:
            answer = VerifyResponse.from_json(exchange.data, k=k)
        except ProtocolError as error:
            raise RemoteError(f"the server's answer is malformed: {error.problem}") from error
        if rejection:
            for _ in range(uniforms_used(answer.n_accepted, k)):
                self._rng.random()
        self._history.extend(answer.tokens)
        self.suggested_k = answer.suggested_k
        elapsed = self.meter.round(started, server_s=answer.verify_s)
        return Verdict(tokens=answer.tokens, n_accepted=answer.n_accepted, elapsed_s=elapsed)

    def traffic(self) -> Traffic:
        return self.meter.traffic()

    def work(self) -> None:
        """The peer does not report what it computed per round."""

    def close(self) -> None:
        """Closes the server's session (best effort: it expires by itself otherwise)."""
        if self._session_id is None:
            return
        with contextlib.suppress(RemoteUnavailableError):
            self.target.request(
                "DELETE",
                f"/v1/verify/sessions/{self._session_id}",
                retry=False,
                headers=self._secret,
            )
        self._session_id = None
