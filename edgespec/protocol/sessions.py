"""The messages of one protocol v1 session: opening it (the prompt and the sampling settings)
and its rounds (a draft to verify, and the verdict).

A round verifies ``[last_token] + draft`` where ``last_token`` sits at absolute ``position``:
the server crops its cache to ``position`` tokens first, so a retried round is idempotent.
Rejection rounds carry q_draft (:mod:`edgespec.protocol.q_draft`) and ``uniforms``: the k + 1
next draws of the client's generator, which the server's acceptance test consumes in order, so
that remote sampling equals local sampling.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, ProtocolError
from edgespec.protocol import MAX_K, PROTOCOL_VERSION
from edgespec.protocol.q_draft import MAX_SPARSE, decode_q_draft, encode_q_draft
from edgespec.protocol.validation import check_version, checked_token_ids, required_field


def sampling_to_json(sampling: SamplingConfig) -> dict[str, Any]:
    return {
        "temperature": sampling.temperature,
        "top_k": sampling.top_k,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "mode": sampling.mode,
    }


def sampling_from_json(data: Any) -> SamplingConfig:
    if not isinstance(data, Mapping):
        raise ProtocolError("'sampling' must be an object")
    for name in ("temperature", "top_p"):
        value = data.get(name)
        if isinstance(value, (int, float)) and not (math.isfinite(value) and value <= 1e4):
            raise ProtocolError(f"'{name}' must be a finite number no larger than 1e4")
    try:
        return SamplingConfig(
            temperature=float(required_field(data, "temperature", (int, float))),
            top_k=int(required_field(data, "top_k", int)),
            top_p=float(required_field(data, "top_p", (int, float))),
            seed=int(required_field(data, "seed", int)),
            mode=str(required_field(data, "mode", str)),
        )
    except ConfigError as error:
        raise ProtocolError(f"bad sampling settings: {error.problem}") from error


@dataclass(frozen=True, kw_only=True)
class OpenRequest:
    """Start (or re-open) a session: the server prefills ``prompt[:-1]``."""

    prompt: tuple[int, ...]
    sampling: SamplingConfig

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "prompt": list(self.prompt),
            "sampling": sampling_to_json(self.sampling),
        }

    @classmethod
    def from_json(cls, data: Any, *, vocab_size: int, max_length: int) -> OpenRequest:
        check_version(data)
        prompt = checked_token_ids("prompt", required_field(data, "prompt", list), vocab_size)
        if not prompt:
            raise ProtocolError("'prompt' is empty: send at least one token")
        if len(prompt) >= max_length:
            raise ProtocolError(
                f"the prompt ({len(prompt)} token{'s' * (len(prompt) != 1)}) fills the "
                f"context of {max_length}"
            )
        return cls(
            prompt=prompt, sampling=sampling_from_json(required_field(data, "sampling", dict))
        )


@dataclass(frozen=True, kw_only=True)
class OpenResponse:
    """``session_secret``: what the session's rounds and delete must send back (None from a
    server older than the field)."""

    session_id: str
    length: int
    suggested_k: int
    session_secret: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION,
            "session_id": self.session_id,
            "length": self.length,
            "suggested_k": self.suggested_k,
        }
        if self.session_secret is not None:
            data["session_secret"] = self.session_secret
        return data

    @classmethod
    def from_json(cls, data: Any) -> OpenResponse:
        check_version(data)
        secret = data.get("session_secret")
        if secret is not None and not isinstance(secret, str):
            raise ProtocolError(f"'session_secret' must be str, not {type(secret).__name__}")
        return cls(
            session_id=required_field(data, "session_id", str),
            length=required_field(data, "length", int),
            suggested_k=required_field(data, "suggested_k", int),
            session_secret=secret,
        )


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """One round. ``q_draft`` [k, vocab] (float64) for rejection rounds, else None."""

    position: int
    last_token: int
    draft: tuple[int, ...]
    q_draft: np.ndarray | None = None
    uniforms: tuple[float, ...] = ()

    def to_json(self, *, q_format: str | None = None, max_sparse: int = MAX_SPARSE) -> dict:
        data: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION,
            "position": self.position,
            "last_token": self.last_token,
            "draft": list(self.draft),
        }
        if self.q_draft is not None:
            data["q_draft"] = encode_q_draft(self.q_draft, q_format=q_format, max_sparse=max_sparse)
        if self.uniforms:
            data["uniforms"] = list(self.uniforms)
        return data

    @classmethod
    def from_json(cls, data: Any, *, vocab_size: int, max_length: int) -> VerifyRequest:
        check_version(data)
        position = required_field(data, "position", int)
        last_token = checked_token_ids(
            "last_token", [required_field(data, "last_token", int)], vocab_size
        )[0]
        draft = checked_token_ids("draft", required_field(data, "draft", list), vocab_size)
        if len(draft) > MAX_K:
            raise ProtocolError(f"k = {len(draft)} draft tokens is more than the limit of {MAX_K}")
        if position < 0 or position + 1 + len(draft) > max_length:
            raise ProtocolError(
                f"position {position} with {len(draft)} draft tokens is outside the context "
                f"of {max_length}"
            )
        q_draft = None
        if data.get("q_draft") is not None:
            q_draft = decode_q_draft(data["q_draft"], k=len(draft), vocab_size=vocab_size)
        uniforms = data.get("uniforms", [])
        if not isinstance(uniforms, list) or len(uniforms) > len(draft) + 1:
            raise ProtocolError(f"'uniforms' must be a list of at most k + 1 = {len(draft) + 1}")
        for u in uniforms:
            if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 <= u < 1.0:
                raise ProtocolError("'uniforms' must hold numbers in [0, 1)")
        return cls(
            position=position,
            last_token=last_token,
            draft=draft,
            q_draft=q_draft,
            uniforms=tuple(float(u) for u in uniforms),
        )


@dataclass(frozen=True, kw_only=True)
class VerifyResponse:
    """``tokens`` = the accepted draft tokens then the target's own (``n_accepted`` + 1)."""

    n_accepted: int
    tokens: tuple[int, ...]
    length: int
    suggested_k: int
    verify_s: float

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL_VERSION,
            "n_accepted": self.n_accepted,
            "tokens": list(self.tokens),
            "length": self.length,
            "suggested_k": self.suggested_k,
            "verify_s": self.verify_s,
        }

    @classmethod
    def from_json(cls, data: Any, *, k: int) -> VerifyResponse:
        check_version(data)
        n_accepted = required_field(data, "n_accepted", int)
        tokens = checked_token_ids("tokens", required_field(data, "tokens", list), None)
        if not 0 <= n_accepted <= k or len(tokens) != n_accepted + 1:
            raise ProtocolError(
                f"{n_accepted} accepted and tokens {tokens} do not fit a k = {k} draft"
            )
        return cls(
            n_accepted=n_accepted,
            tokens=tokens,
            length=required_field(data, "length", int),
            suggested_k=required_field(data, "suggested_k", int),
            verify_s=float(required_field(data, "verify_s", (int, float))),
        )


def uniforms_used(n_accepted: int, k: int) -> int:
    """Draws the rejection test consumes: one per tested token, one for the next token."""
    return k + 1 if n_accepted == k else n_accepted + 2
