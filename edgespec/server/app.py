"""The HTTP face of ``edgespec serve``: protocol v1, health, metrics, OpenAI-compatible routes.

Request bodies are declared as pydantic models (so the OpenAPI schema describes them for
fuzzing) and then validated by the protocol module (``edgespec.protocol``), whose
errors become 4xx answers with a message. With an API key every route but ``/health`` needs
``Authorization: Bearer KEY`` (compared in constant time).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, Field

from edgespec.api import Engine
from edgespec.errors import ConfigError, EdgespecError, PositionConflictError, UnknownSessionError
from edgespec.protocol import (
    MAX_K,
    PROTOCOL_VERSION,
    OpenRequest,
    ServerInfo,
    VerifyRequest,
)
from edgespec.runtime.k_policy import CostProfile
from edgespec.server.metrics import prometheus_text
from edgespec.server.openai_routes import add_openai_routes
from edgespec.server.sessions import SessionStore, StoreLimits


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """``api_key`` None: no authentication (loopback only, checked by ``edgespec serve``)."""

    api_key: str | None = None
    limits: StoreLimits = field(default_factory=StoreLimits)
    max_body_bytes: int = 4 * 1024 * 1024
    #: Longest completion the OpenAI-compatible routes generate.
    max_new_tokens: int = 1024


class SamplingBody(BaseModel):
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    mode: str = "rejection"


class OpenBody(BaseModel):
    protocol: int = PROTOCOL_VERSION
    prompt: list[int]
    sampling: SamplingBody = Field(default_factory=SamplingBody)


class QDraftBody(BaseModel):
    format: str
    ids: list[list[int]] | None = None
    probs: list[list[float]] | None = None
    rows: str | None = None
    vocab_size: int | None = None


class VerifyBody(BaseModel):
    protocol: int = PROTOCOL_VERSION
    position: int
    last_token: int
    draft: list[int] = Field(default_factory=list, max_length=MAX_K)
    q_draft: QDraftBody | None = None
    uniforms: list[float] = Field(default_factory=list)


def create_app(
    engine: Engine, *, options: ServerOptions = ServerOptions(), profile: CostProfile
) -> FastAPI:
    """The application for ``engine``'s target; ``profile`` is its measured cost curve."""
    target = engine.target
    if target is None:
        raise ConfigError("the server needs a local target", fix="load the engine with target=")
    app = FastAPI(title="edgespec verification server", version=f"protocol-{PROTOCOL_VERSION}")
    store = SessionStore(target, limits=options.limits)
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
    )

    def authorize(request: Request) -> None:
        if options.api_key is None:
            return
        given = request.headers.get("authorization", "")
        expected = f"Bearer {options.api_key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            raise _Unauthorized()

    guarded = [Depends(authorize)]
    _add_error_answers(app, store=store, options=options)
    _add_verify_routes(app, store=store, info=info, guarded=guarded)
    add_openai_routes(app, engine, store=store, guarded=guarded, options=options)
    return app


def _add_error_answers(app: FastAPI, *, store: SessionStore, options: ServerOptions) -> None:
    """The body limit, error counters, and one JSON answer per kind of refusal."""

    @app.middleware("http")
    async def limit_body(request: Request, call_next: Any) -> Any:
        length = request.headers.get("content-length", "0")
        if not length.isdigit() or int(length) > options.max_body_bytes:
            store.counters["errors_413"] += 1
            return JSONResponse(
                {"detail": f"the request body is over {options.max_body_bytes} bytes"}, 413
            )
        response = await call_next(request)
        if response.status_code >= 400:
            store.counters[f"errors_{response.status_code}"] += 1
        return response

    @app.exception_handler(_Unauthorized)
    async def unauthorized(request: Request, error: _Unauthorized) -> JSONResponse:
        return JSONResponse(
            {"detail": "missing or wrong API key (send Authorization: Bearer KEY)"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer echoes the input, which may hold NaN or Infinity: JSON cannot
        # carry those, so the answer would be a 500. The location and message suffice.
        problems = [
            f"{'.'.join(str(part) for part in problem.get('loc', ()))}: {problem.get('msg', '')}"
            for problem in error.errors()
        ]
        return JSONResponse({"detail": "; ".join(problems) or "invalid request"}, 422)

    @app.exception_handler(EdgespecError)
    async def refused(request: Request, error: EdgespecError) -> JSONResponse:
        status = 422
        if isinstance(error, UnknownSessionError):
            status = 404
        elif isinstance(error, PositionConflictError):
            status = 409
        return JSONResponse({"detail": str(error)}, status_code=status)


def _add_verify_routes(
    app: FastAPI, *, store: SessionStore, info: ServerInfo, guarded: list[Any]
) -> None:
    """Protocol v1: health, metrics, the target's description, and sessions with rounds."""

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "protocol": PROTOCOL_VERSION, "sessions": store.count}

    @app.get("/metrics", dependencies=guarded, response_class=PlainTextResponse)
    def metrics() -> str:
        return prometheus_text(store)

    @app.get("/v1/verify/info", dependencies=guarded)
    def verify_info() -> dict[str, Any]:
        return info.to_json()

    @app.post("/v1/verify/sessions", dependencies=guarded)
    def open_session(body: OpenBody) -> dict[str, Any]:
        request = OpenRequest.from_json(
            body.model_dump(), vocab_size=info.vocab_size, max_length=info.max_length
        )
        return store.open(request).to_json()

    @app.post("/v1/verify/sessions/{session_id}/rounds", dependencies=guarded)
    def verify_round(session_id: str, body: VerifyBody) -> dict[str, Any]:
        request = VerifyRequest.from_json(
            body.model_dump(exclude_none=True),
            vocab_size=info.vocab_size,
            max_length=info.max_length,
        )
        return store.verify(session_id, request).to_json()

    @app.delete("/v1/verify/sessions/{session_id}", dependencies=guarded)
    def close_session(session_id: str) -> dict[str, Any]:
        store.close(session_id)
        return {"closed": session_id}


class _Unauthorized(Exception):
    """Raised by the API key check; answered with 401."""
