"""Spec DSL v2 value types (docs/formats/spec-dsl.md): one :class:`TypeRule` per
declared type, parsed from a spec document, and :func:`check_value`, which checks
one request value against it and returns the value the effective request holds.

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
SCALARS = ("string", "integer", "number", "boolean")
NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")
MAX_DEPTH = 4            # list/object nesting of one parameter
MAX_FIELDS = 64          # fields of one object type
MAX_ENUM = 256
MAX_BINARY_BYTES = 64 << 20
SHOWN = 80               # characters of caller input a message may quote
_B64 = re.compile(r"[A-Za-z0-9+/]*={0,2}\Z")

#: keys a rule of each type may carry (besides ``type`` and ``description``)
TYPE_KEYS: dict[str, frozenset[str]] = {
    "string": frozenset({"enum", "min_length", "max_length"}),
    "integer": frozenset({"enum", "minimum", "maximum", "exclusive_minimum",
                          "exclusive_maximum"}),
    "number": frozenset({"enum", "minimum", "maximum", "exclusive_minimum",
                         "exclusive_maximum"}),
    "boolean": frozenset(),
    "list": frozenset({"items", "min_items", "max_items"}),
    "object": frozenset({"fields"}),
    "binary": frozenset({"min_bytes", "max_bytes"}),
}
_BOUNDS = ("minimum", "maximum", "exclusive_minimum", "exclusive_maximum")
_COUNTS = {"string": ("min_length", "max_length"), "list": ("min_items", "max_items"),
           "binary": ("min_bytes", "max_bytes")}


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


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# --------------------------------------------------------------------------- parsing


def parse_rule(obj: Any, path: str, depth: int = 0, *, extra: frozenset[str] = frozenset(),
               ) -> TypeRule:
    """A rule from a spec fragment at ``path`` (``spec.params[2]``); ``extra`` are keys the
    caller handles itself (``name``, ``required``, ``default``...)."""
    if not isinstance(obj, dict):
        raise invalid(path, "type", f"{path} must be an object")
    kind = obj.get("type")
    if kind not in TYPES:
        raise invalid(f"{path}.type", "type",
                      f"{path}.type must be one of {', '.join(TYPES)}, not {shown(kind)}")
    allowed = TYPE_KEYS[kind] | extra | {"type", "description"}
    for key in obj:
        if key not in allowed:
            raise invalid(f"{path}.{_key(str(key))}", "unknown_key",
                          f"{path}: key {shown(key)} is not allowed for type {kind}")
    desc = obj.get("description")
    if desc is not None and not (isinstance(desc, str) and len(desc) <= 2000):
        raise invalid(f"{path}.description", "type",
                      f"{path}.description must be a string of at most 2000 characters")
    if depth > MAX_DEPTH:
        raise invalid(path, "depth", f"{path}: types nest at most {MAX_DEPTH} levels")
    rule = TypeRule(type=kind)
    if kind in ("integer", "number"):
        rule = _parse_bounds(obj, path, rule)
    if kind in _COUNTS:
        rule = _parse_counts(obj, path, rule)
    if "enum" in obj:
        rule = _parse_enum(obj["enum"], f"{path}.enum", rule)
    if kind == "list":
        if "items" not in obj:
            raise invalid(f"{path}.items", "required", f"{path}: a list type needs items")
        rule = _replace(rule, items=parse_rule(obj["items"], f"{path}.items", depth + 1))
    if kind == "object":
        rule = _replace(rule, fields=_parse_fields(obj.get("fields"), f"{path}.fields", depth))
    return rule


def _replace(rule: TypeRule, **changes: Any) -> TypeRule:
    values = {k: getattr(rule, k) for k in TypeRule.__dataclass_fields__}
    values.update(changes)
    return TypeRule(**values)


def _parse_bounds(obj: dict[str, Any], path: str, rule: TypeRule) -> TypeRule:
    found: dict[str, int | float] = {}
    for key in _BOUNDS:
        if key not in obj:
            continue
        value = obj[key]
        ok = (isinstance(value, int) and not isinstance(value, bool)) if rule.type == "integer" \
            else (_is_number(value) and math.isfinite(value))
        if not ok:
            raise invalid(f"{path}.{key}", "type",
                          f"{path}.{key} must be a finite {rule.type}")
        found[key] = value
    if "minimum" in found and "exclusive_minimum" in found:
        raise invalid(f"{path}.exclusive_minimum", "bounds",
                      f"{path}: minimum and exclusive_minimum exclude each other")
    if "maximum" in found and "exclusive_maximum" in found:
        raise invalid(f"{path}.exclusive_maximum", "bounds",
                      f"{path}: maximum and exclusive_maximum exclude each other")
    low = found.get("minimum", found.get("exclusive_minimum"))
    high = found.get("maximum", found.get("exclusive_maximum"))
    strict = "exclusive_minimum" in found or "exclusive_maximum" in found
    if low is not None and high is not None and (low > high or (strict and low >= high)):
        raise invalid(f"{path}.maximum", "bounds", f"{path}: the range is empty")
    return _replace(rule, **found)


def _parse_counts(obj: dict[str, Any], path: str, rule: TypeRule) -> TypeRule:
    lo_key, hi_key = _COUNTS[rule.type]
    cap = MAX_BINARY_BYTES if rule.type == "binary" else 1 << 24
    counts: list[int | None] = []
    for key in (lo_key, hi_key):
        value = obj.get(key)
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool)
                                      and 0 <= value <= cap):
            raise invalid(f"{path}.{key}", "type",
                          f"{path}.{key} must be an integer from 0 to {cap}")
        counts.append(value)
    lo, hi = counts
    if lo is not None and hi is not None and lo > hi:
        raise invalid(f"{path}.{hi_key}", "bounds", f"{path}: {lo_key} exceeds {hi_key}")
    if rule.type == "binary" and hi is None:
        hi = MAX_BINARY_BYTES
    return _replace(rule, min_count=lo, max_count=hi)


def _parse_enum(values: Any, path: str, rule: TypeRule) -> TypeRule:
    if not isinstance(values, list) or not values or len(values) > MAX_ENUM:
        raise invalid(path, "type", f"{path} must be a list of 1 to {MAX_ENUM} values")
    seen: list[Any] = []
    for i, value in enumerate(values):
        try:
            check_value(_replace(rule, enum=None), value, f"{path}[{i}]")
        except InvalidInput as exc:
            raise invalid(f"{path}[{i}]", "enum",
                          f"{path}[{i}] does not satisfy its own type: {exc.message}") from None
        if any(type_of(v) == type_of(value) and v == value for v in seen):
            raise invalid(f"{path}[{i}]", "duplicate", f"{path}[{i}] repeats a value")
        seen.append(value)
    return _replace(rule, enum=tuple(values))


def _parse_fields(fields: Any, path: str, depth: int) -> tuple[FieldRule, ...]:
    if not isinstance(fields, list) or len(fields) > MAX_FIELDS:
        raise invalid(path, "type", f"{path} must be a list of at most {MAX_FIELDS} fields")
    out: list[FieldRule] = []
    for i, field in enumerate(fields):
        where = f"{path}[{i}]"
        rule = parse_rule(field, where, depth + 1, extra=frozenset({"name", "required"}))
        name = field.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise invalid(f"{where}.name", "name",
                          f"{where}.name must match [a-z][a-z0-9_]{{0,63}}")
        if any(f.name == name for f in out):
            raise invalid(f"{where}.name", "duplicate_name", f"{where}: field {name} repeats")
        required = field.get("required", False)
        if not isinstance(required, bool):
            raise invalid(f"{where}.required", "type", f"{where}.required must be a boolean")
        out.append(FieldRule(name, rule, required))
    return tuple(out)


# --------------------------------------------------------------------------- values


def check_value(rule: TypeRule, value: Any, path: str, *, decode: bool = True) -> Any:
    """``value`` checked against ``rule``; returns it as the effective request holds it (a
    fresh copy; binary decoded to bytes when ``decode``)."""
    kind = rule.type
    if kind == "binary":
        return _check_binary(rule, value, path, decode)
    got = type_of(value)
    if got != kind and not (kind == "number" and got == "integer"):
        raise invalid(path, "type", f"{path} must be {_article(kind)}, not {got}")
    if kind == "number" and not math.isfinite(value):
        raise invalid(path, "finite", f"{path} must be a finite number")
    if rule.enum is not None and not any((type_of(e) == got and e == value) or
                                         (kind == "number" and _is_number(e) and e == value)
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
            raise invalid(f"{path}.{_key(key)}", "unknown",
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


def _key(key: str) -> str:
    """A caller's key for a ``param`` path: cut to :data:`SHOWN` characters."""
    return key if len(key) <= SHOWN else key[:SHOWN - 3] + "..."


def _check_binary(rule: TypeRule, value: Any, path: str, decode: bool) -> Any:
    if not isinstance(value, dict) or list(value) != ["inline_b64"]:
        raise invalid(path, "binary", f'{path} must be {{"inline_b64": "<base64>"}}')
    text = value["inline_b64"]
    where = f"{path}.inline_b64"
    if not isinstance(text, str):
        raise invalid(where, "type", f"{where} must be a string")
    hi = rule.max_count if rule.max_count is not None else MAX_BINARY_BYTES
    if len(text) > 4 * ((hi + 2) // 3):
        raise invalid(path, "max_bytes", f"{path} must hold at most {hi} bytes")
    if len(text) % 4 or not _B64.match(text):
        raise invalid(where, "base64", f"{where} is not padded standard base64")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(where, "base64", f"{where} is not padded standard base64") from None
    _check_count(rule, len(data), path, "bytes", "bytes")
    return data if decode else {"inline_b64": text}
