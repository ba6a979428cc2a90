"""Spec DSL v2 values (docs/formats/spec-dsl.md): the parsed form of a type
(:class:`TypeRule`) and :func:`check_value`, which checks one request value
against it and returns the value the effective request holds.

Pure and deterministic; every violation is 422 ``invalid_params`` with ``param``
(a path such as ``messages[1].role``) and ``rule`` (a short rule name).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from dataclasses import dataclass
from typing import Any

from aotx_trio.errors import InvalidInput

TYPES = ("string", "integer", "number", "boolean", "list", "object", "binary")
NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
MAX_BINARY_BYTES = 64 << 20
SHOWN = 80               # characters of caller input a message may quote
_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}\Z")


def shown(value: Any) -> str:
    """``value`` for a message: its repr cut to :data:`SHOWN` characters."""
    text = repr(value)
    if len(text) > SHOWN:
        text = text[:SHOWN - 3] + "..."
    return text


def invalid(param: str, rule: str, message: str, **fields: Any) -> InvalidInput:
    return InvalidInput(message, code="invalid_params", param=param, rule=rule, **fields)


@dataclass(frozen=True)
class FieldRule:
    """One field of an ``object`` type."""

    name: str
    rule: TypeRule
    required: bool


@dataclass(frozen=True)
class TypeRule:
    type: str
    enum: tuple[Any, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: int | float | None = None
    exclusive_maximum: int | float | None = None
    min_count: int | None = None     # min_length / min_items / min_bytes
    max_count: int | None = None     # max_length / max_items / max_bytes
    items: TypeRule | None = None
    fields: tuple[FieldRule, ...] = ()


def type_of(value: Any) -> str:
    """The DSL type name a JSON value has (``null`` for None)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_value(rule: TypeRule, value: Any, path: str, *, decode: bool = True) -> Any:
    """``value`` checked against ``rule``; returns it as the effective request holds it (a
    fresh copy; binary decoded to bytes when ``decode``)."""
    kind = rule.type
    if kind == "binary":
        return _check_binary(rule, value, path, decode)
    got = type_of(value)
    if got != kind and not (kind == "number" and got == "integer"):
        raise invalid(path, "type", f"{path} must be {_article(kind)}, not {got}")
    if kind == "number" and isinstance(value, float) and not math.isfinite(value):
        raise invalid(path, "finite", f"{path} must be a finite number")
    if rule.enum is not None and not any((type_of(e) == got and e == value) or
                                         (kind == "number" and is_number(e) and e == value)
                                         for e in rule.enum):
        raise invalid(path, "enum", f"{path} must be one of {shown(list(rule.enum))}, "
                                    f"not {shown(value)}")
    if kind in ("integer", "number"):
        _check_bounds(rule, value, path)
        return value
    if kind == "string":
        _check_count(rule, len(value), path, "length", "characters")
        return value
    if kind == "list":
        _check_count(rule, len(value), path, "items", "items")
        assert rule.items is not None
        return [check_value(rule.items, item, f"{path}[{i}]", decode=decode)
                for i, item in enumerate(value)]
    if kind == "object":
        return _check_object(rule, value, path, decode)
    return value


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _check_bounds(rule: TypeRule, value: int | float, path: str) -> None:
    if rule.minimum is not None and value < rule.minimum:
        raise invalid(path, "minimum", f"{path} must be at least {rule.minimum}")
    if rule.exclusive_minimum is not None and value <= rule.exclusive_minimum:
        raise invalid(path, "exclusive_minimum",
                      f"{path} must be greater than {rule.exclusive_minimum}")
    if rule.maximum is not None and value > rule.maximum:
        raise invalid(path, "maximum", f"{path} must be at most {rule.maximum}")
    if rule.exclusive_maximum is not None and value >= rule.exclusive_maximum:
        raise invalid(path, "exclusive_maximum",
                      f"{path} must be less than {rule.exclusive_maximum}")


def _check_count(rule: TypeRule, count: int, path: str, what: str, unit: str) -> None:
    if rule.min_count is not None and count < rule.min_count:
        raise invalid(path, f"min_{what}", f"{path} must have at least {rule.min_count} {unit}")
    if rule.max_count is not None and count > rule.max_count:
        raise invalid(path, f"max_{what}", f"{path} must have at most {rule.max_count} {unit}")


def _check_object(rule: TypeRule, value: dict[str, Any], path: str, decode: bool,
                  ) -> dict[str, Any]:
    names = {f.name for f in rule.fields}
    for key in value:
        if key not in names:
            raise invalid(f"{path}.{cut(key)}", "unknown",
                          f"{path} has no field {shown(key)}")
    out: dict[str, Any] = {}
    for field in rule.fields:
        if field.name in value:
            out[field.name] = check_value(field.rule, value[field.name],
                                          f"{path}.{field.name}", decode=decode)
        elif field.required:
            raise invalid(f"{path}.{field.name}", "required",
                          f"{path}.{field.name} is required")
    return out


def cut(key: str) -> str:
    """A caller's key (for a ``param`` path) cut to :data:`SHOWN` characters."""
    return key if len(key) <= SHOWN else key[:SHOWN - 3] + "..."


def _check_binary(rule: TypeRule, value: Any, path: str, decode: bool) -> Any:
    if not isinstance(value, dict) or list(value) != ["inline_b64"]:
        raise invalid(path, "binary", f'{path} must be {{"inline_b64": "<base64>"}}')
    text = value["inline_b64"]
    where = f"{path}.inline_b64"
    if not isinstance(text, str):
        raise invalid(where, "type", f"{where} must be a string")
    hi = rule.max_count if rule.max_count is not None else MAX_BINARY_BYTES
    if len(text) % 4:   # never base64, whatever its length: the base64 rule names it
        raise invalid(where, "base64", f"{where} is not padded standard base64")
    if len(text) > 4 * ((hi + 2) // 3):   # before decoding: no work for an oversized text
        raise invalid(path, "max_bytes", f"{path} must hold at most {hi} bytes")
    if not _B64.match(text):
        raise invalid(where, "base64", f"{where} is not padded standard base64")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(where, "base64", f"{where} is not padded standard base64") from None
    _check_count(rule, len(data), path, "bytes", "bytes")
    return data if decode else {"inline_b64": text}
