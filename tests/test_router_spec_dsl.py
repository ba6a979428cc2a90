"""Spec DSL v2 (aotx_trio/router/spec/dsl.py and spec_*.py): the default specs,
the effective request (defaults, enum-option overrides, precedence), every
value rule, cross-field constraints, spec refusals, the result wire rule, and
property tests that generate specs and requests."""

from __future__ import annotations

import base64
import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aotx_trio.errors import InvalidInput, UpstreamFailure
from aotx_trio.router.manifest import check_manifest, check_spec
from aotx_trio.router.spec.builtin import NAMES, default_spec
from aotx_trio.router.spec.dsl import SYSTEM_FIELDS, Spec, parse_spec, split_envelope


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
    assert e.wire_results(results, effective=eff) == e.wire_results(results)
    with pytest.raises(UpstreamFailure) as exc:
        e.wire_results(results[:1], effective=eff)
    assert exc.value.fields == {"field": "results", "rule": "results"}
    for broken in ([{"embedding": vec}], [{"embedding": vec, "dimension": 3, "id": "x"}],
                   [{"embedding": "text", "dimension": 3}], "nope"):
        with pytest.raises(UpstreamFailure) as exc:
            e.wire_results(broken)  # type: ignore[arg-type]
        assert exc.value.code == "upstream_failure" and exc.value.status == 502


def test_the_invoke_envelope_and_delivery() -> None:
    req = {"texts": ["a"]}
    assert split_envelope({"request": req}) == (req, None)
    targets = [{"output_id": "a", "put_url": "https://b.storage.dev/x"}]
    assert split_envelope({"request": req, "output_targets": targets}) == (req, targets)
    for body, param, rule in (([], "body", "type"), ({}, "request", "required"),
                              ({"request": []}, "request", "type"),
                              ({"request": {}, "texts": ["a"]}, "texts", "unknown")):
        with pytest.raises(InvalidInput) as exc:
            split_envelope(body)
        assert (exc.value.fields["param"], exc.value.fields["rule"]) == (param, rule)
    e, t = parse_spec(default_spec("embedding")), parse_spec(default_spec("textgen"))
    assert e.delivery(None) == "inline" and e.delivery(targets) == "upload"
    assert t.delivery(None) == "inline"
    with pytest.raises(InvalidInput) as exc:
        t.delivery(targets)
    assert exc.value.fields == {"param": "output_targets", "rule": "delivery"}
    upload_only = parse_spec({**default_spec("embedding"), "results": {
        **default_spec("embedding")["results"], "delivery": ["upload"]}})
    with pytest.raises(InvalidInput) as exc:
        upload_only.delivery(None)
    assert exc.value.fields == {"param": "output_targets", "rule": "required"}


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
    big = spec({"name": "x", "type": "number", "maximum": 10 ** 400},
               {"name": "n", "type": "integer", "minimum": -(10 ** 400)})
    assert big.effective({"x": 10 ** 399, "n": -(10 ** 399)}) == {"x": 10 ** 399,
                                                                 "n": -(10 ** 399)}
    assert refused(big, {"x": 10 ** 401}) == ("x", "maximum")
    assert refused(big, {"x": math.inf}) == ("x", "finite")


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


def test_a_manifest_with_a_bad_spec_is_refused() -> None:
    """manifest.check_manifest (publish, scratch revise) runs the whole spec check."""
    bad = {**BASE, "params": [{"name": "n", "type": "integer", "maximum": 3, "default": 9}]}
    manifest = {"model_type": "textgen",
                "artifact": {"sha256": "0" * 64, "kind": "gguf", "size": 1},
                "serving": {"runtime_release": {"name": "r", "source_commit": "0" * 40},
                            "spec": bad}}
    with pytest.raises(InvalidInput) as exc:
        check_manifest(manifest)
    assert exc.value.fields == {"param": "spec.params[0].default", "rule": "default"}
    manifest["serving"]["spec"] = default_spec("textgen")
    assert check_manifest(manifest).serving.spec == default_spec("textgen")


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


# --------------------------------------------------------------------------- property tests

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT = st.text(alphabet="abcxyz é", max_size=10)


@st.composite
def string_rule(draw: st.DrawFn) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": "string"}
    lo = draw(st.integers(0, 3))
    if draw(st.booleans()):
        rule["min_length"] = lo
    if draw(st.booleans()):
        rule["max_length"] = lo + draw(st.integers(0, 6))
    if draw(st.booleans()):
        lo, hi = rule.get("min_length", 0), rule.get("max_length", 8)
        rule["enum"] = draw(st.lists(st.text(alphabet="abc", min_size=lo, max_size=hi),
                                     min_size=1, max_size=4, unique=True))
    return rule


@st.composite
def numeric_rule(draw: st.DrawFn, kind: str) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": kind}
    lo = draw(st.integers(-100, 100))
    hi = lo + draw(st.integers(2, 100))
    if draw(st.booleans()):
        rule["exclusive_minimum" if draw(st.booleans()) else "minimum"] = lo
    if draw(st.booleans()):
        rule["exclusive_maximum" if draw(st.booleans()) else "maximum"] = hi
    if kind == "integer" and draw(st.integers(0, 3)) == 0:
        rule["enum"] = sorted(draw(st.sets(st.integers(lo + 1, hi - 1), min_size=1,
                                           max_size=4)))
    return rule


def scalar_rule() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(string_rule(), numeric_rule("integer"), numeric_rule("number"),
                     st.just({"type": "boolean"}))


@st.composite
def list_rule(draw: st.DrawFn) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": "list", "items": draw(scalar_rule())}
    lo = draw(st.integers(0, 2))
    if draw(st.booleans()):
        rule["min_items"] = lo
    if draw(st.booleans()):
        rule["max_items"] = lo + draw(st.integers(0, 3))
    return rule


@st.composite
def object_rule(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    fields = [{"name": f"f{i}", "required": draw(st.booleans()), **draw(scalar_rule())}
              for i in range(n)]
    return {"type": "object", "fields": fields}


@st.composite
def binary_rule(draw: st.DrawFn) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": "binary"}
    lo = draw(st.integers(0, 4))
    if draw(st.booleans()):
        rule["min_bytes"] = lo
    if draw(st.booleans()):
        rule["max_bytes"] = lo + draw(st.integers(0, 8))
    return rule


def any_rule() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(scalar_rule(), list_rule(), object_rule(), binary_rule())


def value_for(rule: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Valid values of a rule (independent of the implementation)."""
    kind = rule["type"]
    if "enum" in rule:
        return st.sampled_from(rule["enum"])
    if kind == "string":
        lo = rule.get("min_length", 0)
        return st.text(alphabet="abcxyz é", min_size=lo, max_size=rule.get("max_length", lo + 6))
    if kind in ("integer", "number"):
        lo = rule.get("minimum", rule.get("exclusive_minimum"))
        hi = rule.get("maximum", rule.get("exclusive_maximum"))
        if kind == "integer":
            return st.integers(None if lo is None else lo + ("exclusive_minimum" in rule),
                               None if hi is None else hi - ("exclusive_maximum" in rule))
        return st.floats(lo, hi, exclude_min="exclusive_minimum" in rule,
                         exclude_max="exclusive_maximum" in rule, allow_nan=False,
                         allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "list":
        lo = rule.get("min_items", 0)
        return st.lists(value_for(rule["items"]), min_size=lo,
                        max_size=rule.get("max_items", lo + 3))
    if kind == "object":
        return st.fixed_dictionaries(
            {f["name"]: value_for(f) for f in rule["fields"] if f["required"]},
            optional={f["name"]: value_for(f) for f in rule["fields"] if not f["required"]})
    lo = rule.get("min_bytes", 0)
    return st.binary(min_size=lo, max_size=rule.get("max_bytes", lo + 8)).map(
        lambda b: {"inline_b64": base64.b64encode(b).decode()})


def satisfies(rule: dict[str, Any], value: Any) -> bool:
    """The oracle: ``value`` (as the effective request holds it) obeys ``rule``."""
    kind = rule["type"]
    if kind == "binary":
        return (isinstance(value, bytes) and rule.get("min_bytes", 0) <= len(value)
                <= rule.get("max_bytes", 1 << 40))
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "string":
        ok = isinstance(value, str) and (rule.get("min_length", 0) <= len(value)
                                         <= rule.get("max_length", 1 << 40))
    elif kind in ("integer", "number"):
        types = (int,) if kind == "integer" else (int, float)
        ok = (isinstance(value, types) and not isinstance(value, bool)
              and value >= rule.get("minimum", -math.inf)
              and value > rule.get("exclusive_minimum", -math.inf)
              and value <= rule.get("maximum", math.inf)
              and value < rule.get("exclusive_maximum", math.inf))
    elif kind == "list":
        return (isinstance(value, list)
                and rule.get("min_items", 0) <= len(value) <= rule.get("max_items", 1 << 40)
                and all(satisfies(rule["items"], v) for v in value))
    else:
        names = {f["name"]: f for f in rule["fields"]}
        return (isinstance(value, dict) and set(value) <= set(names)
                and all(f["name"] in value for f in rule["fields"] if f["required"])
                and all(satisfies(names[k], v) for k, v in value.items()))
    return ok and ("enum" not in rule or value in rule["enum"])


@st.composite
def spec_and_request(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A spec document with a valid request (its constraints hold by construction)."""
    params: list[dict[str, Any]] = []
    request: dict[str, Any] = {}
    for i in range(draw(st.integers(1, 6))):
        p = {"name": f"p{i}", **draw(any_rule())}
        if draw(st.integers(0, 3)) == 0:
            p["required"] = True
        elif p["type"] != "binary" and draw(st.booleans()):
            p["default"] = draw(value_for(p))
        params.append(p)
        if p.get("required") or draw(st.booleans()):
            request[p["name"]] = draw(value_for(p))
    present = {p["name"] for p in params if p["name"] in request or "default" in p}
    optional = [p["name"] for p in params if not p.get("required")]
    numeric = {p["name"]: request.get(p["name"], p.get("default")) for p in params
               if p["type"] in ("integer", "number")}
    constraints: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 3))):
        rule = draw(st.sampled_from(["exactly_one", "at_most_one", "at_least_one",
                                     "requires", "forbids", "compare"]))
        if rule == "compare":
            if len(numeric) < 2:
                continue
            left, right = draw(st.lists(st.sampled_from(sorted(numeric)), min_size=2,
                                        max_size=2, unique=True))
            op = draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="]))
            lv, rv = numeric[left], numeric[right]
            holds = lv is None or rv is None or {
                "<": lv < rv, "<=": lv <= rv, ">": lv > rv, ">=": lv >= rv,
                "==": lv == rv, "!=": lv != rv}[op]
            if holds:
                constraints.append({"rule": "compare", "left": left, "op": op, "right": right})
            continue
        if len(optional) < 2:
            continue
        group = draw(st.lists(st.sampled_from(optional), min_size=2, max_size=3, unique=True))
        n = len(present.intersection(group))
        if rule in ("requires", "forbids"):
            head, rest = group[0], group[1:]
            holds = head not in present or all((r in present) == (rule == "requires")
                                               for r in rest)
            if holds:
                constraints.append({"rule": rule, "param": head, "params": rest})
        elif {"exactly_one": n == 1, "at_most_one": n <= 1, "at_least_one": n >= 1}[rule]:
            constraints.append({"rule": rule, "params": group})
    doc = {"spec_dsl": 2, "interaction": "request_response", "params": params,
           "constraints": constraints}
    return doc, request


@PROPS
@given(spec_and_request())
def test_valid_requests_are_accepted_and_obey_every_rule(
        case: tuple[dict[str, Any], dict[str, Any]]) -> None:
    doc, request = case
    before = json.dumps(request, sort_keys=True)
    s = parse_spec(doc)
    eff = s.effective(request)
    assert json.dumps(request, sort_keys=True) == before          # the request is untouched
    assert s.effective(request) == eff                             # deterministic
    assert list(eff) == [p["name"] for p in doc["params"] if p["name"] in eff]
    for p in doc["params"]:
        name = p["name"]
        if name in request:
            want = request[name]
            if p["type"] == "binary":
                want = base64.b64decode(want["inline_b64"])
            assert eff[name] == want
        elif "default" in p:
            assert eff[name] == p["default"]
        else:
            assert name not in eff and not p.get("required")
        if name in eff:
            assert satisfies(p, eff[name]), (p, eff[name])
    for c in s.constraints:
        c.check(eff)


def _wrong_type(kind: str) -> Any:
    return {"string": 12, "integer": "x", "number": "x", "boolean": 1, "list": "x",
            "object": [], "binary": "x"}[kind]


def mutations(p: dict[str, Any], value: Any) -> list[tuple[Any, str, str]]:
    """(invalid value, param suffix, rule) for param ``p`` whose valid value is ``value``."""
    kind, name = p["type"], p["name"]
    out: list[tuple[Any, str, str]] = [
        (_wrong_type(kind), name, "binary" if kind == "binary" else "type")]
    if kind == "integer":
        out.append((1.5, name, "type"))
    if "enum" in p:
        other = ("zzzzzzzzz" if kind == "string" else max(p["enum"]) + 1)
        out.append((other, name, "enum"))
    elif kind in ("integer", "number"):
        for key, delta in (("minimum", -1), ("exclusive_minimum", 0), ("maximum", 1),
                           ("exclusive_maximum", 0)):
            if key in p:
                out.append((p[key] + delta, name, key))
    elif kind == "string":
        if p.get("min_length", 0) > 0:
            out.append(("a" * (p["min_length"] - 1), name, "min_length"))
        if "max_length" in p:
            out.append(("a" * (p["max_length"] + 1), name, "max_length"))
    if kind == "list":
        items = p["items"]
        if p.get("min_items", 0) > 0:
            out.append((value[:p["min_items"] - 1], name, "min_items"))
        if "max_items" in p and value:
            out.append((value + [value[0]] * (p["max_items"] + 1 - len(value)), name,
                        "max_items"))
        if value:
            out.append(([_wrong_type(items["type"]), *value[1:]], f"{name}[0]", "type"))
    if kind == "object":
        out.append(({**value, "zz": 1}, f"{name}.zz", "unknown"))
        for f in p["fields"]:
            if f["required"]:
                out.append(({k: v for k, v in value.items() if k != f["name"]},
                            f"{name}.{f['name']}", "required"))
            out.append(({**value, f["name"]: _wrong_type(f["type"])}, f"{name}.{f['name']}",
                        "type"))
    if kind == "binary":
        out.append(({"inline_b64": "A"}, f"{name}.inline_b64", "base64"))
        if p.get("min_bytes", 0) > 0:
            out.append(({"inline_b64": base64.b64encode(b"a" * (p["min_bytes"] - 1)).decode()},
                        name, "min_bytes"))
        if "max_bytes" in p:
            out.append(({"inline_b64": base64.b64encode(b"a" * (p["max_bytes"] + 1)).decode()},
                        name, "max_bytes"))
    return out


@PROPS
@given(spec_and_request(), st.data())
def test_each_mutated_request_is_refused_with_its_param_and_rule(
        case: tuple[dict[str, Any], dict[str, Any]], data: st.DataObject) -> None:
    doc, request = case
    s = parse_spec(doc)
    choices: list[tuple[dict[str, Any], str, str]] = [
        ({**request, "zz_unknown": 1}, "zz_unknown", "unknown"),
        ({**request, "request_id": "x"}, "request_id", "system_field")]
    for p in doc["params"]:
        name = p["name"]
        if p.get("required"):
            choices.append(({k: v for k, v in request.items() if k != name}, name, "required"))
        if name in request:
            for bad, param, rule in mutations(p, request[name]):
                choices.append(({**request, name: bad}, param, rule))
    mutated, param, rule = data.draw(st.sampled_from(choices))
    assert refused(s, mutated) == (param, rule)


@PROPS
@given(st.data())
def test_overrides_follow_the_precedence(data: st.DataObject) -> None:
    targets = [{"name": f"t{i}", "type": "integer", "minimum": 0, "maximum": 9}
               for i in range(3)]
    for t in targets:
        if data.draw(st.booleans()):
            t["default"] = data.draw(st.integers(0, 9))
    options = ["a", "b", "c"]
    overrides = {o: {t["name"]: data.draw(st.integers(0, 9)) for t in targets
                     if data.draw(st.booleans())} for o in options}
    overrides = {o: sets for o, sets in overrides.items() if sets}
    mode: dict[str, Any] = {"name": "mode", "type": "string", "enum": options}
    if overrides:
        mode["overrides"] = overrides
    if data.draw(st.booleans()):
        mode["default"] = data.draw(st.sampled_from(options))
    s = parse_spec({"spec_dsl": 2, "params": [mode, *targets]})
    request = data.draw(st.fixed_dictionaries(
        {}, optional={"mode": st.sampled_from(options),
                      **{t["name"]: st.integers(0, 9) for t in targets}}))
    eff = s.effective(request)
    chosen = request.get("mode", mode.get("default"))
    for t in targets:
        name = t["name"]
        if name in request:
            expect = request[name]
        elif chosen is not None and name in overrides.get(chosen, {}):
            expect = overrides[chosen][name]
        else:
            expect = t.get("default")
        assert eff.get(name) == expect


@PROPS
@given(st.lists(st.tuples(st.sampled_from(["string", "integer", "number", "boolean",
                                            "binary"]), st.booleans()),
                min_size=1, max_size=5), st.data())
def test_the_wire_rule(fields: list[tuple[str, bool]], data: st.DataObject) -> None:
    declared = [{"name": f"r{i}", "type": kind, **({"nullable": True} if null else {})}
                for i, (kind, null) in enumerate(fields)]
    s = parse_spec({"spec_dsl": 2, "results": {"fields": declared}})
    gen = {"string": TEXT, "integer": st.integers(), "number": st.floats(allow_nan=False),
           "boolean": st.booleans(), "binary": st.binary(max_size=16)}
    results = data.draw(st.lists(st.fixed_dictionaries(
        {f["name"]: (gen[f["type"]] | st.none()) if f.get("nullable") else gen[f["type"]]
         for f in declared}), max_size=3))
    wire = s.wire_results(results)
    for got, result in zip(wire, results, strict=True):
        for f in declared:
            value = result[f["name"]]
            if f["type"] == "binary":
                assert f["name"] not in got
                assert got[f"{f['name']}_b64"] == (
                    None if value is None else base64.b64encode(value).decode())
            else:
                assert got[f["name"]] == value


def _oracle(constraints: list[dict[str, Any]], eff: dict[str, Any]) -> tuple[str, str] | None:
    """The first constraint ``eff`` breaks, as (param, rule), by the documented table."""
    ops = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
           ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
    for c in constraints:
        rule = c["rule"]
        if rule == "compare":
            a, b = eff.get(c["left"]), eff.get(c["right"])
            if a is not None and b is not None and not ops[c["op"]](a, b):
                return c["left"], "compare"
            continue
        if rule in ("requires", "forbids"):
            if c["param"] in eff and any((p in eff) != (rule == "requires")
                                         for p in c["params"]):
                return c["param"], rule
            continue
        present = [p for p in c["params"] if p in eff]
        n = len(present)
        ok = {"exactly_one": n == 1, "at_most_one": n <= 1, "at_least_one": n >= 1}[rule]
        if not ok:
            return ",".join(present if n > 1 else c["params"]), rule
    return None


@PROPS
@given(st.data())
def test_constraints_agree_with_their_table(data: st.DataObject) -> None:
    names = [f"p{i}" for i in range(data.draw(st.integers(2, 5)))]
    params: list[dict[str, Any]] = []
    for name in names:
        p: dict[str, Any] = {"name": name, "type": "integer", "minimum": 0, "maximum": 5}
        if data.draw(st.integers(0, 3)) == 0:
            p["default"] = data.draw(st.integers(0, 5))
        params.append(p)
    constraints: list[dict[str, Any]] = []
    for _ in range(data.draw(st.integers(1, 4))):
        rule = data.draw(st.sampled_from(["exactly_one", "at_most_one", "at_least_one",
                                          "requires", "forbids", "compare"]))
        pick = data.draw(st.lists(st.sampled_from(names), min_size=2, max_size=len(names),
                                  unique=True))
        if rule == "compare":
            constraints.append({"rule": rule, "left": pick[0], "right": pick[1],
                                "op": data.draw(st.sampled_from(["<", "<=", ">", ">=",
                                                                 "==", "!="]))})
        elif rule in ("requires", "forbids"):
            constraints.append({"rule": rule, "param": pick[0], "params": pick[1:]})
        else:
            constraints.append({"rule": rule, "params": pick})
    s = parse_spec({"spec_dsl": 2, "params": params, "constraints": constraints})
    request = data.draw(st.fixed_dictionaries({}, optional={n: st.integers(0, 5)
                                                            for n in names}))
    eff = {p["name"]: request.get(p["name"], p.get("default")) for p in params
           if p["name"] in request or "default" in p}
    expect = _oracle(constraints, eff)
    if expect is None:
        assert s.effective(request) == eff
    else:
        assert refused(s, request) == expect


def test_the_format_doc_shows_the_default_specs() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "formats" / "spec-dsl.md"
           ).read_text(encoding="utf-8")
    blocks = [json.loads(b.split("```", 1)[0]) for b in doc.split("```json\n")[1:]
              if b.startswith("{\n  \"spec_dsl\"")]
    assert blocks == [default_spec("textgen"), default_spec("embedding")]
