"""Scratch sessions over HTTP (real hypercorn, tiny model): the session routes, invoke
of the current verified revision with the disjoint scratch identity, the lease
renewed by each invoke, stop/promote/not-ready errors; and the lease running out
under a MockClock: scratch_expired, then (after the reaper) scratch_closed with
reason expired."""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from _gateway_env import make_config, make_runtime_file, short_dir
from _router_env import TEXT_SPEC, router_served, tiny_gguf

from aotx_trio import errors
from aotx_trio.identity import build_commit
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.records import parse_time, rfc3339
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.router.dispatch import Caller
from aotx_trio.router.registry import Registry
from aotx_trio.router.service import RouterService, Settings
from aotx_trio.runtime import boot
from aotx_trio.service.client import InProcessClient

pytestmark = pytest.mark.timeout(120)
PROMPT = {"request": {"prompt": "hello", "max_tokens": 3}}
T0 = 1_800_000_000.0


def fail(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.json()["ok"] is False and r.json()["error"]["code"] == code, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


def draft() -> dict[str, Any]:
    return {"model_type": "textgen",
            "serving": {"runtime_release": {"name": "scratch", "source_commit": build_commit()}}}


async def _session(reg: Registry, artifact: Path | None, lease_s: int = 900) -> str:
    from aotx_trio.router.scratch import Scratch
    sc = Scratch(reg)
    s = await sc.open(lease_s=lease_s, based_on={"requested_selection": "demo/last",
                                                 "resolved_source": {}})
    if artifact is not None:
        art = await reg.run(store_artifact, reg.store, artifact)
        await sc.revise(s.session_id, spec=TEXT_SPEC, artifact=art, draft_manifest=draft())
    return s.session_id


async def test_scratch_routes_and_invoke(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        sid = await _session(env.reg, tiny_gguf(tmp_path))
        listed = (await env.get("/scratch-sessions")).json()["sessions"]
        assert [s["session_id"] for s in listed] == [sid]
        got = (await env.get(f"/scratch-sessions/{sid}")).json()
        assert got["session"]["state"] == "open" and got["spec"] == TEXT_SPEC
        rev_id = got["revision_id"]
        before = got["session"]["lease_expires_at"]
        await trio.sleep(0.01)

        r = await env.post(f"/scratch-sessions/{sid}/invoke", PROMPT)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["ok"] is True and len(body["results"]) == 1
        ident = body["identity"]
        # disjoint from release identity: never a model id, release or commit
        assert not {"model_id", "release", "source_commit"} & set(ident)
        assert ident["provenance"] == {"kind": "scratch"} and ident["session_id"] == sid
        assert ident["based_on"] == {"requested_selection": "demo/last", "resolved_source": {}}
        att = ident["attestation"]
        assert att["kind"] == "scratch" and att["revision_id"] == rev_id
        assert att["generation"] == 1 and att["engine_set_sha256"] is None
        rev = got["revision"]
        assert att["spec_sha256"] == rev["spec_sha256"]
        assert att["draft_manifest_sha256"] == rev["draft_manifest_sha256"]
        assert att["source_sha256"] == rev["artifact"]["sha256"]
        assert att["dependency_recipe_sha256"] == env.loaded()["descriptor_sha256"]
        assert len(ident["result_ids"]) == 1
        after = (await env.get(f"/scratch-sessions/{sid}")).json()["session"]
        assert parse_time(after["lease_expires_at"]) > parse_time(before)   # renewed

        for bad in ("not-a-uuid", "0B6F5A0E-5D8E-4C1B-9A3E-2F1D7C9B8A61",
                    "0b6f5a0e-5d8e-4c1b-9a3e-2f1d7c9b8a61"):
            fail(await env.post(f"/scratch-sessions/{bad}/invoke", PROMPT), 404,
                 "scratch_not_found")
            assert (await env.get(f"/scratch-sessions/{bad}")).status_code == 404
        r = await env.get("/scratch-sessions?active=maybe")
        assert r.status_code == 422 and r.json()["error"]["param"] == "active"
        e = fail(await env.post(f"/scratch-sessions/{sid}/invoke",
                                {"request": {"prompt": "x", "voice": 1}}), 422, "invalid_params")
        assert e["param"] == "voice"


async def test_scratch_errors(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        empty = await _session(env.reg, None)
        e = fail(await env.post(f"/scratch-sessions/{empty}/invoke", PROMPT), 503,
                 "scratch_not_ready")
        assert e["missing"] == ["revision"]
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF" + bytes(32))
        unloaded = await _session(env.reg, other)
        e = fail(await env.post(f"/scratch-sessions/{unloaded}/invoke", PROMPT), 503,
                 "scratch_not_ready")
        assert e["missing"] == ["deployment"]

        from aotx_trio.router.scratch import Scratch
        sc = Scratch(env.reg)
        stopped = await _session(env.reg, tiny_gguf(tmp_path))
        await sc.stop(stopped)
        e = fail(await env.post(f"/scratch-sessions/{stopped}/invoke", PROMPT), 410,
                 "scratch_closed")
        assert e["reason"] == "stopped" and e["promoted_to"] is None

        promoted = await _session(env.reg, tiny_gguf(tmp_path))
        desc = env.loaded()["descriptor"]
        from aotx_trio.identity import Descriptor
        await sc.promote(promoted, "runs/scratch/promoted.json", release="tiny-promoted",
                         source_commit=build_commit(), descriptor=Descriptor(**desc))
        e = fail(await env.post(f"/scratch-sessions/{promoted}/invoke", PROMPT), 410,
                 "scratch_closed")
        assert e["reason"] == "promoted" and e["promoted_to"] == "runs/scratch/promoted.json"
        # the promoted model is a released model now, with release identity
        r = await env.post("/models/runs/scratch/promoted.json/invoke", PROMPT)
        assert r.status_code == 200 and r.json()["identity"]["release"] == "tiny-promoted"
        closed = (await env.get("/scratch-sessions?active=false")).json()["sessions"]
        assert {s["session_id"] for s in closed} >= {stopped, promoted}
        assert stopped not in {s["session_id"] for s in
                               (await env.get("/scratch-sessions")).json()["sessions"]}


class ManualClock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


async def test_lease_expiry_then_reaped(tmp_path: Path,
                                        autojump_clock: trio.testing.MockClock) -> None:
    """The registry's time is a manual clock; the reaper sleeps on the MockClock."""
    folder = short_dir()
    clock = ManualClock()
    store = open_store(data=tmp_path / "data")
    try:
        ccir = make_runtime_file(tmp_path / "rt")
        make_config(folder, {"invoker": ("models_read", "models_invoke")})
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(boot.run_runtime, ccir, folder / "journal",
                                          folder / "grants")
            reg = Registry(store, now=clock)
            svc = RouterService(reg, InProcessClient(handler), Settings(reap_interval_s=30))
            sid = await _session(reg, tiny_gguf(tmp_path), lease_s=60)
            caller = Caller("invoker", ("models_read", "models_invoke"))

            clock.t = T0 + 50
            assert (await svc.scratch_invoke(sid, PROMPT, caller))["ok"] is True
            clock.t = T0 + 100                    # past the first lease: renewed at +50
            assert (await svc.scratch_invoke(sid, PROMPT, caller))["ok"] is True
            clock.t = T0 + 160.5                  # the lease renewed at +100 ran out at +160
            with pytest.raises(errors.Gone) as got:
                await svc.scratch_invoke(sid, PROMPT, caller)
            assert got.value.code == "scratch_expired"
            assert got.value.fields["expired_at"] == rfc3339(T0 + 160)
            assert (await svc.scratch.get(sid)).state == "open"     # not reaped yet

            await nursery.start(svc._reaper)
            await trio.sleep(30)          # one reaper interval passes (MockClock)
            # freeze the clock: the reaper's store writes finish in real time (a thread)
            autojump_clock.autojump_threshold = math.inf
            for _ in range(3000):
                if (await svc.scratch.get(sid)).state == "closed":
                    break
                await trio.to_thread.run_sync(time.sleep, 0.01)
            with pytest.raises(errors.Gone) as got:
                await svc.scratch_invoke(sid, PROMPT, caller)
            assert got.value.code == "scratch_closed"
            assert got.value.fields["reason"] == "expired"
            assert (await svc.scratch.get(sid)).closed_at == rfc3339(T0 + 160.5)
            nursery.cancel_scope.cancel()
    finally:
        store.close()
        shutil.rmtree(folder, ignore_errors=True)


async def test_scratch_routes_need_models_read(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        sid = await _session(env.reg, None)
        r = await env.get(f"/scratch-sessions/{sid}", who="nobody")
        assert r.status_code == 403
        r = await env.post(f"/scratch-sessions/{sid}/invoke", PROMPT, who="reader")
        assert r.status_code == 403 and r.json()["ok"] is False





async def test_expired_then_closed_over_http(tmp_path: Path) -> None:
    clock = ManualClock()
    async with router_served(tmp_path, now=clock) as env:
        sid = await _session(env.reg, tiny_gguf(tmp_path), lease_s=60)
        clock.t = T0 + 61
        e = fail(await env.post(f"/scratch-sessions/{sid}/invoke", PROMPT), 410,
                 "scratch_expired")
        assert e["expired_at"] == rfc3339(T0 + 60)
        await env.router.scratch.reap()          # what the reaper task does each interval
        e = fail(await env.post(f"/scratch-sessions/{sid}/invoke", PROMPT), 410,
                 "scratch_closed")
        assert e["reason"] == "expired" and e["promoted_to"] is None


async def test_lease_s_is_always_an_integer(tmp_path: Path) -> None:
    """``lease_s`` reads as whole seconds on every route: a new session's, and one an
    older build stored with a fractional lease (rounded up); opening with a
    non-integer lease is refused naming ``lease_s``."""
    import json

    from aotx_trio.identity import canonical
    from aotx_trio.router.scratch import Scratch

    async with router_served(tmp_path) as env:
        sid = await _session(env.reg, None, lease_s=60)
        old = await _session(env.reg, None)
        env.reg.store.update("sessions", old, lambda b: canonical(
            {**json.loads(b), "lease_s": 90.25}))
        got = {s["session_id"]: s["lease_s"]
               for s in (await env.get("/scratch-sessions")).json()["sessions"]}
        assert got == {sid: 60, old: 91}
        assert all(type(v) is int for v in got.values())
        assert type((await env.get(f"/scratch-sessions/{old}")).json()["session"]
                    ["lease_s"]) is int
        for bad in (1.5, 0, True):
            with pytest.raises(errors.InvalidParams) as info:
                await Scratch(env.reg).open(lease_s=bad)  # type: ignore[arg-type]
            assert info.value.fields["param"] == "lease_s"
