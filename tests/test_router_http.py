"""The serving router's read routes on a real hypercorn (folder store and a real
PostgreSQL): GET /models from the feed-refreshed index, exact keyed detail reads,
aliases with their verified chain, auth, and two gateways on one PostgreSQL store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from _router_env import MID, RouterEnv, publish, router_served, tiny_gguf

from aotx_trio.registry.records import EngineSet
from aotx_trio.router.aliases import set_alias
from aotx_trio.router.service import Settings

pytestmark = pytest.mark.timeout(120)


def err(r: Any) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    return body


@pytest.fixture(params=["folder", "postgresql"])
def store_kw(request: pytest.FixtureRequest) -> dict[str, Any]:
    if request.param == "folder":
        return {}
    return {"store_url": request.getfixturevalue("postgres_url")}


async def _published(env: RouterEnv, tmp_path: Path, **kw: Any) -> None:
    await publish(env.reg, tiny_gguf(tmp_path), descriptor=env.loaded()["descriptor"], **kw)


async def _listed(env: RouterEnv, model_id: str, query: str = "") -> list[dict[str, Any]]:
    """The listing once ``model_id`` is in it (the index refresh is 0.1 s)."""
    with trio.fail_after(10):
        while True:
            r = await env.get("/models" + query)
            assert r.status_code == 200
            rows: list[dict[str, Any]] = r.json()["models"]
            if any(m["model_id"] == model_id for m in rows):
                return rows
            await trio.sleep(0.05)


async def test_list_detail_and_filters(tmp_path: Path, store_kw: dict[str, Any]) -> None:
    async with router_served(tmp_path, **store_kw) as env:
        assert (await env.get("/models")).json() == {"models": []}
        await _published(env, tmp_path)
        rows = await _listed(env, MID)
        assert [m["model_id"] for m in rows] == [MID]
        assert rows[0]["model_type"] == "textgen" and rows[0]["state"] == "active"
        assert (await env.get("/models?model_type=embedding")).json() == {"models": []}
        await env.reg.set_model_state(MID, "deprecated")
        with trio.fail_after(10):
            while (await env.get("/models")).json()["models"]:
                await trio.sleep(0.05)
        assert [m["state"] for m in (await env.get("/models?state_filter=deprecated"))
                .json()["models"]] == ["deprecated"]
        assert len((await env.get("/models?state_filter=all")).json()["models"]) == 1
        for query, param in (("state_filter=gone", "state_filter"),
                             ("model_type=tts", "model_type"), ("limit=3", "limit")):
            r = await env.get("/models?" + query)
            assert r.status_code == 422, query
            assert err(r)["code"] == "invalid_params" and err(r)["param"] == param
            assert err(r)["rule"] in ("enum", "unknown")

        # exact keyed detail: slashes in the path, manifest, state, servable
        r = await env.get("/models/" + MID)
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        d = r.json()
        assert d["model_id"] == MID and d["state"] == "deprecated" and d["servable"] is True
        assert d["manifest"]["serving"]["spec"]["spec_dsl"] == 2
        assert set(d) == {"model_id", "manifest", "state", "servable"}   # the seed's shape


async def test_detail_is_exact_and_never_waits_for_the_index(tmp_path: Path) -> None:
    slow = Settings(index_refresh_s=3600)
    async with router_served(tmp_path, settings=slow) as env:
        await _published(env, tmp_path)
        assert (await env.get("/models/" + MID)).status_code == 200   # read from the store
        assert (await env.get("/models")).json() == {"models": []}     # index: next hour


async def test_detail_errors_and_readiness(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        r = await env.get("/models/runs/none/x.json")
        assert r.status_code == 404 and err(r)["code"] == "model_not_found"
        assert "reason" not in err(r)
        # a stored manifest that was never published
        await _published(env, tmp_path)
        man = (await env.reg.get_model(MID)).manifest.model_dump(mode="json")
        await env.reg.put_manifest("runs/demo/r1/unpublished.json", man)
        r = await env.get("/models/runs/demo/r1/unpublished.json")
        assert r.status_code == 404 and err(r)["reason"] == "unpublished"
        # removed: 410 with removed_at, forever
        await env.reg.unpublish(MID, "superseded")
        r = await env.get("/models/" + MID)
        assert r.status_code == 410 and err(r)["code"] == "model_removed"
        assert err(r)["removed_at"].endswith("Z")
        # an over-long id is not echoed whole
        r = await env.get("/models/" + "a" * 20000)
        assert r.status_code == 404 and len(r.text) < 400
        # not deployed here: an artifact this runtime has not loaded
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF" + bytes(64))
        await publish(env.reg, other, model_id="m/other", release="other-r1")
        d = (await env.get("/models/m/other")).json()
        assert d["servable"] is False and d["not_ready"] == "deployment"
        # a release that needs an engine set this host lacks
        await _published(env, tmp_path, model_id="m/h100", release="tiny-h100",
                         engine_set=EngineSet(name="H100", sha256="ab" * 32))
        d = (await env.get("/models/m/h100")).json()
        assert d["servable"] is False and d["not_ready"] == "engine_set(H100)"
        # disabled: not servable, no not_ready
        await _published(env, tmp_path, model_id="m/off", release="tiny-r1")
        await env.reg.set_model_state("m/off", "disabled")
        d = (await env.get("/models/m/off")).json()
        assert d["servable"] is False and d["state"] == "disabled" and "not_ready" not in d


async def test_aliases(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        await _published(env, tmp_path)
        await set_alias(env.reg, "tiny/first-light", MID, 0)
        await set_alias(env.reg, "tiny/latest", "tiny/first-light", 1)
        chain = [{"name": "tiny/latest", "level": 1, "target": "tiny/first-light"},
                 {"name": "tiny/first-light", "level": 0, "target": MID}]
        r = await env.get("/aliases/tiny/latest")
        assert r.status_code == 200 and r.json()["chain"] == chain
        assert r.json()["model_id"] == MID
        d = (await env.get("/models/tiny/latest")).json()
        assert d["model_id"] == MID and d["resolution_chain"] == chain
        r = await env.get("/aliases/tiny/none")
        assert r.status_code == 404 and err(r)["code"] == "alias_unresolved"
        assert err(r)["chain"] == [] and err(r)["reason"] == "missing"
        await set_alias(env.reg, "tiny/dangling", "tiny/gone", 1, verify=False)
        r = await env.get("/aliases/tiny/dangling")
        assert err(r)["code"] == "alias_unresolved" and err(r)["reason"] == "missing"
        assert err(r)["chain"] == [{"name": "tiny/dangling", "level": 1, "target": "tiny/gone"}]
        await env.reg.unpublish(MID)
        r = await env.get("/models/tiny/latest")
        assert r.status_code == 404 and err(r)["reason"] == "removed"
        assert len(err(r)["chain"]) == 2


async def test_auth_and_no_docs(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        for path in ("/models", "/models/x", "/aliases/x", "/scratch-sessions"):
            r = await env.http.get(env.url + path)
            assert r.status_code == 401 and err(r)["code"] == "unauthorized", path
            r = await env.get(path, who="nobody")
            assert r.status_code == 403 and err(r)["code"] == "forbidden", path
        r = await env.post("/models/x/invoke", {"request": {}}, who="reader")
        assert r.status_code == 403 and r.json()["ok"] is False
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert (await env.get(path)).status_code == 404, path


async def test_two_gateways_on_one_postgresql_store(tmp_path: Path, postgres_url: str,  # noqa: F811
                                                    ) -> None:
    async with router_served(tmp_path / "a", store_url=postgres_url) as a:
        async with router_served(tmp_path / "b", store_url=postgres_url,
                                 handler=a.handler) as b:
            assert (await b.get("/models")).json() == {"models": []}
            await publish(a.reg, tiny_gguf(tmp_path / "a"),
                          descriptor=a.loaded()["descriptor"])
            # published through a's registry; b's index sees it within its interval
            with trio.fail_after(5):
                rows = await _listed(b, MID)
            assert rows[0]["model_id"] == MID


def test_gateway_json_store_and_router_keys(tmp_path: Path) -> None:
    import json

    from aotx_trio.config import ConfigError, load_gateway_config, parse_gateway_config
    from aotx_trio.gateway.app import router_from_config

    cfg = parse_gateway_config({"store": "postgresql://u@h/db",
                                "router": {"index_refresh_s": 5, "max_inflight_invokes": 2}})
    assert cfg.store == "postgresql://u@h/db" and cfg.router.index_refresh_s == 5
    assert parse_gateway_config({}).store is None
    assert router_from_config(parse_gateway_config({}), None) is None  # type: ignore[arg-type]
    for bad, key in (({"router": {"index_refresh_s": 0}}, "router.index_refresh_s"),
                     ({"router": {"bogus": 1}}, "router.bogus"),
                     ({"store": " "}, "store")):
        with pytest.raises(ConfigError) as got:
            parse_gateway_config(bad)
        assert got.value.fields["key"] == key
    # a relative folder is resolved against the file's folder; a URL is kept
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"store": "data"}))
    assert load_gateway_config(path).store == str(tmp_path / "data")
    # router.upload is checked when the router is built
    with pytest.raises(ConfigError):
        router_from_config(parse_gateway_config({"store": str(tmp_path),
                                                 "router": {"upload": {"nope": 1}}}),
                           None)  # type: ignore[arg-type]


def test_metrics_route_templates_of_the_router() -> None:
    from aotx_trio.gateway.metrics import route_template
    assert route_template("/models") == "/models"
    assert route_template("/models/runs/a/b.json") == "/models/{target}"
    assert route_template("/models/runs/a/b.json/invoke") == "/models/{target}/invoke"
    assert route_template("/aliases/default/text") == "/aliases/{name}"
    assert route_template("/scratch-sessions") == "/scratch-sessions"
    assert route_template("/scratch-sessions/" + "0" * 36 + "/invoke") == \
        "/scratch-sessions/{session_id}/invoke"
    assert route_template("/modelsx") == "other"
