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
from dataclasses import dataclass
from typing import Any

from aotx_trio.router.spec.constraints import Constraint, parse_constraints
from aotx_trio.router.spec.params import SYSTEM_FIELDS, Param, parse_overrides, parse_param
from aotx_trio.router.spec.results import Results, parse_results
from aotx_trio.router.spec.values import check_value, cut, invalid, shown

MAX_PARAMS = 128
#: the invoke body's fields
ENVELOPE_FIELDS = ("request", "output_targets")
__all__ = ["ENVELOPE_FIELDS", "SYSTEM_FIELDS", "Param", "Spec", "parse_spec", "split_envelope"]


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
            raise invalid(cut(str(key)), "unknown",
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

    def delivery(self, output_targets: Any) -> str:
        """``"upload"`` when the envelope has ``output_targets``, else ``"inline"``; 422
        ``invalid_params`` (``param`` ``output_targets``) when the spec does not offer it."""
        if output_targets is None:
            if "inline" not in self.results.delivery:
                raise invalid("output_targets", "required",
                              "this model delivers results by upload only: give output_targets")
            return "inline"
        if "upload" not in self.results.delivery:
            raise invalid("output_targets", "delivery",
                          "this model does not deliver results by upload")
        return "upload"

    def result_count(self, effective: dict[str, Any]) -> int:
        """How many results (and upload targets) an effective request asks for."""
        per_item = self.results.per_item
        return len(effective[per_item]) if per_item is not None else 1

    def wire_results(self, results: list[dict[str, Any]],
                     output_ids: Sequence[str] | None = None,
                     effective: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The results in HTTP JSON (see :meth:`Results.wire`); with ``effective``, also
        checks there are :meth:`result_count` of them."""
        expected = None if effective is None else self.result_count(effective)
        return self.results.wire(results, output_ids, expected)


def _copy(value: Any) -> Any:
    if isinstance(value, list):
        return [_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return value


def split_envelope(body: Any) -> tuple[dict[str, Any], Any]:
    """An invoke body's ``request`` object and ``output_targets`` (None when absent):
    the envelope holds nothing else (422 ``invalid_params``)."""
    if not isinstance(body, dict):
        raise invalid("body", "type", "the invoke body must be a JSON object")
    for key in body:
        if key not in ENVELOPE_FIELDS:
            raise invalid(cut(str(key)), "unknown",
                          f"the invoke body has a field it does not define: {shown(key)} "
                          "(model parameters go inside request)")
    if "request" not in body:
        raise invalid("request", "required", "the invoke body needs a request object")
    request = body["request"]
    if not isinstance(request, dict):
        raise invalid("request", "type", "request must be an object")
    return request, body.get("output_targets")


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
            raise invalid(f"spec.{cut(str(key))}", "unknown_key",
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
        params.append(parse_param(item, f"spec.params[{i}]", params))
    params = parse_overrides(raw, params)
    types = {p.name: p.rule.type for p in params}
    constraints = parse_constraints(obj.get("constraints"), types)
    lists = [p.name for p in params if p.rule.type == "list" and p.required]
    results = parse_results(obj.get("results"), lists)
    return Spec(tuple(params), constraints, results, interaction)
