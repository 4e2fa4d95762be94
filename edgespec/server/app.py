"""The HTTP face of ``edgespec serve``: protocol v1, health, metrics, OpenAI-compatible routes.

Request bodies are declared as pydantic models (``bodies``: the OpenAPI schema describes them
for fuzzing) and then validated by the protocol package (``edgespec.protocol``), whose errors
become 4xx answers with a message. In front of every route, ``guard.RequestGuard`` checks the
API key (every path but ``/health`` needs ``Authorization: Bearer KEY`` when one is set, the
OpenAPI pages included) and reads the body under its limits; ``guard.StatusCounter`` counts
every answer for ``/metrics``. No input gets a 5xx: an unexpected failure is a bug, answered
with a short 500 that is counted too.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from edgespec.api import Engine
from edgespec.errors import ConfigError, EdgespecError, PositionConflictError, UnknownSessionError
from edgespec.protocol import MAX_K, PROTOCOL_VERSION, SESSION_SECRET_HEADER
from edgespec.protocol.server_info import ServerInfo
from edgespec.protocol.sessions import OpenRequest, VerifyRequest
from edgespec.runtime.k_policy import CostProfile
from edgespec.server.bodies import OpenBody, VerifyBody
from edgespec.server.guard import (
    RequestGuard,
    RequestLimits,
    StatusCounter,
    authorized,
    count_status,
    refusal,
)
from edgespec.server.metrics import prometheus_text
from edgespec.server.openai_routes import add_openai_routes
from edgespec.server.options import ServerOptions
from edgespec.server.scoring import peak_bytes
from edgespec.server.sessions import ServerStoppingError, SessionStore

#: Problems of an invalid body shown in the 422: the first few say what to fix.
SHOWN_PROBLEMS = 3
SessionSecret = Annotated[str | None, Header(alias=SESSION_SECRET_HEADER)]


def create_app(
    engine: Engine, *, options: ServerOptions | None = None, profile: CostProfile
) -> FastAPI:
    """The application for ``engine``'s target; ``profile`` is its measured cost curve."""
    options = options or ServerOptions()
    target = engine.target
    if target is None:
        raise ConfigError("the server needs a local target", fix="load the engine with target=")
    store = SessionStore(target, limits=options.limits, reserved_bytes=peak_bytes(target))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(_expire_idle_sessions(store))
        yield
        sweeper.cancel()
        # After uvicorn's grace: requests still running stop at their next model turn.
        store.stop(timeout_s=options.shutdown_grace_s)

    app = FastAPI(
        title="edgespec verification server",
        version=f"protocol-{PROTOCOL_VERSION}",
        lifespan=lifespan,
    )
    app.state.store = store
    tokenizer_sha = hashlib.sha256(target.bundle.tokenizer_path.read_bytes()).hexdigest()
    info = ServerInfo(
        vocab_size=target.vocab_size,
        max_length=target.max_length,
        eos_token_ids=tuple(sorted(engine.eos_ids)),
        tokenizer_sha256=tokenizer_sha,
        max_k=min(options.limits.max_k, MAX_K),
        target_step_s=profile.target_step_s,
        verify_cost=profile.verify_cost,
        chat=engine.chat.to_format() if engine.chat is not None else None,
    )
    _add_error_answers(app, store=store)
    _add_verify_routes(app, store=store, info=info, api_key=options.api_key)
    add_openai_routes(app, engine, store=store, options=options)
    # The longest list a valid body holds: a prompt of the whole context, or a q_draft row of
    # the whole vocabulary.
    limits = RequestLimits(
        max_body_bytes=options.max_body_bytes,
        max_items=max(info.max_length, info.vocab_size),
        read_timeout_s=options.read_timeout_s,
        drain_bytes=options.max_body_bytes // 4,
    )
    # Added last, so outermost: the counter sees the guard's refusals too.
    app.add_middleware(RequestGuard, api_key=options.api_key, limits=limits)
    app.add_middleware(StatusCounter, counters=store.counters)
    return app


async def _expire_idle_sessions(store: SessionStore) -> None:
    """Expires idle sessions on a timer: their caches go back without waiting for a request."""
    while True:
        await asyncio.sleep(store.sweep_interval_s)
        store.expire_idle()


def _add_error_answers(app: FastAPI, *, store: SessionStore) -> None:
    """One short JSON answer per kind of refusal: never the input echoed, at most a few KB."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input (NaN cannot be written as JSON, and a list of
        # a million wrong items would be answered with a million errors): the first
        # problems' locations and messages suffice.
        problems = error.errors()
        shown = [
            f"{'.'.join(str(part) for part in problem.get('loc', ()))}: "
            f"{str(problem.get('msg', ''))[:200]}"
            for problem in problems[:SHOWN_PROBLEMS]
        ]
        if len(problems) > SHOWN_PROBLEMS:
            shown.append(f"and {len(problems) - SHOWN_PROBLEMS} more")
        return refusal(422, "; ".join(shown) or "invalid request")

    @app.exception_handler(EdgespecError)
    async def refused(request: Request, error: EdgespecError) -> JSONResponse:
        status = 422
        if isinstance(error, UnknownSessionError):
            status = 404
        elif isinstance(error, PositionConflictError):
            status = 409
        return refusal(status, str(error))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return refusal(error.status_code, str(error.detail), headers=error.headers)

    @app.exception_handler(ServerStoppingError)
    async def stopping(request: Request, error: ServerStoppingError) -> JSONResponse:
        return refusal(
            503,
            "the server is stopping; retry: its replacement will answer",
            headers={"Retry-After": "1"},
        )

    @app.exception_handler(Exception)
    async def failed(request: Request, error: Exception) -> JSONResponse:
        # Runs outside StatusCounter (Starlette answers escaped exceptions outermost), so the
        # 500 is counted here. uvicorn logs the traceback.
        count_status(store.counters, 500)
        logging.getLogger("edgespec.server").error("unexpected failure: %r", error)
        return refusal(500, "the server failed unexpectedly (a bug: the server log has it)")


def _add_verify_routes(
    app: FastAPI, *, store: SessionStore, info: ServerInfo, api_key: str | None
) -> None:
    """Protocol v1: health, metrics, the target's description, and sessions with rounds."""

    @app.get("/health")
    def health(request: Request) -> dict[str, Any]:
        """Up or down for anyone; the session count only with the key."""
        answer: dict[str, Any] = {"status": "ok", "protocol": PROTOCOL_VERSION}
        if authorized(request.headers, api_key):
            answer["sessions"] = store.count
        return answer

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        store.expire_idle()  # the timer runs every sweep_interval_s: be exact now
        return prometheus_text(store)

    @app.get("/v1/verify/info")
    def verify_info() -> dict[str, Any]:
        return info.to_json()

    @app.post("/v1/verify/sessions")
    def open_session(body: OpenBody) -> dict[str, Any]:
        request = OpenRequest.from_json(
            body.model_dump(), vocab_size=info.vocab_size, max_length=info.max_length
        )
        return store.open(request).to_json()

    @app.post("/v1/verify/sessions/{session_id}/rounds")
    def verify_round(session_id: str, body: VerifyBody, secret: SessionSecret = None) -> Any:
        request = VerifyRequest.from_json(
            body.model_dump(exclude_none=True),
            vocab_size=info.vocab_size,
            max_length=info.max_length,
        )
        return store.verify(session_id, secret, request).to_json()

    @app.delete("/v1/verify/sessions/{session_id}")
    def close_session(session_id: str, secret: SessionSecret = None) -> dict[str, Any]:
        store.close(session_id, secret)
        return {"closed": session_id}
