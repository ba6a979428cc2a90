"""Spec DSL v2 types (docs/formats/spec-dsl.md): a spec fragment declaring a
type (``{"type": "integer", "minimum": 1}``) parsed into a
:class:`~aotx_trio.router.spec.values.TypeRule`, every key checked (422
``invalid_params``, ``param`` the fragment's path such as
``spec.params[2].maximum``)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from aotx_trio.errors import InvalidInput
from aotx_trio.router.spec.values import (
    MAX_BINARY_BYTES,
    NAME,
    TYPES,
    FieldRule,
    TypeRule,
    check_value,
    cut,
    invalid,
    is_number,
    shown,
    type_of,
)

MAX_DEPTH = 4            # list/object nesting of one parameter
MAX_FIELDS = 64          # fields of one object type
MAX_ENUM = 256

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
            raise invalid(f"{path}.{cut(str(key))}", "unknown_key",
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
        rule = replace(rule, items=parse_rule(obj["items"], f"{path}.items", depth + 1))
    if kind == "object":
        rule = replace(rule, fields=_parse_fields(obj.get("fields"), f"{path}.fields", depth))
    return rule


def _parse_bounds(obj: dict[str, Any], path: str, rule: TypeRule) -> TypeRule:
    found: dict[str, Any] = {}
    for key in _BOUNDS:
        if key not in obj:
            continue
        value = obj[key]
        ok = (isinstance(value, int) and not isinstance(value, bool)) if rule.type == "integer" \
            else (is_number(value) and (not isinstance(value, float) or math.isfinite(value)))
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
    return replace(rule, **found)


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
    return replace(rule, min_count=lo, max_count=hi)


def _parse_enum(values: Any, path: str, rule: TypeRule) -> TypeRule:
    if not isinstance(values, list) or not values or len(values) > MAX_ENUM:
        raise invalid(path, "type", f"{path} must be a list of 1 to {MAX_ENUM} values")
    seen: list[Any] = []
    for i, value in enumerate(values):
        try:
            check_value(replace(rule, enum=None), value, f"{path}[{i}]")
        except InvalidInput as exc:
            raise invalid(f"{path}[{i}]", "enum",
                          f"{path}[{i}] does not satisfy its own type: {exc.message}") from None
        if any(type_of(v) == type_of(value) and v == value for v in seen):
            raise invalid(f"{path}[{i}]", "duplicate", f"{path}[{i}] repeats a value")
        seen.append(value)
    return replace(rule, enum=tuple(values))


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


