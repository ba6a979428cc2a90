"""Spec DSL v2 (docs/formats/spec-dsl.md): a model's contract, parsed once
(:func:`parse_spec`), then applied to each invoke (:meth:`Spec.effective`).

The effective request is built in a fixed order (the precedence):

1. a value the caller gave explicitly (checked against its param's rules);
2. else the value an enum option sets (``overrides`` of the chosen option, the
   option being the caller's or the enum param's default);
3. else the param's ``default``;
4. else the param is absent.

Then the cross-field constraints are checked on the effective request. Pure and
deterministic: the same spec and request always give the same effective request
or the same error (422 ``invalid_params`` with ``param`` and ``rule``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from aotx_trio.errors import InvalidInput
from aotx_trio.router.spec_constraints import Constraint, parse_constraints
from aotx_trio.router.spec_results import Results, parse_results
from aotx_trio.router.spec_types import NAME, TypeRule, check_value, invalid, parse_rule, shown

MAX_PARAMS = 128
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


@dataclass(frozen=True)
class Spec:
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...]
    results: Results
    interaction: str = "request_response"

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    def effective(self, request: Any, *, decode_binary: bool = True) -> dict[str, Any]:
        """The effective request for ``request`` (the envelope's ``request`` object), in
        spec order; binary params decoded to bytes when ``decode_binary``."""
        if not isinstance(request, dict):
            raise invalid("request", "type", "request must be an object")
        names = {p.name for p in self.params}
        for key in request:
            if key in names:
                continue
            if key in SYSTEM_FIELDS:
                raise invalid(str(key), "system_field",
                              f"{key} is a system field: it belongs in the envelope, "
                              "not in request")
            raise invalid(_cut(str(key)), "unknown",
                          f"request has a parameter the spec does not declare: {shown(key)}")
        given: dict[str, Any] = {}
        for p in self.params:
            if p.name in request:
                given[p.name] = check_value(p.rule, request[p.name], p.name,
                                            decode=decode_binary)
            elif p.required:
                raise invalid(p.name, "required", f"{p.name} is required")
        out = dict(given)
        for p in self.params:          # 2: the chosen options' overrides
            chosen = given.get(p.name, p.default)
            if isinstance(chosen, str):
                for target, value in p.overrides.get(chosen, {}).items():
                    out.setdefault(target, value)
        for p in self.params:          # 3: defaults
            if p.has_default:
                out.setdefault(p.name, p.default)
        for c in self.constraints:
            c.check(out)
        return {p.name: _copy(out[p.name]) for p in self.params if p.name in out}

    def result_count(self, effective: dict[str, Any]) -> int:
        """How many results (and upload targets) an effective request asks for."""
        per_item = self.results.per_item
        return len(effective[per_item]) if per_item is not None else 1

    def wire_results(self, results: list[dict[str, Any]],
                     output_ids: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """See :meth:`Results.wire`."""
        return self.results.wire(results, output_ids)


def _cut(text: str) -> str:
    return text if len(text) <= 80 else text[:77] + "..."


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def parse_spec(obj: Any) -> Spec:
    """A spec document, checked whole (422 ``invalid_params``, ``param`` a path such as
    ``spec.params[2].default``)."""
    if not isinstance(obj, dict):
        raise invalid("spec", "type", "serving.spec must be an object")
    if obj.get("spec_dsl") != 2:
        raise invalid("spec.spec_dsl", "enum", "serving.spec.spec_dsl must be 2")
    for key in obj:
        if key not in ("spec_dsl", "interaction", "description", "params", "constraints",
                       "results"):
            raise invalid(f"spec.{_cut(str(key))}", "unknown_key",
                          f"serving.spec: key {shown(key)} is not allowed")
    interaction = obj.get("interaction", "request_response")
    if interaction != "request_response":
        raise invalid("spec.interaction", "enum",
                      "serving.spec.interaction must be request_response")
    raw = obj.get("params", [])
    if not isinstance(raw, list) or len(raw) > MAX_PARAMS:
        raise invalid("spec.params", "type",
                      f"serving.spec.params must be a list of at most {MAX_PARAMS}")
    params: list[Param] = []
    for i, item in enumerate(raw):
        params.append(_parse_param(item, f"spec.params[{i}]", params))
    params = _parse_overrides(raw, params)
    types = {p.name: p.rule.type for p in params}
    constraints = parse_constraints(obj.get("constraints"), types)
    lists = [p.name for p in params if p.rule.type == "list" and p.required]
    results = parse_results(obj.get("results"), lists)
    return Spec(tuple(params), constraints, results, interaction)


def _parse_param(obj: Any, where: str, before: list[Param]) -> Param:
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


def _parse_overrides(raw: list[Any], params: list[Param]) -> list[Param]:
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
            at = f"{where}.{_cut(str(option))}"
            if option not in p.rule.enum:
                raise invalid(at, "enum", f"{at}: {shown(option)} is not an option of {p.name}")
            if not isinstance(sets, dict) or not sets:
                raise invalid(at, "type", f"{at} must be a non-empty object")
            parsed[option] = {}
            for target, value in sets.items():
                tat = f"{at}.{_cut(str(target))}"
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
