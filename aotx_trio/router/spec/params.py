"""Spec DSL v2 parameters (docs/formats/spec-dsl.md): ``spec.params`` parsed
into :class:`Param` (name, type, required, default, enum-option overrides), every
rule checked (422 ``invalid_params``, ``param`` a path such as
``spec.params[2].default``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aotx_trio.errors import InvalidInput
from aotx_trio.router.spec.types import parse_rule
from aotx_trio.router.spec.values import NAME, TypeRule, check_value, cut, invalid, shown

#: names of the platform's envelope and identity fields: never parameter names
SYSTEM_FIELDS = frozenset({
    "request", "output_targets", "output_id", "put_url", "target", "targets", "model_id",
    "alias", "aliases", "requested_alias", "resolution_chain", "request_id", "result_id",
    "result_ids", "identity", "attestation", "results", "ok", "error", "timing_ms",
    "session_id", "revision_id", "release", "source_commit", "spec", "state", "servable",
    "not_ready", "provenance", "based_on", "inline_b64",
})
_PARAM_KEYS = frozenset({"name", "required", "default", "overrides"})
_MISSING: Any = object()


@dataclass(frozen=True)
class Param:
    name: str
    rule: TypeRule
    required: bool = False
    default: Any = _MISSING
    #: enum option -> {other param: value it sets}
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def has_default(self) -> bool:
        return self.default is not _MISSING


def parse_param(obj: Any, where: str, before: list[Param]) -> Param:
    rule = parse_rule(obj, where, extra=_PARAM_KEYS)
    name = obj.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise invalid(f"{where}.name", "name", f"{where}.name must match [a-z][a-z0-9_]{{0,63}}")
    if name in SYSTEM_FIELDS:
        raise invalid(f"{where}.name", "reserved_name",
                      f"{where}.name: {name} is a system field and cannot be a parameter")
    if any(p.name == name for p in before):
        raise invalid(f"{where}.name", "duplicate_name", f"{where}: param {name} repeats")
    required = obj.get("required", False)
    if not isinstance(required, bool):
        raise invalid(f"{where}.required", "type", f"{where}.required must be a boolean")
    default = obj.get("default", _MISSING)
    if default is not _MISSING:
        if required:
            raise invalid(f"{where}.default", "default",
                          f"{where}: a required param cannot have a default")
        if rule.type == "binary":
            raise invalid(f"{where}.default", "default",
                          f"{where}: a binary param cannot have a default")
        default = _valid_value(rule, default, f"{where}.default", name)
    return Param(name, rule, required, default)


def _valid_value(rule: TypeRule, value: Any, where: str, name: str) -> Any:
    try:
        return check_value(rule, value, name)
    except InvalidInput as exc:
        raise invalid(where, "default",
                      f"{where} breaks its param's rule {exc.fields['rule']}: "
                      f"{exc.message}") from None


def parse_overrides(raw: list[Any], params: list[Param]) -> list[Param]:
    by_name = {p.name: p for p in params}
    owners: dict[str, str] = {}          # target -> the enum param whose options set it
    out: list[Param] = []
    with_overrides = {p.name for i, p in enumerate(params) if "overrides" in raw[i]}
    for i, p in enumerate(params):
        where = f"spec.params[{i}].overrides"
        table = raw[i].get("overrides")
        if table is None:
            out.append(p)
            continue
        if p.rule.type != "string" or p.rule.enum is None:
            raise invalid(where, "overrides", f"{where}: only a string enum has overrides")
        if not isinstance(table, dict):
            raise invalid(where, "type", f"{where} must be an object")
        parsed: dict[str, dict[str, Any]] = {}
        for option, sets in table.items():
            at = f"{where}.{cut(str(option))}"
            if option not in p.rule.enum:
                raise invalid(at, "enum", f"{at}: {shown(option)} is not an option of {p.name}")
            if not isinstance(sets, dict) or not sets:
                raise invalid(at, "type", f"{at} must be a non-empty object")
            parsed[option] = {}
            for target, value in sets.items():
                tat = f"{at}.{cut(str(target))}"
                other = by_name.get(target)
                if other is None:
                    raise invalid(tat, "undeclared", f"{tat} must name a declared param")
                if target == p.name or target in with_overrides:
                    raise invalid(tat, "overrides",
                                  f"{tat}: an option cannot set an enum param with options")
                if other.required or other.rule.type == "binary":
                    raise invalid(tat, "overrides",
                                  f"{tat}: an option cannot set a required or binary param")
                if owners.setdefault(target, p.name) != p.name:
                    raise invalid(tat, "overrides",
                                  f"{tat}: {target} is already set by {owners[target]}'s "
                                  "options")
                try:
                    parsed[option][target] = check_value(other.rule, value, target)
                except InvalidInput as exc:
                    raise invalid(tat, "override",
                                  f"{tat} breaks {target}'s rule {exc.fields['rule']}: "
                                  f"{exc.message}") from None
        out.append(Param(p.name, p.rule, p.required, p.default, parsed))
    return out
