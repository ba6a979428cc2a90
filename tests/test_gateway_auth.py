"""Bearer tokens -> principals, the action checks, and the error envelope on every
error the app itself produces (401, 403, 404, 405, 500)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from _gateway_env import ALL, embedded

from aotx_trio import errors
from aotx_trio.errors import Unauthorized
from aotx_trio.gateway.app import create_app
from aotx_trio.gateway.auth import Authenticator, hash_token, new_token
from aotx_trio.service.client import DeviceClient

BASE = "/aotx/v1/shared"


def _entry(name: str, token: str, actions: tuple[str, ...] = ALL) -> Any:
    return SimpleNamespace(name=name, token_sha256=hash_token(token), actions=actions)


def test_token_maps_to_its_principal() -> None:
    auth = Authenticator([_entry("alice", "ta"), _entry("bob", "tb", ("shared_read",))])
    assert auth.authenticate("Bearer ta").name == "alice"
    bob = auth.authenticate("bearer tb")  # the scheme is case-insensitive
    assert bob.name == "bob" and bob.actions == ("shared_read",)
    bob.require("shared_read")
    with pytest.raises(errors.Forbidden) as info:
        bob.require("shared_write")
    assert info.value.fields["action"] == "shared_write"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Basic dGE6", "ta",
                                    "Bearer ta tb", "Bearer tA", "Bearer t a"])
def test_missing_malformed_or_wrong_tokens_are_unauthorized(header: str | None) -> None:
    auth = Authenticator([_entry("alice", "ta")])
    with pytest.raises(Unauthorized):
        auth.authenticate(header)


def test_remembered_tokens_still_map_to_their_own_principal() -> None:
    auth = Authenticator([_entry("alice", "ta"), _entry("bob", "tb", ("shared_read",))])
    for _ in range(3):  # the second and later lookups come from the digest cache
        assert auth.authenticate("Bearer ta").name == "alice"
        assert auth.authenticate("Bearer tb").actions == ("shared_read",)
        for header in ("Bearer tA", "Bearer ta tb", "Basic ta", "Bearer"):
            with pytest.raises(Unauthorized):
                auth.authenticate(header)


def test_new_tokens_are_fresh_and_long() -> None:
    a, b = new_token(), new_token()
    assert a != b and len(a) >= 40
    assert len(hash_token(a)) == 64


def test_config_rejects_a_bad_digest() -> None:
    with pytest.raises(errors.ConfigError):
        Authenticator([SimpleNamespace(name="x", token_sha256="00", actions=())])


async def _error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, await resp.get_data(as_text=True)
    assert resp.headers["Cache-Control"] == "no-store"
    assert resp.headers["Content-Type"] == "application/json"
    body = await resp.get_json()
    assert body["error"]["code"] == code
    err: dict[str, Any] = body["error"]
    return err


async def test_http_auth_and_action_checks(tmp_path: Path) -> None:
    principals = {"alice": ALL, "reader": ("shared_read",), "writer": ("shared_write",),
                  "models": ("models_read",)}
    async with embedded(tmp_path, principals) as env:
        c = env.client
        resp = await c.get(BASE + "/participant")
        await _error(resp, 401, "unauthorized")
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        await _error(await c.get(BASE + "/participant", headers={"Authorization": "Bearer no"}),
                     401, "unauthorized")
        await _error(await c.get(BASE + "/nowhere"), 401, "unauthorized")  # auth before route
        # capabilities need only a valid token
        assert (await c.get(BASE + "/capabilities", headers=env.auth("models"))).status_code \
            == 200
        # reads need shared_read, mutations shared_write, membership shared_manage
        err = await _error(await c.get(BASE + "/participant", headers=env.auth("writer")),
                           403, "forbidden")
        assert err["action"] == "shared_read"
        err = await _error(await c.post(BASE + "/participant", headers=env.auth("reader"),
                                        json=env.body(1, 1)), 403, "forbidden")
        assert err["action"] == "shared_write"
        space = f"spc-{env.lineage}-{1:032x}"
        err = await _error(await c.post(f"{BASE}/spaces/{space}/members",
                                        headers=env.auth("writer"),
                                        json=env.body(1, 1, participant=env.par("alice"),
                                                      permissions=[])), 403, "forbidden")
        assert err["action"] == "shared_manage"


async def test_deployment_grants_intersect_the_gateway_actions(tmp_path: Path) -> None:
    """The runtime's grant file is the authority too: a gateway that vouches for an
    action the deployment did not grant gets a refusal from the device."""
    async with embedded(tmp_path, {"alice": ALL}, deployed={"alice": ("shared_read",)}) as env:
        resp = await env.client.post(BASE + "/participant", headers=env.auth("alice"),
                                     json=env.body(1, 1))
        err = await _error(resp, 403, "forbidden")
        assert err["reason"] == "deployment_grant"
        resp = await env.client.get(BASE + "/participant", headers=env.auth("alice"))
        assert resp.status_code == 200


async def test_framework_errors_use_the_envelope(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL}) as env:
        c = env.client
        for path in ["/docs", "/redoc", "/openapi.json", "/", "/static/x"]:
            await _error(await c.get(path), 404, "not_found")
        resp = await c.delete(BASE + "/participant", headers=env.auth("alice"))
        await _error(resp, 405, "method_not_allowed")
        assert "POST" in resp.headers["Allow"]
        await _error(await c.options(BASE + "/participant", headers=env.auth("alice")), 405,
                     "method_not_allowed")


class Broken(DeviceClient):
    """Fault injection at the device-client edge: every call fails with a bug."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        raise RuntimeError("injected")


async def test_unexpected_error_is_a_500_envelope() -> None:
    app = create_app(Broken(), [_entry("alice", "ta")])
    async with app.test_app() as test_app:
        resp = await test_app.test_client().get(BASE + "/participant",
                                                headers={"Authorization": "Bearer ta"})
        err = await _error(resp, 500, "internal_error")
        assert "injected" not in err["message"]
