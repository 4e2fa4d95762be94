"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (with SSE streaming).

They run speculative decoding on the server with its own engine (local draft and target).
Each round runs as one exclusive model turn of the session store, so verification clients and
completion requests share the model fairly. Only the fields below are honoured; others are
accepted and ignored, as the OpenAI clients send many.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from edgespec.api import Delta, Engine, Generation

if TYPE_CHECKING:
    from edgespec.server.app import ServerOptions
    from edgespec.server.sessions import SessionStore

#: finish reasons of the engine → OpenAI's
_FINISH = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length"}


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = "edgespec"
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False


class CompletionBody(_Common):
    prompt: str = Field(min_length=1)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)


def add_openai_routes(
    app: FastAPI,
    engine: Engine,
    *,
    store: SessionStore,
    guarded: Sequence[Any],
    options: ServerOptions,
) -> None:
    def start(prompt: list[int], body: _Common) -> Generation:
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        room = engine.max_length - len(prompt)
        return engine.stream_deltas(
            prompt,
            max_new_tokens=min(body.max_tokens or options.max_new_tokens, max(room, 1)),
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed or 0,
            stop=stop,
        )

    def pieces(generation: Generation) -> Iterator[Delta]:
        """The generation's deltas, each round run as an exclusive model turn."""
        iterator = iter(generation)
        while True:
            delta = store.run_exclusive(lambda: next(iterator, None))
            if delta is None:
                return
            yield delta

    def answer(generation: Generation, body: _Common, *, chat: bool) -> Any:
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        head = {"id": ident, "created": created, "model": body.model}
        store.counters["completions"] += 1
        if body.stream:
            return StreamingResponse(
                _events(head, pieces(generation), generation, chat=chat),
                media_type="text/event-stream",
            )
        text = "".join(delta.text for delta in pieces(generation))
        result = generation.result
        assert result is not None
        finish = _FINISH.get(result.finish_reason, "stop")
        usage = {
            "prompt_tokens": result.stats.get("prompt_tokens", 0),
            "completion_tokens": len(result.tokens),
            "total_tokens": result.stats.get("prompt_tokens", 0) + len(result.tokens),
        }
        if chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
            }
            return {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {**head, "object": "text_completion", "choices": [choice], "usage": usage}

    @app.post("/v1/completions", dependencies=list(guarded))
    def completions(body: CompletionBody) -> Any:
        return answer(start(engine.encode(body.prompt), body), body, chat=False)

    @app.post("/v1/chat/completions", dependencies=list(guarded))
    def chat_completions(body: ChatBody) -> Any:
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        if engine.chat_template:
            text = engine.apply_chat_template(messages)
            prompt = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
        else:  # no template in the bundle: a plain transcript
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
            prompt = engine.encode(text)
        return answer(start(prompt, body), body, chat=True)

    @app.get("/v1/models", dependencies=list(guarded))
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": "edgespec", "object": "model"}]}


def _events(
    head: dict[str, Any], deltas: Iterator[Delta], generation: Generation, *, chat: bool
) -> Iterator[str]:
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(piece: str | None, finish: str | None) -> str:
        if chat:
            delta = {"role": "assistant", "content": piece} if piece is not None else {}
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "finish_reason": finish, "logprobs": None}
        return f"data: {json.dumps({**head, 'object': kind, 'choices': [choice]})}\n\n"

    for delta in deltas:
        yield event(delta.text, None)
    result = generation.result
    finish = _FINISH.get(result.finish_reason, "stop") if result is not None else "stop"
    yield event(None, finish)
    yield "data: [DONE]\n\n"
