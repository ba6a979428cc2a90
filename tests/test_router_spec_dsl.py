"""Spec DSL v2 (aotx_trio/router/spec_dsl.py and spec_*.py): the default specs,
the effective request (defaults, enum-option overrides, precedence), every
value rule, cross-field constraints, spec refusals, the result wire rule, and
property tests that generate specs and requests."""

from __future__ import annotations

import base64
import json
import math
import struct
from typing import Any

import pytest

from aotx_trio.errors import InvalidInput, UpstreamFailure
from aotx_trio.router.records import check_spec
from aotx_trio.router.spec_dsl import SYSTEM_FIELDS, Spec, parse_spec
from aotx_trio.router.specs import NAMES, default_spec


def spec(*params: dict[str, Any], constraints: list[Any] | None = None,
         results: dict[str, Any] | None = None) -> Spec:
    doc: dict[str, Any] = {"spec_dsl": 2, "interaction": "request_response",
                           "params": list(params)}
    if constraints is not None:
        doc["constraints"] = constraints
    if results is not None:
        doc["results"] = results
    return parse_spec(doc)


def refused(s: Spec, request: Any) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as exc:
        s.effective(request)
    assert exc.value.code == "invalid_params" and exc.value.status == 422
    return exc.value.fields["param"], exc.value.fields["rule"]


def spec_refused(doc: Any) -> tuple[str, str]:
    with pytest.raises(InvalidInput) as exc:
        parse_spec(doc)
    assert exc.value.code == "invalid_params"
    return exc.value.fields["param"], exc.value.fields["rule"]


# --------------------------------------------------------------------------- default specs

def test_the_default_specs_parse_and_install_as_package_data() -> None:
    for name in NAMES:
        doc = default_spec(name)
        assert check_spec(doc) is doc
        parse_spec(json.loads(json.dumps(doc)))
    with pytest.raises(KeyError):
        default_spec("nope")


def test_textgen_spec() -> None:
    t = parse_spec(default_spec("textgen"))
    assert t.effective({"prompt": "Hi"}) == {
        "prompt": "Hi", "max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "seed": 0}
    msgs = [{"role": "user", "content": "Hi"}]
    # the chosen option sets temperature and top_p, the explicit top_p wins
    assert t.effective({"messages": msgs, "sampling": "creative", "top_p": 0.5}) == {
        "messages": msgs, "max_tokens": 128, "sampling": "creative", "temperature": 1.0,
        "top_p": 0.5, "seed": 0}
    assert refused(t, {"prompt": "a", "messages": msgs}) == ("prompt,messages", "exactly_one")
    assert refused(t, {}) == ("prompt,messages", "exactly_one")
    assert refused(t, {"prompt": ""}) == ("prompt", "min_length")
    assert refused(t, {"prompt": "a", "max_tokens": 0}) == ("max_tokens", "minimum")
    assert refused(t, {"prompt": "a", "max_tokens": 1.5}) == ("max_tokens", "type")
    assert refused(t, {"prompt": "a", "top_p": 0}) == ("top_p", "exclusive_minimum")
    assert refused(t, {"prompt": "a", "temperature": math.nan}) == ("temperature", "finite")
    assert refused(t, {"prompt": "a", "stop": ["a"] * 5}) == ("stop", "max_items")
    assert refused(t, {"prompt": "a", "stop": ["ok", ""]}) == ("stop[1]", "min_length")
    assert refused(t, {"messages": [msgs[0], {"role": "bot", "content": "x"}]}) == (
        "messages[1].role", "enum")
    assert refused(t, {"messages": [{"role": "user"}]}) == ("messages[0].content", "required")
    assert refused(t, {"messages": [{"role": "user", "content": "x", "name": "n"}]}) == (
        "messages[0].name", "unknown")
    assert refused(t, {"prompt": "a", "sampling": "wild"}) == ("sampling", "enum")
    assert refused(t, {"prompt": "a", "top_k": 3}) == ("top_k", "unknown")
    assert refused(t, {"prompt": "a", "output_targets": []}) == ("output_targets",
                                                                  "system_field")
    assert refused(t, ["prompt"]) == ("request", "type")


def test_embedding_spec_and_its_wire_rule() -> None:
    e = parse_spec(default_spec("embedding"))
    eff = e.effective({"texts": ["a", "b"]})
    assert eff == {"texts": ["a", "b"]} and e.result_count(eff) == 2
    assert e.results.delivery == ("inline", "upload") and e.results.per_item == "texts"
    assert refused(e, {"texts": []}) == ("texts", "min_items")
    assert refused(e, {"texts": ["x"] * 65}) == ("texts", "max_items")
    assert refused(e, {"texts": ["x", 3]}) == ("texts[1]", "type")
    assert refused(e, {}) == ("texts", "required")
    vec = struct.pack("<3f", 1.0, 2.0, 3.0)
    results = [{"embedding": vec, "dimension": 3}, {"embedding": vec, "dimension": 3}]
    b64 = base64.b64encode(vec).decode()
    assert e.wire_results(results) == [{"embedding_b64": b64, "dimension": 3}] * 2
    assert e.wire_results(results, ["one", "two"]) == [
        {"output_id": "one", "dimension": 3}, {"output_id": "two", "dimension": 3}]
    assert e.results.upload_bodies(results) == [vec, vec]
    for broken in ([{"embedding": vec}], [{"embedding": vec, "dimension": 3, "id": "x"}],
                   [{"embedding": "text", "dimension": 3}], "nope"):
        with pytest.raises(UpstreamFailure) as exc:
            e.wire_results(broken)  # type: ignore[arg-type]
        assert exc.value.code == "upstream_failure" and exc.value.status == 502


# --------------------------------------------------------------------------- value rules

def test_binary_params_decode_inline_b64() -> None:
    s = spec({"name": "audio", "type": "binary", "required": True, "min_bytes": 1,
              "max_bytes": 6})
    assert s.effective({"audio": {"inline_b64": "AAEC"}}) == {"audio": b"\x00\x01\x02"}
    assert s.effective({"audio": {"inline_b64": "AAEC"}}, decode_binary=False) == {
        "audio": {"inline_b64": "AAEC"}}
    assert refused(s, {"audio": "AAEC"}) == ("audio", "binary")
    assert refused(s, {"audio": {"inline_b64": "AAEC", "x": 1}}) == ("audio", "binary")
    assert refused(s, {"audio": {"inline_b64": "AAE"}}) == ("audio.inline_b64", "base64")
    assert refused(s, {"audio": {"inline_b64": "A-EC"}}) == ("audio.inline_b64", "base64")
    assert refused(s, {"audio": {"inline_b64": 3}}) == ("audio.inline_b64", "type")
    assert refused(s, {"audio": {"inline_b64": ""}}) == ("audio", "min_bytes")
    assert refused(s, {"audio": {"inline_b64": "A" * 12}}) == ("audio", "max_bytes")
    assert refused(s, {"audio": {"inline_b64": "A" * 10_000}}) == ("audio", "max_bytes")


def test_scalars_ranges_and_enums() -> None:
    s = spec({"name": "n", "type": "integer", "exclusive_maximum": 10, "minimum": -2},
             {"name": "x", "type": "number", "enum": [0.5, 1, 2.5]},
             {"name": "b", "type": "boolean", "default": False},
             {"name": "o", "type": "object", "fields": [
                 {"name": "k", "type": "list", "items": {"type": "integer"}, "max_items": 2}]})
    assert s.effective({"n": 9, "x": 1}) == {"n": 9, "x": 1, "b": False}
    assert s.effective({"x": 1.0})["x"] == 1.0
    assert refused(s, {"n": 10}) == ("n", "exclusive_maximum")
    assert refused(s, {"n": -3}) == ("n", "minimum")
    assert refused(s, {"n": True}) == ("n", "type")
    assert refused(s, {"n": None}) == ("n", "type")
    assert refused(s, {"x": 2}) == ("x", "enum")
    assert refused(s, {"b": 1}) == ("b", "type")
    assert refused(s, {"o": {"k": [1, "2"]}}) == ("o.k[1]", "type")
    assert refused(s, {"o": {"k": [1, 2, 3]}}) == ("o.k", "max_items")


def test_constraints() -> None:
    s = spec({"name": "a", "type": "integer"}, {"name": "b", "type": "integer"},
             {"name": "c", "type": "string"}, {"name": "d", "type": "number", "default": 1.0},
             constraints=[{"rule": "at_most_one", "params": ["a", "c"]},
                          {"rule": "requires", "param": "b", "params": ["a"]},
                          {"rule": "forbids", "param": "c", "params": ["b"]},
                          {"rule": "compare", "left": "a", "op": "<=", "right": "d"},
                          {"rule": "at_least_one", "params": ["a", "c"]}])
    assert s.effective({"a": 1, "b": 2}) == {"a": 1, "b": 2, "d": 1.0}
    assert refused(s, {"a": 1, "c": "x"}) == ("a,c", "at_most_one")
    assert refused(s, {"b": 1, "c": "x"}) == ("b", "requires")
    assert refused(s, {"a": 2}) == ("a", "compare")           # against d's default
    assert s.effective({"a": 2, "d": 3}) == {"a": 2, "d": 3}
    assert refused(s, {}) == ("a,c", "at_least_one")


def test_override_precedence() -> None:
    """explicit > the chosen option's override > default; a default option applies too."""
    s = spec({"name": "mode", "type": "string", "enum": ["fast", "slow"], "default": "fast",
              "overrides": {"fast": {"steps": 4}, "slow": {"steps": 32, "solver": "heun"}}},
             {"name": "steps", "type": "integer", "minimum": 1, "maximum": 64, "default": 8},
             {"name": "solver", "type": "string", "enum": ["euler", "heun"]})
    assert s.effective({}) == {"mode": "fast", "steps": 4}
    assert s.effective({"mode": "slow"}) == {"mode": "slow", "steps": 32, "solver": "heun"}
    assert s.effective({"mode": "slow", "steps": 2}) == {"mode": "slow", "steps": 2,
                                                         "solver": "heun"}
    assert refused(s, {"mode": "slow", "steps": 65}) == ("steps", "maximum")


def test_effective_requests_do_not_share_state() -> None:
    s = spec({"name": "l", "type": "list", "items": {"type": "integer"}, "default": [1]})
    first = s.effective({})
    first["l"].append(2)
    assert s.effective({}) == {"l": [1]}


# --------------------------------------------------------------------------- spec refusals

BASE = {"spec_dsl": 2, "interaction": "request_response"}


@pytest.mark.parametrize(("doc", "param", "rule"), [
    ("x", "spec", "type"),
    ({"spec_dsl": 1}, "spec.spec_dsl", "enum"),
    ({**BASE, "interaction": "stream"}, "spec.interaction", "enum"),
    ({**BASE, "extra": 1}, "spec.extra", "unknown_key"),
    ({**BASE, "params": {}}, "spec.params", "type"),
    ({**BASE, "params": [{"name": "a", "type": "text"}]}, "spec.params[0].type", "type"),
    ({**BASE, "params": [{"name": "A", "type": "string"}]}, "spec.params[0].name", "name"),
    ({**BASE, "params": [{"name": "a", "type": "string"},
                         {"name": "a", "type": "integer"}]},
     "spec.params[1].name", "duplicate_name"),
    ({**BASE, "params": [{"name": "a", "type": "string", "minimum": 1}]},
     "spec.params[0].minimum", "unknown_key"),
    ({**BASE, "params": [{"name": "a", "type": "integer", "minimum": 5, "maximum": 4}]},
     "spec.params[0].maximum", "bounds"),
    ({**BASE, "params": [{"name": "a", "type": "integer", "minimum": 0.5}]},
     "spec.params[0].minimum", "type"),
    ({**BASE, "params": [{"name": "a", "type": "integer", "minimum": 0, "maximum": 9},
                         {"name": "b", "type": "string"},
                         {"name": "c", "type": "integer", "maximum": 3, "default": 7}]},
     "spec.params[2].default", "default"),
    ({**BASE, "params": [{"name": "a", "type": "string", "required": True, "default": "x"}]},
     "spec.params[0].default", "default"),
    ({**BASE, "params": [{"name": "a", "type": "binary", "default": {"inline_b64": ""}}]},
     "spec.params[0].default", "default"),
    ({**BASE, "params": [{"name": "a", "type": "list"}]}, "spec.params[0].items", "required"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x", "x"]}]},
     "spec.params[0].enum[1]", "duplicate"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": [1]}]},
     "spec.params[0].enum[0]", "enum"),
    ({**BASE, "params": [{"name": "a", "type": "string", "overrides": {}}]},
     "spec.params[0].overrides", "overrides"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x"],
                          "overrides": {"y": {"b": 1}}}, {"name": "b", "type": "integer"}]},
     "spec.params[0].overrides.y", "enum"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x"],
                          "overrides": {"x": {"b": "no"}}}, {"name": "b", "type": "integer"}]},
     "spec.params[0].overrides.x.b", "override"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x"],
                          "overrides": {"x": {"c": 1}}}]},
     "spec.params[0].overrides.x.c", "undeclared"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x"],
                          "overrides": {"x": {"b": 1}}},
                         {"name": "b", "type": "integer", "required": True}]},
     "spec.params[0].overrides.x.b", "overrides"),
    ({**BASE, "params": [{"name": "a", "type": "string", "enum": ["x"],
                          "overrides": {"x": {"c": 1}}},
                         {"name": "b", "type": "string", "enum": ["y"],
                          "overrides": {"y": {"c": 2}}}, {"name": "c", "type": "integer"}]},
     "spec.params[1].overrides.y.c", "overrides"),
    ({**BASE, "params": [{"name": "a", "type": "integer"}],
      "constraints": [{"rule": "exactly_one", "params": ["a", "z"]}]},
     "spec.constraints[0].params[1]", "undeclared"),
    ({**BASE, "params": [{"name": "a", "type": "integer"}, {"name": "b", "type": "string"}],
      "constraints": [{"rule": "compare", "left": "a", "op": "<", "right": "b"}]},
     "spec.constraints[0].right", "type"),
    ({**BASE, "params": [{"name": "a", "type": "integer"}],
      "constraints": [{"rule": "implies", "params": ["a"]}]},
     "spec.constraints[0].rule", "enum"),
    ({**BASE, "results": {"delivery": ["email"]}}, "spec.results.delivery", "enum"),
    ({**BASE, "results": {"delivery": ["upload"]}}, "spec.results.per_item", "required"),
    ({**BASE, "results": {"per_item": "texts"}}, "spec.results.per_item", "per_item"),
    ({**BASE, "results": {"fields": [{"name": "x", "type": "binary"},
                                     {"name": "x_b64", "type": "string"}]}},
     "spec.results.fields[1].name", "duplicate_name"),
    ({**BASE, "results": {"fields": [{"name": "output_id", "type": "string"}]}},
     "spec.results.fields[0].name", "reserved_name"),
    ({**BASE, "params": [{"name": "t", "type": "list", "required": True,
                          "items": {"type": "string"}}],
      "results": {"fields": [{"name": "x", "type": "string"}], "delivery": ["upload"],
                  "per_item": "t"}},
     "spec.results.fields", "upload"),
])
def test_bad_specs_are_refused(doc: Any, param: str, rule: str) -> None:
    assert spec_refused(doc) == (param, rule)
    with pytest.raises(InvalidInput):
        check_spec(doc)


@pytest.mark.parametrize("name", sorted(SYSTEM_FIELDS - {"inline_b64"}))
def test_system_fields_are_never_parameter_names(name: str) -> None:
    doc = {**BASE, "params": [{"name": name, "type": "string"}]}
    assert spec_refused(doc) == ("spec.params[0].name", "reserved_name")


def test_messages_never_echo_unbounded_input() -> None:
    s = spec({"name": "a", "type": "string", "enum": ["x"]})
    huge = "Z" * 20_000
    for request in ({"a": huge}, {huge: 1}):
        with pytest.raises(InvalidInput) as exc:
            s.effective(request)
        assert len(exc.value.message) < 300 and len(exc.value.fields["param"]) <= 80
    assert len(spec_refused({**BASE, huge: 1})[0]) < 100
