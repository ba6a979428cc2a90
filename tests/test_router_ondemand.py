"""On-demand loading (the stretch of issue 9): a release or scratch revision whose GGUF
the runtime has not loaded is exported from the store into the router's artifact
cache and loaded by the runtime's ``model.load`` call, then served with its identity;
the runtime refuses a file that does not hash to the artifact."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import synth_gguf as sg
from _gateway_env import TINY
from _router_env import TEXT_SPEC, publish, router_served

from aotx_trio import errors
from aotx_trio.identity import build_commit, descriptor_sha256
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.router.scratch import Scratch

pytestmark = pytest.mark.timeout(120)
PROMPT = {"request": {"prompt": "hello", "max_tokens": 3}}
DESC = {"backend": "cpu", "threads": 0, "kv_page_tokens": 8, "context": 512}


def other_gguf(folder: Path, seed: int) -> Path:
    """Another tiny model (other random weights): an artifact the runtime lacks."""
    folder.mkdir(parents=True, exist_ok=True)
    return sg.write_model(folder / f"other-{seed}.gguf", dataclasses.replace(TINY, seed=seed))


async def test_a_release_is_loaded_on_demand(tmp_path: Path) -> None:
    async with router_served(tmp_path, cache_dir=tmp_path / "cache") as env:
        path = other_gguf(tmp_path / "o", 7)
        await publish(env.reg, path, model_id="m/new", release="new-r1", descriptor=DESC)
        assert (await env.get("/models/m/new")).json()["not_ready"] == "deployment"
        r = await env.post("/models/m/new/invoke", PROMPT)
        assert r.status_code == 200, r.text
        att = r.json()["identity"]["attestation"]
        assert att["descriptor_sha256"] == descriptor_sha256(DESC)
        assert att["source_commit"] == build_commit()
        # loaded now: the detail route says so, the runtime reports it, a second
        # invoke loads nothing more
        assert (await env.get("/models/m/new")).json()["servable"] is True
        rows = [a for a in env.handler.models.identity() if a["name"].startswith("artifact-")]
        assert [a["descriptor"] for a in rows] == [DESC]
        assert (await env.post("/models/m/new/invoke", PROMPT)).status_code == 200
        assert len([m for m in env.handler.models if m.name.startswith("artifact-")]) == 1
        assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" /
                                                       f"{rows[0]['artifact_sha256']}.gguf"]


async def test_an_on_demand_model_serves_the_kv_type_of_its_release(tmp_path: Path) -> None:
    """A descriptor without kv_type (the releases minted before it) is served with f16
    KV, the runtime's default, and attested with its unchanged digest; one with
    ``kv_type: "f32"`` is served with float32 KV and attested with its own digest."""
    f32 = {**DESC, "kv_type": "f32"}
    async with router_served(tmp_path, cache_dir=tmp_path / "cache") as env:
        await publish(env.reg, other_gguf(tmp_path / "o", 21), model_id="m/default",
                      release="default-r1", descriptor=DESC)
        await publish(env.reg, other_gguf(tmp_path / "o", 22), model_id="m/f32",
                      release="f32-r1", descriptor=f32)
        assert descriptor_sha256(f32) != descriptor_sha256(DESC)
        for model_id, desc in (("m/default", DESC), ("m/f32", f32)):
            r = await env.post(f"/models/{model_id}/invoke", PROMPT)
            assert r.status_code == 200, r.text
            assert r.json()["identity"]["attestation"]["descriptor_sha256"] == \
                descriptor_sha256(desc)
        rows = {a["descriptor_sha256"]: a for a in env.handler.models.identity()
                if a["name"].startswith("artifact-")}
        assert rows[descriptor_sha256(DESC)]["descriptor"] == DESC
        assert rows[descriptor_sha256(DESC)]["kv_type"] == "f16"
        assert rows[descriptor_sha256(f32)]["descriptor"] == f32
        assert rows[descriptor_sha256(f32)]["kv_type"] == "f32"
        caps = await env.handler.call("capabilities", {})
        kv = {m["name"]: (m["kv_type"], m["kv_page_bytes"]) for m in caps["models"]
              if m["name"].startswith("artifact-")}
        by_row = {a["kv_type"]: kv[a["name"]] for a in rows.values()}
        assert by_row["f16"][0] == "f16" and by_row["f32"][0] == "f32"
        assert by_row["f16"][1] * 2 == by_row["f32"][1]
        elem = {m.name: m.engine.kv_stats().elem_bytes for m in env.handler.models
                if m.name.startswith("artifact-")}
        assert sorted(elem.values()) == [2, 4]


async def test_a_scratch_revision_is_loaded_on_demand(tmp_path: Path) -> None:
    async with router_served(tmp_path, cache_dir=tmp_path / "cache") as env:
        sc = Scratch(env.reg)
        s = await sc.open()
        art = await env.reg.run(store_artifact, env.reg.store, other_gguf(tmp_path / "o", 9))
        await sc.revise(s.session_id, spec=TEXT_SPEC, artifact=art, draft_manifest={
            "model_type": "textgen", "serving": {"runtime_release": {
                "name": "scratch", "source_commit": build_commit()}}})
        r = await env.post(f"/scratch-sessions/{s.session_id}/invoke", PROMPT)
        assert r.status_code == 200, r.text
        assert r.json()["identity"]["attestation"]["source_sha256"] == art.sha256


async def test_without_a_cache_nothing_is_loaded(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        await publish(env.reg, other_gguf(tmp_path / "o", 7), model_id="m/new",
                      release="new-r1", descriptor=DESC)
        r = await env.post("/models/m/new/invoke", PROMPT)
        assert r.status_code == 503 and r.json()["error"]["missing"] == ["deployment"]


async def test_the_runtime_checks_what_it_loads(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        path = other_gguf(tmp_path / "o", 7)
        params = {"principal": "invoker", "actions": ["models_invoke"], "path": str(path),
                  "artifact_sha256": "0" * 64, "descriptor": DESC}
        with pytest.raises(errors.InvalidInput) as got:
            await env.handler.call("model.load", params)
        assert got.value.code == "artifact_mismatch"
        for bad in ({"path": "relative.gguf"}, {"descriptor": {"threads": "x"}},
                    {"descriptor": {"gpu": 1}}, {"artifact_sha256": "XYZ"}):
            with pytest.raises(errors.InvalidInput):
                await env.handler.call("model.load", {**params, **bad})
        with pytest.raises(errors.InvalidInput) as got:
            await env.handler.call("model.load",
                                   {**params, "descriptor": {**DESC, "kv_type": "bf16"}})
        assert got.value.fields["field"] == "descriptor.kv_type"
        assert got.value.status == 422
        assert got.value.envelope()["error"]["field"] == "descriptor.kv_type"
        with pytest.raises(errors.Forbidden):
            await env.handler.call("model.load", {**params, "principal": "reader"})


async def test_a_missing_blob_is_502_blob_missing(tmp_path: Path) -> None:
    """The store lost the artifact's blob (a store-integrity failure): invoke answers
    502 blob_missing naming it, and falls back to nothing."""
    async with router_served(tmp_path, cache_dir=tmp_path / "cache") as env:
        path = other_gguf(tmp_path / "o", 11)
        await publish(env.reg, path, model_id="m/lost", release="lost-r1", descriptor=DESC)
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        blobs = [p for p in tmp_path.rglob(sha) if p.is_file()]
        assert blobs, "the folder store keeps the blob under its sha256"
        for blob in blobs:
            blob.unlink()
        r = await env.post("/models/m/lost/invoke", PROMPT)
        assert r.status_code == 502, r.text
        body = r.json()
        assert body["ok"] is False
        assert (body["error"]["code"], body["error"]["missing"]) == ("blob_missing", [sha])
        assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())


async def test_a_release_over_the_loaded_artifact_is_served_as_its_descriptor_says(
        tmp_path: Path) -> None:
    """The worked example (docs/formats/registry.md): ``aotx registry publish`` without
    ``--context`` over the GGUF the runtime already serves with another context.  The
    detail route does not claim it servable before the runtime serves that descriptor
    (it says why); the invoke loads the artifact by the release's descriptor and is
    attested with it; a second descriptor of the same artifact loads beside it."""
    import json
    import os
    import subprocess
    import sys

    from _router_env import tiny_gguf

    async with router_served(tmp_path, store_dir=tmp_path / "data",
                             cache_dir=tmp_path / "cache") as env:
        loaded = env.loaded()["descriptor"]
        assert loaded["context"] != 2048        # the publish default differs
        (tmp_path / "spec.json").write_text(json.dumps(TEXT_SPEC))
        proc = subprocess.run(
            [sys.executable, "-m", "aotx_trio", "registry", "publish", "m/example",
             "--artifact", str(tiny_gguf(tmp_path)), "--spec", str(tmp_path / "spec.json"),
             "--type", "textgen", "--release", "example-r1", "--data",
             str(tmp_path / "data"), "--json"],
            capture_output=True, text=True, timeout=120, env=dict(os.environ))
        assert proc.returncode == 0, proc.stderr
        detail = (await env.get("/models/m/example")).json()
        assert detail["servable"] is False and detail["not_ready"] == "deployment"
        assert f"context 2048 vs the loaded {loaded['context']}" in detail["reason"]
        assert "the first invoke loads it on demand" in detail["reason"]

        r = await env.post("/models/m/example/invoke", PROMPT)
        assert r.status_code == 200, r.text
        want = descriptor_sha256({**loaded, "context": 2048})
        assert r.json()["identity"]["attestation"]["descriptor_sha256"] == want
        detail = (await env.get("/models/m/example")).json()
        assert detail["servable"] is True and "not_ready" not in detail
        assert DESC["context"] not in (loaded["context"], 2048)
        await publish(env.reg, tiny_gguf(tmp_path), model_id="m/example-512",
                      release="example-512", descriptor=DESC)
        r = await env.post("/models/m/example-512/invoke", PROMPT)
        assert r.status_code == 200, r.text
        rows = sorted(a["descriptor"]["context"] for a in env.handler.models.identity()
                      if a["kind"] == "textgen")
        assert rows == sorted([loaded["context"], 2048, DESC["context"]])
        assert (await env.post("/models/m/example/invoke", PROMPT)).status_code == 200


async def test_without_a_cache_another_descriptor_is_not_ready_with_the_reason(
        tmp_path: Path) -> None:
    from _router_env import tiny_gguf

    async with router_served(tmp_path) as env:
        loaded = env.loaded()["descriptor"]
        await publish(env.reg, tiny_gguf(tmp_path), model_id="m/t3", release="t3",
                      descriptor={**loaded, "threads": 3})
        detail = (await env.get("/models/m/t3")).json()
        assert (detail["servable"], detail["not_ready"]) == (False, "deployment")
        assert "threads 3 vs the loaded 0" in detail["reason"]
        r = await env.post("/models/m/t3/invoke", PROMPT)
        assert r.status_code == 503, r.text
        err = r.json()["error"]
        assert err["code"] == "not_ready" and err["missing"] == ["deployment"]
        assert "threads 3 vs the loaded 0" in err["message"]


async def test_a_corrupt_artifact_is_a_permanent_error_naming_it(tmp_path: Path) -> None:
    """A 4 KB file starting with ``GGUF``: the runtime cannot read it, so every invoke
    is 502 ``artifact_unloadable`` naming the artifact and why (never 503 ``not_ready``
    with a retry), and the detail route says it is not servable and why."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(range(256)) * 16)
    bad.write_bytes(bad.read_bytes()[:4096])
    sha = hashlib.sha256(bad.read_bytes()).hexdigest()
    async with router_served(tmp_path, cache_dir=tmp_path / "cache") as env:
        await publish(env.reg, bad, model_id="m/bad", release="bad-r1", descriptor=DESC)
        for _ in range(2):
            r = await env.post("/models/m/bad/invoke", PROMPT)
            assert r.status_code == 502, r.text
            err = r.json()["error"]
            assert (err["code"], err["artifact"]) == ("artifact_unloadable", sha)
            assert err["reason"].startswith("gguf_version_unsupported") and sha in \
                err["message"]
            assert "retry_after" not in err and "retry-after" not in r.headers
        detail = (await env.get("/models/m/bad")).json()
        assert (detail["servable"], detail["not_ready"]) == (False, "artifact_unloadable")
        assert detail["reason"].startswith("gguf_version_unsupported")
        assert not [a for a in env.handler.models.identity()
                    if a["artifact_sha256"] == sha]
