"""Request bodies of every route, as pydantic models: their OpenAPI schema is what fuzzing
starts from, and their bounds are what the routes rely on.

Bounds that depend on the model (a prompt fits the context, token ids lie in the vocabulary)
are checked by the routes; :class:`~edgespec.server.guard.RequestGuard` has already bounded the
body's size, depth and list lengths and refused text that is not Unicode.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from edgespec.protocol import MAX_K, PROTOCOL_VERSION

#: The one model name the OpenAI-compatible routes serve (``/v1/models``).
SERVED_MODEL = "edgespec"
#: Stop strings a completion may carry, and the longest one: matching runs on every delta.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
#: Chat messages per request.
MAX_MESSAGES = 256
#: Prompt characters per token of context: a longer text cannot fit, so it is refused before
#: it is tokenized.
CHARS_PER_TOKEN = 64
#: ``max_tokens``: an integer (10001.0 is refused, not rounded), at least 1; the routes refuse
#: one beyond the model's context in those words.
TokenCount = Annotated[int, Field(strict=True, ge=1)]
StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class SamplingBody(BaseModel):
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    mode: str = Field(default="rejection", max_length=16)


class OpenBody(BaseModel):
    protocol: int = PROTOCOL_VERSION
    prompt: list[int]
    sampling: SamplingBody = Field(default_factory=SamplingBody)


class QDraftBody(BaseModel):
    format: str = Field(max_length=16)
    ids: list[list[int]] | None = Field(default=None, max_length=MAX_K)
    probs: list[list[float]] | None = Field(default=None, max_length=MAX_K)
    rows: str | None = None
    vocab_size: int | None = None


class VerifyBody(BaseModel):
    protocol: int = PROTOCOL_VERSION
    position: int
    last_token: int
    draft: list[int] = Field(default_factory=list, max_length=MAX_K)
    q_draft: QDraftBody | None = None
    uniforms: list[float] = Field(default_factory=list, max_length=MAX_K + 1)


class Common(BaseModel):
    """Fields both OpenAI-compatible routes take; others are kept (``model_extra``) so that
    the routes can refuse the ones they do not implement."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(default=SERVED_MODEL, max_length=256)
    max_tokens: TokenCount | None = None
    #: chat's newer name for ``max_tokens``; wins when both are sent
    max_completion_tokens: TokenCount | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False


class CompletionBody(Common):
    prompt: str | list[int] = Field(min_length=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    return_tokens_as_token_ids: bool = False


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str = Field(max_length=64)
    content: str


class ChatBody(Common):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
