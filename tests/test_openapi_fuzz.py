"""A bounded API fuzz test driven by docs/openapi.yaml (issue 10 item 7).

Every documented operation of a real ``aotx serve`` (a subprocess on loopback,
tiny model, rate limit off) gets a bounded number of requests whose path and query
parameters and bodies come from the operation's own schemas
(:func:`strategy`), mixed with hostile variants (arbitrary text in path
segments and queries, arbitrary JSON and bytes as bodies, a missing or wrong
token).  Any 5xx fails, any error without the envelope ``{"error": {"code",
"message"}}`` fails, and a JSON answer with a documented status must match that
status's documented schema.

The strategies are drawn from the schemas by :func:`strategy` below, a small
generator for the JSON Schema subset the document uses (hypothesis-jsonschema
0.23 does not run on the installed hypothesis)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import yaml
from _gateway_env import ALL, TINY_MODEL, make_config, make_runtime_file, short_dir, token_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parent.parent
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "docs" / "openapi.yaml").read_text())
COMPONENTS = SPEC["components"]
EXAMPLES_PER_OPERATION = 30
ACTIONS = (*ALL, "models_read", "models_invoke", "metrics_read")


def _resolve(node: Any) -> Any:
    """``node`` with every ``$ref`` into ``#/components`` replaced by its target."""
    if isinstance(node, dict):
        if "$ref" in node and node["$ref"].startswith("#/components/"):
            target: Any = SPEC
            for part in node["$ref"][2:].split("/"):
                target = target[part]
            return _resolve(target)
        return {k: _resolve(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v) for v in node]
    return node


def _json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An OpenAPI 3.1 schema as plain JSON Schema (drop annotation-only keys)."""
    def clean(n: Any) -> Any:
        if isinstance(n, dict):
            return {k: clean(v) for k, v in n.items() if k not in ("examples", "example")}
        if isinstance(n, list):
            return [clean(v) for v in n]
        return n
    out: dict[str, Any] = clean(_resolve(schema))
    return out


OPERATIONS: list[tuple[str, str, dict[str, Any]]] = []
for _path, _item in SPEC["paths"].items():
    _shared = _item.get("parameters", [])
    for _method in ("get", "post"):
        if _method in _item:
            _op = dict(_resolve(_item[_method]))
            _op["parameters"] = _resolve(_shared) + _resolve(_op.get("parameters", []))
            OPERATIONS.append((_path, _method, _op))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, str]]:
    folder = short_dir()
    try:
        make_runtime_file(folder)
        make_config(folder, {"alice": ACTIONS}, limits={"requests_per_second": 0,
                                                          "v1_requests_per_second": 0})
        with open(folder / "serve.log", "w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "aotx_trio", "serve", "--data", str(folder),
                 "--bind", "127.0.0.1:0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert proc.stdout is not None
        url = lineage = ""
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not url:
            line = proc.stdout.readline()
            m = re.search(r"lineage ([0-9a-f]{32}), listening on (http://\S+)", line)
            if m:
                lineage, url = m.group(1), m.group(2)
            elif not line:
                break
        assert url, (folder / "serve.log").read_text()
        try:
            yield url, lineage
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            log_text = (folder / "serve.log").read_text()
            assert "Traceback" not in log_text, log_text[-4000:]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_text = st.text(max_size=40)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                     | st.text(max_size=20),
                     lambda kids: st.lists(kids, max_size=4)
                     | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=12)


def _merge(schemas: list[dict[str, Any]]) -> dict[str, Any]:
    """``allOf`` of object schemas as one (properties and required united)."""
    out: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    for sub in schemas:
        sub = _merge(sub["allOf"]) if "allOf" in sub else sub
        out["properties"].update(sub.get("properties", {}))
        out["required"] += [r for r in sub.get("required", []) if r not in out["required"]]
    return out


def strategy(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of a (resolved) schema: the subset docs/openapi.yaml uses."""
    if "allOf" in schema:
        return strategy(_merge(schema["allOf"]))
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return st.one_of([strategy(s) for s in schema[key]])
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([strategy({**schema, "type": k}) for k in kind])
    if kind == "string":
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True)
        return st.text(min_size=schema.get("minLength", 0),
                       max_size=min(schema.get("maxLength", 30), 30))
    if kind == "integer":
        return st.integers(schema.get("minimum", -(1 << 40)), schema.get("maximum", 1 << 40))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False,
                         allow_infinity=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(strategy(schema.get("items", {})), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 5), 5))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = [k for k in schema.get("required", []) if k in props]
        optional = {k: strategy(v) for k, v in props.items() if k not in required}
        return st.fixed_dictionaries({k: strategy(props[k]) for k in required},
                                     optional=optional)
    return _json


def _param(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    return st.one_of(strategy(_json_schema(schema)), _text)


@st.composite
def _request(draw: st.DrawFn, path: str, method: str, op: dict[str, Any],
             lineage: str) -> tuple[str, dict[str, Any], dict[str, str], bytes | None]:
    url = path
    query: dict[str, Any] = {}
    for p in op["parameters"]:
        if p["in"] == "path":
            value = str(draw(_param(p["schema"])))
            url = url.replace("{" + p["name"] + "}",
                              urllib.parse.quote(value, safe="") or "x")
        elif p["in"] == "query" and draw(st.booleans()):
            query[p["name"]] = draw(_param(p["schema"]))
    headers = {"Authorization": f"Bearer {token_for('alice')}"}
    auth = draw(st.sampled_from(["good"] * 8 + ["none", "bad"]))
    if auth == "none":
        headers = {}
    elif auth == "bad":
        headers["Authorization"] = draw(st.sampled_from(["Bearer nope", "Basic x", "Bearer"]))
    body: bytes | None = None
    if method == "post":
        content = op.get("requestBody", {}).get("content", {}).get("application/json", {})
        kind = draw(st.sampled_from(["schema"] * 3 + ["json", "bytes"]))
        if kind == "schema" and "schema" in content:
            data = draw(strategy(_json_schema(content["schema"])))
            if isinstance(data, dict) and "lineage" in data and draw(st.booleans()):
                data["lineage"] = lineage
            if isinstance(data, dict) and path == "/v1/chat/completions":
                # bounded work per example: a fuzz test, not a load test
                data["max_tokens"] = draw(st.integers(1, 4))
                if draw(st.booleans()):
                    data["model"] = TINY_MODEL
            body = json.dumps(data).encode()
        elif kind == "bytes":
            body = draw(st.binary(max_size=200))
        else:
            body = json.dumps(draw(_json)).encode()
        headers["Content-Type"] = "application/json"
    return url, {k: str(v) for k, v in query.items()}, headers, body


def _check(op: dict[str, Any], resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    ctype = resp.headers.get("content-type", "")
    if resp.status_code >= 400:
        body = resp.json()
        err = body.get("error")
        assert isinstance(err, dict), body
        assert isinstance(err.get("code"), str) and isinstance(err.get("message"), str), body
        if resp.status_code in (429, 503):
            assert int(resp.headers["Retry-After"]) == err["retry_after"]
    documented = op["responses"].get(str(resp.status_code))
    if documented and ctype.startswith("application/json"):
        schema = documented.get("content", {}).get("application/json", {}).get("schema")
        if schema is not None:
            jsonschema.validate(resp.json(), _json_schema(schema))


@pytest.mark.parametrize(("path", "method", "op"), OPERATIONS,
                         ids=[f"{m.upper()} {p}" for p, m, _ in OPERATIONS])
def test_every_operation_answers_within_its_contract(
        server: tuple[str, str], path: str, method: str, op: dict[str, Any]) -> None:
    url, lineage = server
    with httpx.Client(base_url=url, timeout=30) as http:
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                         HealthCheck.data_too_large])
        @given(_request(path, method, op, lineage))
        def run(req: tuple[str, dict[str, Any], dict[str, str], bytes | None]) -> None:
            target, query, headers, body = req
            if "/events" in target:
                headers = {**headers, "Accept": "text/event-stream"}
            with http.stream(method.upper(), target, params=query, headers=headers,
                             content=body) as resp:
                if resp.headers.get("content-type", "").startswith("text/event-stream"):
                    return              # a live stream of a real operation: not fuzzed
                resp.read()
                _check(op, resp)

        run()
