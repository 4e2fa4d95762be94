"""What a protocol v1 server tells a client before it opens sessions (``GET /v1/verify/info``):
the target's vocabulary and context limits, its cost profile, and its chat format."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from edgespec.errors import ProtocolError
from edgespec.protocol import PROTOCOL_VERSION
from edgespec.protocol.validation import check_version, checked_token_ids, required_field


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
            template=required_field(data, "template", str),
            bos_token=required_field(data, "bos_token", str),
            eos_token=required_field(data, "eos_token", str),
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
        check_version(data)
        costs: Sequence[Any] = required_field(data, "verify_cost", list)
        chat = data.get("chat")
        return cls(
            vocab_size=required_field(data, "vocab_size", int),
            max_length=required_field(data, "max_length", int),
            eos_token_ids=checked_token_ids(
                "eos_token_ids", required_field(data, "eos_token_ids", list), None
            ),
            tokenizer_sha256=required_field(data, "tokenizer_sha256", str),
            max_k=required_field(data, "max_k", int),
            target_step_s=float(required_field(data, "target_step_s", (int, float))),
            verify_cost=tuple(float(c) for c in costs),
            chat=None if chat is None else ChatFormat.from_json(chat),
        )
