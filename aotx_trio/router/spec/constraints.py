"""Spec DSL v2 cross-field constraints (docs/formats/spec-dsl.md): parsed from
``spec.constraints`` and checked on the effective request (after defaults and
enum-option overrides), in the order the spec lists them."""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aotx_trio.router.spec.values import invalid

GROUP_RULES = ("exactly_one", "at_most_one", "at_least_one")
LINK_RULES = ("requires", "forbids")
OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}
MAX_CONSTRAINTS = 64


@dataclass(frozen=True)
class Constraint:
    rule: str
    params: tuple[str, ...]     # group: the members; link: the linked params
    param: str | None = None    # link: the param whose presence triggers it; compare: left
    op: str | None = None
    right: str | None = None

    def check(self, effective: Mapping[str, Any]) -> None:
        if self.rule in GROUP_RULES:
            present = [p for p in self.params if p in effective]
            n = len(present)
            bad = ((self.rule == "exactly_one" and n != 1)
                   or (self.rule == "at_most_one" and n > 1)
                   or (self.rule == "at_least_one" and n < 1))
            if bad:
                names = ", ".join(self.params)
                need = {"exactly_one": "exactly one", "at_most_one": "at most one",
                        "at_least_one": "at least one"}[self.rule]
                raise invalid(",".join(present if n > 1 else self.params), self.rule,
                              f"give {need} of {names} ({n} given)")
            return
        assert self.param is not None
        if self.rule in LINK_RULES:
            if self.param not in effective:
                return
            for other in self.params:
                if (other in effective) != (self.rule == "requires"):
                    verb = "requires" if self.rule == "requires" else "excludes"
                    raise invalid(self.param, self.rule, f"{self.param} {verb} {other}",
                                  other=other)
            return
        assert self.op is not None and self.right is not None
        if self.param in effective and self.right in effective:
            if not OPS[self.op](effective[self.param], effective[self.right]):
                raise invalid(self.param, "compare",
                              f"{self.param} must be {self.op} {self.right}",
                              other=self.right)


def parse_constraints(value: Any, types: Mapping[str, str]) -> tuple[Constraint, ...]:
    """``spec.constraints``; ``types`` maps each declared param to its type."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > MAX_CONSTRAINTS:
        raise invalid("spec.constraints", "type",
                      f"spec.constraints must be a list of at most {MAX_CONSTRAINTS}")
    return tuple(_parse_one(c, f"spec.constraints[{i}]", types) for i, c in enumerate(value))


def _names(value: Any, where: str, types: Mapping[str, str], least: int) -> tuple[str, ...]:
    if (not isinstance(value, list) or len(value) < least
            or not all(isinstance(v, str) for v in value)):
        raise invalid(where, "type", f"{where} must be a list of at least {least} param names")
    if len(set(value)) != len(value):
        raise invalid(where, "duplicate", f"{where} names a param twice")
    for i, name in enumerate(value):
        _declared(name, f"{where}[{i}]", types)
    return tuple(value)


def _declared(name: Any, where: str, types: Mapping[str, str]) -> str:
    if not isinstance(name, str) or name not in types:
        raise invalid(where, "undeclared", f"{where} must name a declared param")
    return name


def _parse_one(obj: Any, where: str, types: Mapping[str, str]) -> Constraint:
    if not isinstance(obj, dict):
        raise invalid(where, "type", f"{where} must be an object")
    rule = obj.get("rule")
    keys = {"rule", "description"}
    if rule in GROUP_RULES:
        keys |= {"params"}
        made = Constraint(rule, _names(obj.get("params"), f"{where}.params", types, 2))
    elif rule in LINK_RULES:
        keys |= {"param", "params"}
        param = _declared(obj.get("param"), f"{where}.param", types)
        others = _names(obj.get("params"), f"{where}.params", types, 1)
        if param in others:
            raise invalid(f"{where}.params", "self", f"{where} links {param} to itself")
        made = Constraint(rule, others, param=param)
    elif rule == "compare":
        keys |= {"left", "op", "right"}
        left = _declared(obj.get("left"), f"{where}.left", types)
        right = _declared(obj.get("right"), f"{where}.right", types)
        op = obj.get("op")
        if op not in OPS:
            raise invalid(f"{where}.op", "enum", f"{where}.op must be one of {', '.join(OPS)}")
        if left == right:
            raise invalid(f"{where}.right", "self", f"{where} compares {left} with itself")
        for side, name in (("left", left), ("right", right)):
            if types[name] not in ("integer", "number"):
                raise invalid(f"{where}.{side}", "type",
                              f"{where}.{side} must name an integer or number param")
        made = Constraint("compare", (), param=left, op=op, right=right)
    else:
        raise invalid(f"{where}.rule", "enum", f"{where}.rule must be one of "
                      f"{', '.join((*GROUP_RULES, *LINK_RULES, 'compare'))}")
    for key in obj:
        if key not in keys:
            raise invalid(f"{where}.{str(key)[:80]}", "unknown_key",
                          f"{where}: key {key[:80]!r} is not allowed for rule {rule}")
    return made
