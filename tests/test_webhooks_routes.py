"""The webhook routes (aotx_trio/gateway/webhook_routes.py) on a real hypercorn
gateway built from gateway.json (store + webhooks keys): registration, listing,
disable, the signing key, auth, the refusals; and an end-to-end delivery through the
app's own supervised task to a real HTTPS consumer."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import make_config, make_runtime_file, short_dir, token_for
from _webhook_env import Receiver, append_events, receiving

from aotx_trio.config import Webhooks, load_gateway_config, write_gateway_config
from aotx_trio.gateway.serve import serve_gateway
from aotx_trio.registry.backends import open_store
from aotx_trio.runtime import boot
from aotx_trio.service.client import InProcessClient
from aotx_trio.webhooks import signing

pytestmark = pytest.mark.timeout(120)

PRINCIPALS = {"hooks": ("webhooks_manage",), "hooks2": ("webhooks_manage",),
              "reader": ("models_read",)}


def auth(who: str = "hooks") -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for(who)}"}


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, *, key: bool = True, ca_file: str | None = None,
                  limits: dict[str, Any] | None = None) -> AsyncIterator[str]:
    folder = short_dir()
    try:
        path, cfg = make_config(folder, PRINCIPALS, limits=limits)
        hooks: dict[str, Any] = {"retry_interval_s": 0.05, "allow_insecure_targets": True,
                                 "timeout_s": 5, "ca_file": ca_file, "lease_s": 1}
        if key:
            signing.create_key(folder / "hook.key")
            hooks["signing_key_file"] = "hook.key"          # relative: to gateway.json
        write_gateway_config(path, cfg.model_copy(update={
            "store": str(tmp_path / "data"), "webhooks": Webhooks.model_validate(hooks)}))
        cfg = load_gateway_config(path)
        assert cfg.webhooks.signing_key_file in (None, folder / "hook.key")
        ccir = make_runtime_file(tmp_path / "rt")
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(boot.run_runtime, ccir, folder / "journal",
                                          folder / "grants")
            shutdown = trio.Event()
            binds = await nursery.start(serve_gateway, cfg, InProcessClient(handler), shutdown)
            yield binds[0]
            shutdown.set()
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_routes_register_list_disable(tmp_path: Path) -> None:
    rx = Receiver()
    async with receiving(tmp_path, rx) as (hook_url, ca), gateway(tmp_path, ca_file=ca) as base, \
            httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/webhooks/signing-key", headers=auth())
        assert r.status_code == 200 and r.json()["algorithm"] == "ed25519"
        rx.public_key = r.json()["public_key"]
        assert len(rx.public_key) == 64

        r = await http.post("/webhooks", json={"url": hook_url, "backfill": True},
                            headers=auth())
        assert r.status_code == 201, r.text
        sub = r.json()
        assert sub["events"] == "*" and sub["state"] == "active" and sub["cursor"] == 0
        store = open_store(data=tmp_path / "data")
        ops = append_events(store, 3)
        with trio.fail_after(15):
            while len(rx.accepted) < 3:
                await trio.sleep(0.02)
        assert rx.accepted == ops and rx.refused == 0

        with trio.fail_after(15):      # the cursor advances right after the 2xx
            while (row := (await http.get("/webhooks", headers=auth())).json()
                   ["webhooks"][0])["cursor"] < 3:
                await trio.sleep(0.02)
        assert row["uuid"] == sub["uuid"] and row["last_delivered_at"] and row["cursor_at"]

        r = await http.delete(f"/webhooks/{sub['uuid']}?why=done", headers=auth())
        assert r.status_code == 200 and r.json()["state"] == "disabled"
        assert r.json()["why"] == "done"
        r = await http.delete(f"/webhooks/{sub['uuid']}", headers=auth())
        assert r.status_code == 404 and r.json()["error"]["code"] == "webhook_not_found"
        r = await http.delete("/webhooks/not-a-uuid", headers=auth())
        assert r.status_code == 404 and r.json()["error"]["code"] == "webhook_not_found"
        (row,) = (await http.get("/webhooks", headers=auth())).json()["webhooks"]
        assert row["state"] == "disabled" and row["url"] == hook_url   # history kept


@pytest.mark.parametrize(("body", "param", "rule"), [
    ({"url": "https://h.example/x", "events": ["model.published", "nope"]}, "events[1]",
     "enum"),
    ({"url": "https://h.example/x", "events": []}, "events", "type"),
    ({"url": "ftp://h.example/x"}, "url", "scheme"),
    ({"url": "https://u:p@h.example/x"}, "url", "userinfo"),
    ({"url": "https://h.example/x#f"}, "url", "fragment"),
    ({"url": "https://h.example/x", "backfill": "yes"}, "backfill", "type"),
    ({"url": "https://h.example/x", "extra": 1}, "extra", "unknown"),
])
async def test_registration_refusals(tmp_path: Path, body: dict[str, Any], param: str,
                                     rule: str) -> None:
    async with gateway(tmp_path) as base, httpx.AsyncClient(base_url=base) as http:
        r = await http.post("/webhooks", json=body, headers=auth())
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert (err["code"], err["param"], err["rule"]) == ("invalid_params", param, rule)


async def test_auth_and_unconfigured(tmp_path: Path) -> None:
    async with gateway(tmp_path, key=False) as base, httpx.AsyncClient(base_url=base) as http:
        assert (await http.get("/webhooks")).status_code == 401
        r = await http.get("/webhooks", headers=auth("reader"))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
        r = await http.post("/webhooks", json={"url": "https://h.example/x"}, headers=auth())
        assert r.status_code == 503 and r.json()["error"]["code"] == "webhooks_unconfigured"
        r = await http.get("/webhooks/signing-key", headers=auth())
        assert r.status_code == 503 and r.json()["error"]["code"] == "webhooks_unconfigured"
        assert (await http.get("/webhooks", headers=auth())).json() == {
            "webhooks": [], "next_cursor": None}


async def test_without_a_store_the_routes_are_not_ready(tmp_path: Path) -> None:
    from aotx_trio.gateway.app import create_app

    _, cfg = make_config(tmp_path / "cfg", PRINCIPALS)
    app = create_app(InProcessClient(None), cfg.principals)  # type: ignore[arg-type]
    client = app.test_client()
    for method, path in (("GET", "/webhooks"), ("POST", "/webhooks"),
                         ("GET", "/webhooks/signing-key"),
                         ("DELETE", "/webhooks/0b7e1f39-3d4e-4b7f-9c1a-2f3e4d5c6b7a")):
        r = await client.open(path, method=method, headers=auth(), json={})
        assert r.status_code == 503, path
        err = (await r.get_json())["error"]
        assert err["code"] == "not_ready" and err["missing"] == ["store"]


TARGET = "http://127.0.0.1:9/hook"      # allow_insecure_targets: vetted, never posted to


async def test_subscriptions_are_bounded_per_principal(tmp_path: Path) -> None:
    """limits.max_webhooks active subscriptions per principal: one more is 429
    over_quota naming the quota; another principal still registers; disabling one frees
    its slot."""
    async with gateway(tmp_path, limits={"max_webhooks": 2}) as base, \
            httpx.AsyncClient(base_url=base) as http:
        made = []
        for i in range(2):
            r = await http.post("/webhooks", json={"url": f"{TARGET}?n={i}"}, headers=auth())
            assert r.status_code == 201, r.text
            assert r.json()["owner"] == "hooks"
            made.append(r.json()["uuid"])
        r = await http.post("/webhooks", json={"url": TARGET}, headers=auth())
        assert r.status_code == 429, r.text
        err = r.json()["error"]
        assert (err["code"], err["quota"], err["limit"]) == ("over_quota", "webhooks", 2)
        assert r.headers["Retry-After"] == "1"
        r = await http.post("/webhooks", json={"url": TARGET}, headers=auth("hooks2"))
        assert r.status_code == 201 and r.json()["owner"] == "hooks2"
        assert (await http.delete(f"/webhooks/{made[0]}", headers=auth())).status_code == 200
        r = await http.post("/webhooks", json={"url": TARGET}, headers=auth())
        assert r.status_code == 201, r.text
        listed = (await http.get("/webhooks", headers=auth())).json()["webhooks"]
        assert sorted((x["owner"], x["state"]) for x in listed) == [
            ("hooks", "active"), ("hooks", "active"), ("hooks", "disabled"),
            ("hooks2", "active")]


async def test_the_list_is_paginated(tmp_path: Path) -> None:
    async with gateway(tmp_path) as base, httpx.AsyncClient(base_url=base) as http:
        made = []
        for i in range(5):
            r = await http.post("/webhooks", json={"url": f"{TARGET}?n={i}"}, headers=auth())
            made.append(r.json()["uuid"])
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params = {"limit": "2"} | ({} if cursor is None else {"cursor": cursor})
            r = await http.get("/webhooks", params=params, headers=auth())
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["webhooks"]) <= 2
            seen += [x["uuid"] for x in body["webhooks"]]
            pages += 1
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == made and pages == 3       # oldest first, each once
        whole = (await http.get("/webhooks", headers=auth())).json()
        assert [x["uuid"] for x in whole["webhooks"]] == made and whole["next_cursor"] is None
        for params, param in (({"limit": "0"}, "limit"), ({"limit": "501"}, "limit"),
                              ({"limit": "x"}, "limit"), ({"cursor": "nope"}, "cursor"),
                              ({"cursor": f"2026-01-01T00:00:00.000000Z,{made[0][:-1]}"},
                               "cursor"), ({"page": "1"}, "page")):
            r = await http.get("/webhooks", params=params, headers=auth())
            assert r.status_code == 422, params
            assert r.json()["error"]["param"] == param


async def test_disabled_ones_are_trimmed_after_the_feed_retention(tmp_path: Path) -> None:
    """A subscription disabled longer ago than the feed's retention (~90 days) is
    deleted, its lease with it; a recently disabled one and the active ones stay."""
    import json
    import time

    from aotx_trio.identity import canonical
    from aotx_trio.registry.feed import RETENTION_S
    from aotx_trio.registry.records import rfc3339

    async with gateway(tmp_path) as base, httpx.AsyncClient(base_url=base) as http:
        old, recent = [(await http.post("/webhooks", json={"url": f"{TARGET}?n={i}"},
                                        headers=auth())).json()["uuid"] for i in range(2)]
        for uid in (old, recent):
            assert (await http.delete(f"/webhooks/{uid}", headers=auth())).status_code == 200
        store = open_store(data=tmp_path / "data")
        long_ago = rfc3339(time.time() - RETENTION_S - 3600)
        store.hook_update(old, lambda b: canonical({**json.loads(b),
                                                    "disabled_at": long_ago}))
        r = await http.post("/webhooks", json={"url": TARGET}, headers=auth())
        assert r.status_code == 201
        listed = (await http.get("/webhooks", headers=auth())).json()["webhooks"]
        assert [x["uuid"] for x in listed if x["state"] == "disabled"] == [recent]
        assert store.hook_get(old) is None
        assert not list((tmp_path / "data" / "registry" / "webhooks").glob(f"{old}*"))
