"""The one route table (aotx_trio.gateway.routes_table.ROUTES): the app serves exactly
its rows, each through the one admit step (token, the row's rate bucket, the row's
body limit, the row's action) before its handler, and ``/v1`` authenticates once."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest

from aotx_trio.gateway import routes_table
from aotx_trio.gateway.app import VIEWS, create_app
from aotx_trio.gateway.auth import hash_token
from aotx_trio.gateway.quota import RateLimiter
from aotx_trio.gateway.routes_table import BASE, ROUTES
from aotx_trio.vocab import ACTIONS

pytestmark = pytest.mark.timeout(60)

TOKEN = {"Authorization": "Bearer tok"}
NOBODY = {"Authorization": "Bearer nothing-granted"}


class _Client:
    """A device client that answers only ``capabilities`` (and counts the calls)."""

    def __init__(self) -> None:
        self.calls = 0

    async def capabilities(self) -> dict[str, Any]:
        self.calls += 1
        return {"models": [{"name": "m", "kind": "text", "ready": True}]}


def _principals() -> list[Any]:
    return [SimpleNamespace(name="alice", token_sha256=hash_token("tok"), actions=ACTIONS),
            SimpleNamespace(name="nobody", token_sha256=hash_token("nothing-granted"),
                            actions=())]


def _path(route: routes_table.Route) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda m: f"x-{m.group(1)}", route.path)


def test_the_app_serves_exactly_the_table() -> None:
    assert len({r.endpoint for r in ROUTES}) == len(ROUTES)
    assert set(VIEWS) == {r.endpoint for r in ROUTES}
    app = create_app(_Client(), _principals())  # type: ignore[arg-type]
    served = {(rule.endpoint, m, rule.rule) for rule in app.url_map.iter_rules()
              for m in rule.methods or () if m not in ("HEAD", "OPTIONS")}
    assert served == {(r.endpoint, r.method, r.path) for r in ROUTES}
    assert routes_table.MUTATION_ROUTES == tuple(r for r in ROUTES if r.kind)


async def test_every_route_passes_the_admit_step() -> None:
    """No token: 401; an empty bucket: 429 with Retry-After (router and webhook routes
    included, /v1 from its own bucket); a principal without the row's action: 403.
    (Quart's path; the fast path's mutations meet the same Admission:
    test_gateway_quota, test_gateway_corpus.)"""
    empty = RateLimiter(1e-3, 0)
    v1_empty = RateLimiter(1e-3, 0, quota="v1_requests")
    app = create_app(_Client(), _principals(), rate=empty,  # type: ignore[arg-type]
                     v1_rate=v1_empty)
    http = app.test_client()
    for route in ROUTES:
        path = _path(route)
        r = await http.open(path, method=route.method)
        assert r.status_code == 401, (route.endpoint, r.status_code)
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
        r = await http.open(path, method=route.method, headers=TOKEN, json={})
        err = (await r.get_json())["error"]
        assert r.status_code == 429 and err["code"] == "over_quota", (route.endpoint, err)
        assert err["quota"] == ("v1_requests" if route.bucket == "v1" else "requests")
        assert r.headers["Retry-After"] == "1000" and err["retry_after"] == 1000
        assert ((await r.get_json()).get("ok") is False) == (route.dialect == "router")
    app = create_app(_Client(), _principals())  # type: ignore[arg-type]
    http = app.test_client()
    for route in ROUTES:
        r = await http.open(_path(route), method=route.method, headers=NOBODY, json={})
        if route.actions:
            err = (await r.get_json())["error"]
            assert r.status_code == 403 and err["code"] == "forbidden", route.endpoint
            assert err["action"] == route.actions[-1]
        else:
            assert r.status_code == 200, route.endpoint


async def test_a_declared_body_over_the_row_limit_is_413_in_the_row_dialect() -> None:
    app = create_app(_Client(), _principals(), max_body_bytes=64,  # type: ignore[arg-type]
                     max_media_bytes=128)
    http = app.test_client()
    for path, limit in (("/models/m/invoke", 64), ("/webhooks", 64),
                        ("/v1/chat/completions", 64), (BASE + "/media", 128)):
        data = b"x" * (limit + 1)
        r = await http.post(path, headers={**TOKEN, "Content-Length": str(len(data))},
                            data=data)
        body = await r.get_json()
        assert r.status_code == 413 and body["error"]["code"] == "body_too_large", path
        assert body["error"]["limit"] == limit
        assert (body.get("ok") is False) == path.startswith("/models/")


async def test_v1_authenticates_once() -> None:
    client = _Client()
    app = create_app(client, _principals())  # type: ignore[arg-type]
    auth = app.config["AOTX_AUTH"]
    seen: list[str | None] = []
    real = auth.authenticate

    def counted(authorization: str | None) -> Any:
        seen.append(authorization)
        return real(authorization)

    auth.authenticate = counted
    http = app.test_client()
    r = await http.get("/v1/models", headers=TOKEN)
    assert r.status_code == 200 and (await r.get_json())["data"][0]["id"] == "m"
    assert seen == ["Bearer tok"] and client.calls == 1
    seen.clear()
    r = await http.post("/v1/chat/completions", headers=TOKEN, json={"n": 9})
    err = (await r.get_json())["error"]
    assert r.status_code == 400 and err == {
        "code": "invalid_parameter", "message": "n must be an integer in 1..8",
        "type": "invalid_request_error", "param": "n"}
    assert seen == ["Bearer tok"]


async def test_unrouted_paths() -> None:
    """Under the shared API a bad token is 401 before a 404 or 405; under a router
    prefix an unknown path is that prefix's not-found code; elsewhere a plain 404."""
    http = create_app(_Client(), _principals()).test_client()  # type: ignore[arg-type]
    assert (await http.get(BASE + "/nowhere")).status_code == 401
    r = await http.get(BASE + "/nowhere", headers=TOKEN)
    assert r.status_code == 404 and (await r.get_json())["error"]["code"] == "not_found"
    assert (await http.delete(BASE + "/spaces", headers=TOKEN)).status_code == 405
    for path, code in (("/nowhere", None), ("/models/", "model_not_found"),
                       ("/aliases/", "alias_unresolved"),
                       ("/scratch-sessions/a/b", "scratch_not_found"), ("/v1/nothing", None)):
        r = await http.get(path)
        assert r.status_code in (404, 405), path
        if code:
            assert (await r.get_json())["error"]["code"] == code, path
