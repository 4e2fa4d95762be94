"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` (with SSE streaming).

They run speculative decoding on the server with its own engine (local draft and target). Each
round's model passes run as one exclusive turn of the session store, so verification clients
and completion requests share the model fairly; detokenization and stop strings run outside
that turn, so that one request's text work never holds the others up. Only the fields below are
honoured. Other fields are accepted and ignored, as the OpenAI clients send many (``user``,
``metadata``...), except the ones in ``_NEUTRAL`` that would change the answer (``n``,
penalties, ``logit_bias``, tools...): those are refused with a 422 naming the field unless they
hold a value that changes nothing. A ``model`` other than the one served (what ``/v1/models``
lists) is refused with a 404, as OpenAI does.

``/v1/completions`` also takes a prompt of token ids and the legacy ``logprobs`` (top tokens
per position) with ``echo`` (the prompt's positions too) and vLLM's
``return_tokens_as_token_ids``: one extra target pass scores the prompt and the completion, in
slices and within a per-request bound (``edgespec.server.scoring``). That is what an engine
verifier reads (``edgespec.runtime.remote.openai``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from edgespec.api import Delta, Engine, Generation
from edgespec.server.bodies import (
    CHARS_PER_TOKEN,
    SERVED_MODEL,
    ChatBody,
    Common,
    CompletionBody,
)
from edgespec.server.scoring import ScoreBudgetError, Scored, Scorer
from edgespec.server.sessions import ServerStoppingError

if TYPE_CHECKING:
    from edgespec.server.options import ServerOptions
    from edgespec.server.sessions import SessionStore

#: finish reasons of the engine → OpenAI's
_FINISH = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length"}
#: OpenAI (and common vLLM) fields these routes do not implement, each with the values that
#: leave the answer as if the field were absent. Silently ignoring any other value would hand
#: the client something it did not ask for (one choice for n=2, no penalties, no tools).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "best_of": (None, 1),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "logprobs": (None, False),  # chat's boolean; completions declare their own
    "top_logprobs": (None, 0),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "stream_options": (None, {}, {"include_usage": False}),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "top_k": (None, 0, -1),
    "min_p": (None, 0),
    "repetition_penalty": (None, 1),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
}


class Completions:
    """The OpenAI-compatible answers of one engine: generations run one model turn at a time
    (``store.run_exclusive``), as whole replies or as server-sent events."""

    def __init__(self, engine: Engine, *, store: SessionStore, options: ServerOptions) -> None:
        assert engine.target is not None, "edgespec serve always holds a target"
        self.engine = engine
        self.store = store
        self.options = options
        self.scorer = Scorer(engine.target, turn=store.run_exclusive, limits=options.scoring)

    def check_max_tokens(self, body: Common) -> None:
        """Refuses a ``max_tokens`` beyond the model's whole context (it can never be
        honoured), before the prompt is tokenized."""
        context = self.engine.max_length
        asked = body.max_completion_tokens or body.max_tokens
        if asked is not None and asked > context:
            name = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
            raise HTTPException(
                422,
                detail=f"{name} {_shown(asked)} is more than the model's context of {context} "
                f"tokens; ask for at most {context}",
            )

    def new_tokens(self, prompt: list[int], body: Common, *, field: str) -> int:
        """The completion's length: ``max_tokens``, capped by the server's ``max_new_tokens``
        and by what the context leaves after the prompt (sent as ``field``); a prompt that
        leaves no room is refused."""
        context = self.engine.max_length
        room = context - len(prompt)
        if room < 1:
            raise HTTPException(
                422,
                detail=f"{len(prompt)} tokens of {field} leave no room for max_tokens in the "
                f"model's context of {context} tokens; send {field} of at most "
                f"{context - 1} tokens",
            )
        asked = body.max_completion_tokens or body.max_tokens
        limit = self.options.max_new_tokens
        return min(asked or limit, limit, room)

    def start(self, prompt: list[int], body: Common, *, new_tokens: int) -> Generation:
        """The generation of at most ``new_tokens``."""
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return self.engine.stream_deltas(
            prompt,
            max_new_tokens=new_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed or 0,
            stop=stop,
            model_turn=self.store.run_exclusive,
        )

    def answer(self, generation: Generation, body: Common, *, chat: bool) -> Any:
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        head = {"id": ident, "created": int(time.time()), "model": SERVED_MODEL}
        self.store.counters["completions"] += 1
        if body.stream:
            return StreamingResponse(
                _events(head, iter(generation), generation, chat=chat),
                media_type="text/event-stream",
            )
        text = "".join(delta.text for delta in generation)
        result = generation.result
        assert result is not None
        finish = _FINISH.get(result.finish_reason, "stop")
        usage = {
            "prompt_tokens": result.stats.prompt_tokens,
            "completion_tokens": len(result.tokens),
            "total_tokens": result.stats.prompt_tokens + len(result.tokens),
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

    def prompt_ids(self, body: CompletionBody) -> list[int]:
        engine = self.engine
        if isinstance(body.prompt, str):
            self.check_text_length(len(body.prompt))
            return engine.encode(body.prompt)
        bad = [t for t in body.prompt if not 0 <= t < engine.vocab_size]
        if bad:
            raise HTTPException(
                422, detail=f"token ids must lie in [0, {engine.vocab_size}): {bad[:5]}"
            )
        return list(body.prompt)

    def completion(self, body: CompletionBody) -> Any:
        refuse_unsupported(body)
        self.check_max_tokens(body)
        if body.logprobs is not None and body.stream:
            raise HTTPException(422, detail="logprobs with stream is not supported")
        prompt = self.prompt_ids(body)
        new_tokens = self.new_tokens(prompt, body, field="prompt")
        if body.logprobs is None:
            return self.answer(self.start(prompt, body, new_tokens=new_tokens), body, chat=False)
        self.check_scoring(len(prompt), new_tokens)
        reply, completed = self.generated(prompt, body, new_tokens=new_tokens)
        tokens = prompt + completed
        first = 0 if body.echo else len(prompt)
        try:
            scores = self.scorer.score(tokens, first=first, top=body.logprobs)
        except ScoreBudgetError as error:
            raise HTTPException(
                422,
                detail=f"{error}, past the {self.options.scoring.max_seconds:g} s this server "
                "scores per request; send a shorter prompt or a lower max_tokens, or leave "
                "logprobs out",
            ) from error
        reply["choices"][0]["logprobs"] = scored(
            self.engine, tokens[first:], scores, by_id=body.return_tokens_as_token_ids
        )
        if body.echo:
            echoed = self.engine.tokenizer.decode(prompt)
            reply["choices"][0]["text"] = echoed + reply["choices"][0]["text"]
        return reply

    def check_scoring(self, prompt_tokens: int, new_tokens: int) -> None:
        """Refuses ``logprobs`` over more positions than one request may score."""
        limit = self.options.scoring.max_positions
        positions = prompt_tokens + new_tokens
        if positions > limit:
            raise HTTPException(
                422,
                detail=f"logprobs scores the prompt and the completion: {prompt_tokens} prompt "
                f"tokens + {new_tokens} of max_tokens = {positions} positions, more than the "
                f"{limit} this server scores per request; send a shorter prompt or a lower "
                "max_tokens, or leave logprobs out",
            )

    def generated(
        self, prompt: list[int], body: Common, *, new_tokens: int
    ) -> tuple[dict[str, Any], list[int]]:
        """The answer and the completion's tokens; the generation (and its caches) is gone
        when this returns, before the scoring pass allocates its own."""
        generation = self.start(prompt, body, new_tokens=new_tokens)
        reply = self.answer(generation, body, chat=False)
        assert generation.result is not None
        return reply, list(generation.result.tokens)

    def chat_completion(self, body: ChatBody) -> Any:
        refuse_unsupported(body)
        self.check_max_tokens(body)
        engine = self.engine
        self.check_text_length(sum(len(m.content) for m in body.messages))
        messages = [{"role": m.role, "content": m.content} for m in body.messages]
        if engine.chat_template:
            text = engine.apply_chat_template(messages)
            prompt = list(engine.tokenizer.encode(text, add_special_tokens=False).ids)
        else:  # no template in the bundle: a plain transcript
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
            prompt = engine.encode(text)
        new_tokens = self.new_tokens(prompt, body, field="messages")
        return self.answer(self.start(prompt, body, new_tokens=new_tokens), body, chat=True)

    def check_text_length(self, chars: int) -> None:
        """Refuses text that cannot fit the context before it is tokenized (tokenizing
        megabytes would cost seconds of a core for a certain refusal)."""
        limit = CHARS_PER_TOKEN * self.engine.max_length
        if chars > limit:
            raise HTTPException(
                422,
                detail=f"the prompt's {chars} characters cannot fit the context of "
                f"{self.engine.max_length} tokens; send at most {limit}",
            )


def add_openai_routes(
    app: FastAPI, engine: Engine, *, store: SessionStore, options: ServerOptions
) -> None:
    """The routes; the API key is checked in front of them (``guard.RequestGuard``)."""
    service = Completions(engine, store=store, options=options)

    @app.post("/v1/completions")
    def completions(body: CompletionBody) -> Any:
        return service.completion(body)

    @app.post("/v1/chat/completions")
    def chat_completions(body: ChatBody) -> Any:
        return service.chat_completion(body)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": SERVED_MODEL, "object": "model"}]}


def refuse_unsupported(body: Common) -> None:
    """404 for a model not served; 422 naming the first field of ``_NEUTRAL`` whose value would
    change the answer. Runs before anything is generated (a stream cannot turn into an error)."""
    if body.model != SERVED_MODEL:
        raise HTTPException(
            404,
            detail=f"model {_shown(body.model)} is not served here; send model "
            f"'{SERVED_MODEL}' or leave it out (GET /v1/models lists it)",
        )
    for name, value in (body.model_extra or {}).items():
        neutral = _NEUTRAL.get(name)
        if neutral is not None and value not in neutral:
            fix = f"leave '{name}' out"
            if len(neutral) > 1:
                fix += f" or send {json.dumps(neutral[1])}"
            problem = f"'{name}' = {_shown(value)} is not supported by edgespec serve"
            raise HTTPException(422, detail=f"{problem}; {fix}")


def _shown(value: Any) -> str:
    """A client's value in an answer: JSON (ASCII, escaped), cut at 40 characters."""
    shown = json.dumps(value, default=str)
    return shown if len(shown) <= 40 else shown[:37] + "..."


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

    try:
        for delta in deltas:
            yield event(delta.text, None)
    except ServerStoppingError:
        return  # past the shutdown grace: no [DONE], so the client knows the stream was cut
    result = generation.result
    finish = _FINISH.get(result.finish_reason, "stop") if result is not None else "stop"
    yield event(None, finish)
    yield "data: [DONE]\n\n"


def scored(
    engine: Engine, tokens: Sequence[int], scores: Sequence[Scored | None], *, by_id: bool
) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object for ``tokens`` and their ``scores``: each
    token's name, its log-probability and the top tokens at its position (None where nothing
    predicts the token: position 0)."""

    def name(token: int) -> str:
        return f"token_id:{token}" if by_id else str(engine.tokenizer.decode([token]))

    names: list[str] = []
    own: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for token, score in zip(tokens, scores, strict=True):
        names.append(name(int(token)))
        offsets.append(offset)
        offset += len(names[-1])
        if score is None:
            own.append(None)
            tops.append(None)
            continue
        entry = {name(t): value for t, value in zip(score.top_ids, score.top_logprobs, strict=True)}
        entry[names[-1]] = score.logprob
        own.append(score.logprob)
        tops.append(entry)
    return {"tokens": names, "token_logprobs": own, "top_logprobs": tops, "text_offset": offsets}
