"""Verification protocol v1: the records a remote verifier and ``edgespec serve`` exchange.

Pure (numpy and the standard library): both sides import it, and the JSON test vectors in
``tests/vectors/`` pin it down for other clients (the Android bridge). Every ``from_json``
validates what it reads and raises :class:`ProtocolError` with a message; the server answers those
with a 4xx. The README's "Protocol v1" section is the prose version of this module.

A round verifies ``[last_token] + draft`` where ``last_token`` sits at absolute ``position``:
the server crops its cache to ``position`` tokens first, so a retried round is idempotent.
q_draft travels ``sparse`` (ids and float64 probabilities of the nonzero entries: exact, and
small when the draft samples from a top-k or top-p truncated distribution) or as ``fp16``
rows (base64, little-endian; compact but rounded). Greedy and match rounds send no q_draft.
Rejection rounds also send ``uniforms``: the k + 1 next draws of the client's generator, which
the server's acceptance test consumes in order, so that remote sampling equals local sampling.

A session belongs to the client that opened it: the open answer carries a ``session_secret``
that every round and delete of the session sends back in the ``SESSION_SECRET_HEADER`` header
(a header, not the path, so that proxies' access logs do not record it). A server that
answers no secret (older than the field) needs none.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgespec.config import SamplingConfig
from edgespec.errors import ConfigError, ProtocolError

PROTOCOL_VERSION = 1
#: The longest draft a round may carry.
MAX_K = 32
#: Rows with at most this many nonzero probabilities travel sparse by default.
MAX_SPARSE = 1024
Q_FORMATS = ("sparse", "fp16")
#: The header rounds and deletes carry a session's secret in (from ``OpenResponse``).
SESSION_SECRET_HEADER = "Edgespec-Session-Secret"


def _field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in data:
        raise ProtocolError(f"'{name}' is missing")
    value = data[name]
    # bool is an int in Python; a token id or position must not be true/false.
    if isinstance(value, bool) and kind is not bool:
        raise ProtocolError(f"'{name}' must be {_kind_name(kind)}, not a boolean")
    if not isinstance(value, kind):
        raise ProtocolError(f"'{name}' must be {_kind_name(kind)}, not {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def _token_ids(name: str, values: Any, vocab_size: int | None) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise ProtocolError(f"'{name}' must be a list of token ids")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"'{name}' must hold integers only")
        if value < 0 or (vocab_size is not None and value >= vocab_size):
            raise ProtocolError(f"token id {value} in '{name}' is outside [0, {vocab_size})")
    return tuple(values)


def _check_version(data: Mapping[str, Any]) -> None:
    if not isinstance(data, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    version = data.get("protocol", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported (this is v1)")


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
            temperature=float(_field(data, "temperature", (int, float))),
            top_k=int(_field(data, "top_k", int)),
            top_p=float(_field(data, "top_p", (int, float))),
            seed=int(_field(data, "seed", int)),
            mode=str(_field(data, "mode", str)),
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
        _check_version(data)
        prompt = _token_ids("prompt", _field(data, "prompt", list), vocab_size)
        if not prompt:
            raise ProtocolError("'prompt' is empty: send at least one token")
        if len(prompt) >= max_length:
            raise ProtocolError(
                f"the prompt ({len(prompt)} tokens) fills the context of {max_length}"
            )
        return cls(prompt=prompt, sampling=sampling_from_json(_field(data, "sampling", dict)))


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
        _check_version(data)
        secret = data.get("session_secret")
        if secret is not None and not isinstance(secret, str):
            raise ProtocolError(f"'session_secret' must be str, not {type(secret).__name__}")
        return cls(
            session_id=_field(data, "session_id", str),
            length=_field(data, "length", int),
            suggested_k=_field(data, "suggested_k", int),
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
        _check_version(data)
        position = _field(data, "position", int)
        last_token = _token_ids("last_token", [_field(data, "last_token", int)], vocab_size)[0]
        draft = _token_ids("draft", _field(data, "draft", list), vocab_size)
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
        _check_version(data)
        n_accepted = _field(data, "n_accepted", int)
        tokens = _token_ids("tokens", _field(data, "tokens", list), None)
        if not 0 <= n_accepted <= k or len(tokens) != n_accepted + 1:
            raise ProtocolError(
                f"{n_accepted} accepted and tokens {tokens} do not fit a k = {k} draft"
            )
        return cls(
            n_accepted=n_accepted,
            tokens=tokens,
            length=_field(data, "length", int),
            suggested_k=_field(data, "suggested_k", int),
            verify_s=float(_field(data, "verify_s", (int, float))),
        )


def uniforms_used(n_accepted: int, k: int) -> int:
    """Draws the rejection test consumes: one per tested token, one for the next token."""
    return k + 1 if n_accepted == k else n_accepted + 2


def encode_q_draft(
    q_draft: np.ndarray, *, q_format: str | None = None, max_sparse: int = MAX_SPARSE
) -> dict[str, Any]:
    """``sparse`` when every row has at most ``max_sparse`` nonzeros (or when asked), else fp16."""
    rows = np.asarray(q_draft, dtype=np.float64)  # [k, vocab]
    if q_format is None:
        widest = int(np.count_nonzero(rows, axis=-1).max()) if rows.size else 0
        q_format = "sparse" if widest <= max_sparse else "fp16"
    if q_format == "sparse":
        ids = [np.flatnonzero(row) for row in rows]
        return {
            "format": "sparse",
            "ids": [[int(i) for i in row_ids] for row_ids in ids],
            "probs": [
                [float(p) for p in row[row_ids]] for row, row_ids in zip(rows, ids, strict=True)
            ],
        }
    if q_format == "fp16":
        packed = rows.astype("<f2").tobytes()
        return {
            "format": "fp16",
            "vocab_size": rows.shape[-1],
            "rows": base64.b64encode(packed).decode("ascii"),
        }
    raise ConfigError(f"unknown q_draft format {q_format!r}", fix=f"use one of {Q_FORMATS}")


def decode_q_draft(data: Any, *, k: int, vocab_size: int) -> np.ndarray:
    """[k, vocab_size] float64 rows, each nonnegative with a positive sum."""
    if not isinstance(data, Mapping):
        raise ProtocolError("'q_draft' must be an object")
    fmt = data.get("format")
    rows = np.zeros((k, vocab_size), dtype=np.float64)
    if fmt == "sparse":
        ids, probs = _field(data, "ids", list), _field(data, "probs", list)
        if len(ids) != k or len(probs) != k:
            raise ProtocolError(f"'q_draft' must have k = {k} rows of ids and of probs")
        for row, (row_ids, row_probs) in enumerate(zip(ids, probs, strict=True)):
            checked = _token_ids("q_draft.ids", row_ids, vocab_size)
            if not isinstance(row_probs, list) or len(row_probs) != len(checked):
                raise ProtocolError(f"q_draft row {row}: ids and probs differ in length")
            if any(isinstance(p, bool) or not isinstance(p, (int, float)) for p in row_probs):
                raise ProtocolError(f"q_draft row {row}: probs must be numbers")
            rows[row, list(checked)] = row_probs
    elif fmt == "fp16":
        packed = _field(data, "rows", str)
        try:
            raw = base64.b64decode(packed, validate=True)
        except ValueError as error:
            raise ProtocolError("'q_draft.rows' is not valid base64") from error
        if len(raw) != 2 * k * vocab_size:
            raise ProtocolError(
                f"'q_draft.rows' holds {len(raw)} bytes, not 2 x {k} x {vocab_size}"
            )
        rows[:] = np.frombuffer(raw, dtype="<f2").reshape(k, vocab_size)
    else:
        raise ProtocolError(f"'q_draft.format' must be one of {Q_FORMATS}, not {fmt!r}")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0.0):
        raise ProtocolError("q_draft probabilities must be finite and nonnegative")
    if k and not all(math.isfinite(s) and s > 0.0 for s in rows.sum(axis=-1)):
        raise ProtocolError("every q_draft row needs a positive sum")
    return rows


@dataclass(frozen=True, kw_only=True)
class ChatFormat:
    """How the target turns a conversation into its prompt: its Jinja chat ``template``, the
    special-token strings the template may use, and the ``system_prompt`` put first when a
    conversation has none. A device that drafts for a remote target formats chats with the
    target's, so that remote and local chat send the same tokens."""

    template: str
    bos_token: str = ""
    eos_token: str = ""
    system_prompt: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "template": self.template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "system_prompt": self.system_prompt,
        }

    @classmethod
    def from_json(cls, data: Any) -> ChatFormat:
        if not isinstance(data, Mapping):
            raise ProtocolError("'chat' must be an object")
        system_prompt = data.get("system_prompt")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ProtocolError("'chat.system_prompt' must be a string or null")
        return cls(
            template=_field(data, "template", str),
            bos_token=_field(data, "bos_token", str),
            eos_token=_field(data, "eos_token", str),
            system_prompt=system_prompt,
        )


@dataclass(frozen=True, kw_only=True)
class ServerInfo:
    """``GET /v1/verify/info``: what a client checks before it opens sessions.

    ``target_step_s`` and ``verify_cost`` (T(w)/T(1) for w = 1..) feed the client's cost model.
    ``chat`` is the target's chat format (None: its tokenizer has no chat template; a server
    older than the field sends none either).
    """

    vocab_size: int
    max_length: int
    eos_token_ids: tuple[int, ...]
    tokenizer_sha256: str
    max_k: int
    target_step_s: float
    verify_cost: tuple[float, ...]
    chat: ChatFormat | None = None

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "protocol": PROTOCOL_VERSION,
            "vocab_size": self.vocab_size,
            "max_length": self.max_length,
            "eos_token_ids": list(self.eos_token_ids),
            "tokenizer_sha256": self.tokenizer_sha256,
            "max_k": self.max_k,
            "target_step_s": self.target_step_s,
            "verify_cost": list(self.verify_cost),
        }
        if self.chat is not None:
            found["chat"] = self.chat.to_json()
        return found

    @classmethod
    def from_json(cls, data: Any) -> ServerInfo:
        _check_version(data)
        costs: Sequence[Any] = _field(data, "verify_cost", list)
        chat = data.get("chat")
        return cls(
            vocab_size=_field(data, "vocab_size", int),
            max_length=_field(data, "max_length", int),
            eos_token_ids=_token_ids("eos_token_ids", _field(data, "eos_token_ids", list), None),
            tokenizer_sha256=_field(data, "tokenizer_sha256", str),
            max_k=_field(data, "max_k", int),
            target_step_s=float(_field(data, "target_step_s", (int, float))),
            verify_cost=tuple(float(c) for c in costs),
            chat=None if chat is None else ChatFormat.from_json(chat),
        )
