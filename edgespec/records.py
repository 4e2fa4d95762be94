"""Frozen dataclasses from JSON data, naming the first bad field (the manifest's reader)."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from edgespec.errors import BundleError

_T = TypeVar("_T")


def decode_record(cls: type[_T], data: object, where: str) -> _T:
    """Builds dataclass ``cls`` from JSON data, naming the first bad field in the error."""
    if not isinstance(data, Mapping):
        raise BundleError(f"manifest field {where!r} must be an object", fix="re-export the bundle")
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for spec in dataclasses.fields(cls):  # type: ignore[arg-type]
        if spec.name not in data:
            has_default = (
                spec.default is not dataclasses.MISSING
                or spec.default_factory is not dataclasses.MISSING
            )
            if has_default:
                continue
            raise BundleError(
                f"manifest is missing field '{where}.{spec.name}'", fix="re-export the bundle"
            )
        kwargs[spec.name] = _decode_value(hints[spec.name], data[spec.name], f"{where}.{spec.name}")
    return cls(**kwargs)


def _decode_value(hint: Any, value: object, where: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _decode_value(option, value, where)
            except BundleError as error:
                errors.append(error)
        raise errors[0]
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return decode_record(hint, value, where)
    if origin is tuple:
        item_hint = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise _type_error(where, "a list")
        return tuple(
            _decode_value(item_hint, item, f"{where}[{i}]") for i, item in enumerate(value)
        )
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise _type_error(where, "an object")
        return dict(value)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise _type_error(where, "true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _type_error(where, "an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _type_error(where, "a number")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise _type_error(where, "a string")
        return value
    raise BundleError(f"manifest field {where!r} has an unsupported type", fix="re-export")


def _type_error(where: str, expected: str) -> BundleError:
    return BundleError(f"manifest field {where!r} must be {expected}", fix="re-export the bundle")
