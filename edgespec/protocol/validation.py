"""Checked reading of a decoded JSON message for protocol v1: each helper raises
:class:`ProtocolError` naming the field, which the server answers with a 4xx."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgespec.errors import ProtocolError
from edgespec.protocol import PROTOCOL_VERSION


def required_field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
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


def checked_token_ids(name: str, values: Any, vocab_size: int | None) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise ProtocolError(f"'{name}' must be a list of token ids")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"'{name}' must hold integers only")
        if value < 0 or (vocab_size is not None and value >= vocab_size):
            raise ProtocolError(f"token id {value} in '{name}' is outside [0, {vocab_size})")
    return tuple(values)


def check_version(data: Mapping[str, Any]) -> None:
    if not isinstance(data, Mapping):
        raise ProtocolError("the request body must be a JSON object")
    version = data.get("protocol", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {version!r} is not supported (this is v1)")
