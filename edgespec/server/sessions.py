"""The server's verification sessions: one target KV cache per client generation.

No HTTP here. :class:`SessionStore` opens sessions (prefill), runs rounds (the local verifier's
:func:`~edgespec.runtime.verifiers.local.verify_round` from the round's absolute position, on the
session's cache), closes them, expires idle ones and evicts the least recently used at the
session or memory cap (a timer expires them too: ``expire_idle``, so that idle sessions' memory
goes back, and the gauges are true, without waiting for traffic). The memory cap keeps
``reserved_bytes`` back for the transient work of one request's model turns (the scoring pass
of ``edgespec.server.scoring``). Each session has a secret, handed to its opener only: rounds
and closes without it are answered as for an unknown session, so that no other client (even
one with the server's API key) can read or end it. Model passes run one at a time
(``run_exclusive``); the number of requests waiting for that turn is the queue the suggested k
shrinks with.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.engine.options import K_RULE, MAX_K
from edgespec.errors import ConfigError, PositionConflictError, ProtocolError, UnknownSessionError
from edgespec.graph.kv_cache import KVCache
from edgespec.protocol import SESSION_SECRET_HEADER
from edgespec.protocol.sessions import OpenRequest, OpenResponse, VerifyRequest, VerifyResponse
from edgespec.runtime.drafters.base import Draft
from edgespec.runtime.model import OnnxModel
from edgespec.runtime.sampling import Uniforms
from edgespec.runtime.verifiers.local import verify_round

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class StoreLimits:
    """``max_sessions`` and ``max_cache_bytes`` (0: no memory cap) trigger LRU eviction;
    sessions idle for ``idle_ttl_s`` expire. ``max_k`` is the suggested k of an idle server."""

    max_sessions: int = 64
    max_cache_bytes: int = 0
    idle_ttl_s: float = 300.0
    max_k: int = 8

    def __post_init__(self) -> None:
        if self.max_cache_bytes < 0:
            raise ConfigError(
                "--max-cache-mb is negative", fix="pass a budget in MB, or 0 for no cap"
            )
        if self.max_sessions < 1 or self.idle_ttl_s <= 0 or self.max_k < 1:
            raise ConfigError(
                "--max-sessions, --idle-ttl and --max-k must be positive",
                fix="e.g. --max-sessions 64 --idle-ttl 300 --max-k 8",
            )
        if self.max_k > MAX_K:
            raise ConfigError(
                f"--max-k {self.max_k} is above {MAX_K}, the most any client drafts", fix=K_RULE
            )


class ServerStoppingError(Exception):
    """Raised for model work asked for once the server stops (answered with 503: the client
    retries, and reaches the server that replaces this one)."""


def full_session_bytes(target: OnnxModel) -> int:
    """The KV cache of one session at the target's whole context (two buffers per layer when
    the cache is bound to the graph's outputs)."""
    model = target.model
    per_token = (
        2 * model.num_layers * model.num_kv_heads * model.head_dim * target.kv_dtype.itemsize
    )
    return per_token * target.max_length * (2 if target.io_binding else 1)


class _Session:
    def __init__(self, cache: KVCache, sampling: SamplingConfig, *, secret: str) -> None:
        self.cache = cache
        self.sampling = sampling
        self.secret = secret
        self.last_used = time.monotonic()

    def opened_by(self, secret: str | None) -> bool:
        """Whether ``secret`` is this session's (compared in constant time)."""
        given = (secret or "").encode("utf-8", "replace")
        return hmac.compare_digest(given, self.secret.encode())


class _Uniforms:
    """The client's draws (protocol v1 ``uniforms``), handed out in order: the rejection test
    then draws exactly what it would have drawn on the client."""

    def __init__(self, values: tuple[float, ...]) -> None:
        self._values = list(values)

    def random(self) -> float:
        if not self._values:
            raise ProtocolError("the round needs more 'uniforms' (send k + 1)")
        return self._values.pop(0)


class SessionStore:
    """Sessions on one target :class:`OnnxModel`; thread-safe."""

    def __init__(
        self,
        target: OnnxModel,
        *,
        limits: StoreLimits = StoreLimits(),
        clock: Callable[[], float] = time.monotonic,
        reserved_bytes: int = 0,
    ) -> None:
        self.target = target
        self.limits = limits
        self.clock = clock
        self.reserved_bytes = reserved_bytes
        needed = full_session_bytes(target)
        if limits.max_cache_bytes and limits.max_cache_bytes < needed + reserved_bytes:
            reserved = (
                f" beside the {reserved_bytes / 2**20:.1f} MB kept for one request's scoring pass"
                if reserved_bytes
                else ""
            )
            raise ConfigError(
                f"--max-cache-mb {limits.max_cache_bytes / 2**20:.1f} holds no session{reserved}: "
                f"one at the target's context of {target.max_length} tokens takes "
                f"{needed / 2**20:.1f} MB",
                fix=f"pass --max-cache-mb {(needed + reserved_bytes) / 2**20:.0f} or more "
                "(0: no cap)",
            )
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._model_lock = threading.Lock()
        self._state_lock = threading.Lock()
        self.waiting = 0
        self.counters: Counter[str] = Counter()
        self.verify_s_sum = 0.0
        self.stopping = False

    # --- scheduling -------------------------------------------------------------------------
    def run_exclusive(self, work: Callable[[], T]) -> T:
        """Runs ``work`` when no other model pass runs; counts the requests waiting meanwhile.
        Raises :class:`ServerStoppingError` once :meth:`stop` was called."""
        if self.stopping:
            raise ServerStoppingError("the server is stopping")
        with self._state_lock:
            self.waiting += 1
        with self._model_lock:
            with self._state_lock:
                self.waiting -= 1
            if self.stopping:
                raise ServerStoppingError("the server is stopping")
            return work()

    def stop(self, *, timeout_s: float) -> None:
        """Refuses model work from now on and waits (at most ``timeout_s``) for the pass that
        runs now: the request threads then end, so the process can exit."""
        self.stopping = True
        if self._model_lock.acquire(timeout=timeout_s):
            self._model_lock.release()

    def suggested_k(self) -> int:
        """``max_k`` when idle, divided by one plus the number of requests waiting."""
        return max(1, self.limits.max_k // (1 + self.waiting))

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def count(self) -> int:
        return len(self._sessions)

    def cache_bytes(self) -> int:
        with self._state_lock:
            return sum(s.cache.nbytes for s in self._sessions.values())

    @property
    def sweep_interval_s(self) -> float:
        """How often the server's timer calls :meth:`expire_idle`: a session is gone at most
        this long after its TTL."""
        return min(1.0, self.limits.idle_ttl_s / 4)

    def expire_idle(self) -> None:
        """Drops the sessions idle past the TTL (and any past the caps)."""
        with self._state_lock:
            self._expire()

    def _expire(self) -> None:
        """Drops idle sessions, then the least recently used ones past the caps."""
        now = self.clock()
        for session_id, session in list(self._sessions.items()):
            if now - session.last_used > self.limits.idle_ttl_s:
                del self._sessions[session_id]
                self.counters["sessions_expired"] += 1
        limits = self.limits
        cache_budget = limits.max_cache_bytes - self.reserved_bytes
        while self._sessions and (
            len(self._sessions) > limits.max_sessions
            or (limits.max_cache_bytes and self._total_bytes() > cache_budget)
        ):
            self._sessions.popitem(last=False)
            self.counters["sessions_evicted"] += 1

    def _total_bytes(self) -> int:
        return sum(s.cache.nbytes for s in self._sessions.values())

    def _get(self, session_id: str, secret: str | None) -> _Session:
        """The session, touched; unknown when ``secret`` is not its opener's (the same answer
        as for a closed one: nothing tells another client that the id exists)."""
        with self._state_lock:
            self._expire()
            session = self._sessions.get(session_id)
            if session is None or not session.opened_by(secret):
                raise _unknown()
            session.last_used = self.clock()
            self._sessions.move_to_end(session_id)
            return session

    def open(self, request: OpenRequest) -> OpenResponse:
        cache = self.target.new_cache()
        self.run_exclusive(lambda: self.target.start(request.prompt, cache))
        session = _Session(cache, request.sampling, secret=secrets.token_urlsafe(24))
        session.last_used = self.clock()
        session_id = uuid.uuid4().hex
        with self._state_lock:
            self._sessions[session_id] = session
            self.counters["sessions_opened"] += 1
            self._expire()
        return OpenResponse(
            session_id=session_id,
            length=cache.length,
            suggested_k=self.suggested_k(),
            session_secret=session.secret,
        )

    def close(self, session_id: str, secret: str | None) -> None:
        with self._state_lock:
            session = self._sessions.get(session_id)
            if session is None or not session.opened_by(secret):
                raise _unknown()
            del self._sessions[session_id]
            self.counters["sessions_closed"] += 1

    # --- rounds ------------------------------------------------------------------------------
    def verify(self, session_id: str, secret: str | None, request: VerifyRequest) -> VerifyResponse:
        session = self._get(session_id, secret)
        sampling = session.sampling
        rejection = not sampling.greedy and sampling.mode == "rejection"
        if request.draft and rejection and request.q_draft is None:
            raise ProtocolError("rejection sampling rounds need 'q_draft'")
        return self.run_exclusive(lambda: self._verify(session, request))

    def _verify(self, session: _Session, request: VerifyRequest) -> VerifyResponse:
        started = time.perf_counter()
        cache, position = session.cache, request.position
        if position > cache.length:
            raise PositionConflictError(
                f"position {position} is beyond the {cache.length} tokens this session holds",
                fix="open the session again with the whole token history",
            )
        # Without the client's draws, a stream of this round's own, so that a resent round
        # draws the same.
        rng: Uniforms = (
            _Uniforms(request.uniforms)
            if request.uniforms
            else np.random.default_rng([session.sampling.seed, position])
        )
        acceptance = verify_round(
            self.target,
            cache,
            position=position,
            last_token=request.last_token,
            draft=Draft(tokens=request.draft, q_draft=request.q_draft),
            sampling=session.sampling,
            rng=rng,
        )
        elapsed = time.perf_counter() - started
        with self._state_lock:
            self.counters["rounds"] += 1
            self.counters["drafted_tokens"] += len(request.draft)
            self.counters["accepted_tokens"] += acceptance.n_accepted
            self.verify_s_sum += elapsed
        return VerifyResponse(
            n_accepted=acceptance.n_accepted,
            tokens=acceptance.tokens,
            length=cache.length,
            suggested_k=self.suggested_k(),
            verify_s=elapsed,
        )


def _unknown() -> UnknownSessionError:
    # The id is not echoed: it came from the request path, unvalidated.
    return UnknownSessionError(
        "the session is unknown (closed, expired or evicted), or the request lacks its secret",
        fix="open it again with the whole token history, and send the session_secret it "
        f"answers in the {SESSION_SECRET_HEADER} header",
    )
