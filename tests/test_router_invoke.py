"""POST /models/{id-or-alias}/invoke on a real hypercorn with the tiny synthetic model:
the seed's response shape and identity (alias requests included), the attestation
check, and every error of the seed's table that a released invoke can reach."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _router_env import MID, RouterEnv, publish, router_served, tiny_gguf

from aotx_trio.identity import build_commit
from aotx_trio.registry.records import EngineSet
from aotx_trio.router.aliases import set_alias
from aotx_trio.router.service import Settings

pytestmark = pytest.mark.timeout(120)

PROMPT = {"request": {"prompt": "hello there"}}


def fail(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["ok"] is False and body["error"]["code"] == code, body
    err: dict[str, Any] = body["error"]
    return err


async def _pub(env: RouterEnv, tmp_path: Path, **kw: Any) -> None:
    kw.setdefault("descriptor", env.loaded()["descriptor"])
    await publish(env.reg, tiny_gguf(tmp_path), **kw)


async def test_textgen_invoke_shape_and_identity(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        await _pub(env, tmp_path)
        r = await env.post(f"/models/{MID}/invoke", PROMPT)
        assert r.status_code == 200, r.text
        body = r.json()
        assert set(body) == {"ok", "error", "results", "identity"}
        assert body["ok"] is True and body["error"] is None
        [res] = body["results"]
        assert set(res) == {"text", "prompt_tokens", "completion_tokens", "finish_reason"}
        assert isinstance(res["text"], str) and res["prompt_tokens"] > 0
        assert 1 <= res["completion_tokens"] <= 4          # the spec's default max_tokens
        assert res["finish_reason"] in ("stop", "length")
        ident = body["identity"]
        view = await env.reg.get_model(MID)
        rel = (await env.reg.get_release("tiny-r1")).release
        assert ident["model_id"] == MID and ident["release"] == "tiny-r1"
        assert ident["source_commit"] == build_commit()
        assert ident["attestation"] == {
            "kind": "release", "release": "tiny-r1", "source_commit": build_commit(),
            "descriptor_sha256": rel.descriptor_sha256,
            "manifest_sha256": view.manifest_sha256, "engine_set_sha256": None, "gpu": None}
        assert str(uuid.UUID(ident["request_id"])) == ident["request_id"]
        assert len(ident["result_ids"]) == 1 and isinstance(ident["timing_ms"], int)
        assert "requested_alias" not in ident and "resolution_chain" not in ident

        # the same through a two-level alias chain
        await set_alias(env.reg, "tiny/first-light", MID, 0)
        await set_alias(env.reg, "tiny/latest", "tiny/first-light", 1)
        r = await env.post("/models/tiny/latest/invoke",
                           {"request": {"prompt": "hi", "max_tokens": 2}})
        ident = r.json()["identity"]
        assert ident["requested_alias"] == "tiny/latest" and ident["model_id"] == MID
        assert ident["resolution_chain"] == [
            {"name": "tiny/latest", "level": 1, "target": "tiny/first-light"},
            {"name": "tiny/first-light", "level": 0, "target": MID}]
        assert r.json()["results"][0]["completion_tokens"] <= 2


async def test_lookup_and_state_errors(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        fail(await env.post("/models/runs/none.json/invoke", PROMPT), 404, "model_not_found")
        await _pub(env, tmp_path)
        man = (await env.reg.get_model(MID)).manifest.model_dump(mode="json")
        await env.reg.put_manifest("runs/never.json", man)
        e = fail(await env.post("/models/runs/never.json/invoke", PROMPT), 404,
                 "model_not_found")
        assert e["reason"] == "unpublished"
        e = fail(await env.post("/models/a/b/invoke", PROMPT), 404, "model_not_found")
        await set_alias(env.reg, "tiny/dangling", "tiny/gone", 1, verify=False)
        e = fail(await env.post("/models/tiny/dangling/invoke", PROMPT), 404,
                 "alias_unresolved")
        assert e["chain"] == [{"name": "tiny/dangling", "level": 1, "target": "tiny/gone"}]

        # disabled model: 403 with its successor, never served by the successor
        await _pub(env, tmp_path, model_id="m/next", release="tiny-r1")
        await env.reg.set_model_state(MID, "disabled", "m/next")
        e = fail(await env.post(f"/models/{MID}/invoke", PROMPT), 403, "model_disabled")
        assert e["successor_id"] == "m/next"
        await env.reg.set_model_state(MID, "deprecated")     # deprecated still serves
        assert (await env.post(f"/models/{MID}/invoke", PROMPT)).json()["ok"] is True

        # disabled release
        await _pub(env, tmp_path, model_id="m/r2", release="tiny-r2",
                   source_commit="e" * 40)
        await env.reg.set_release_state("tiny-r1", "disabled", "tiny-r2")
        e = fail(await env.post(f"/models/{MID}/invoke", PROMPT), 403, "release_disabled")
        assert e["successor"] == "tiny-r2"

        await env.reg.unpublish("m/next")
        e = fail(await env.post("/models/m/next/invoke", PROMPT), 410, "model_removed")
        assert e["removed_at"].endswith("Z")


async def test_readiness_and_attestation(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF" + bytes(64))
        await publish(env.reg, other, model_id="m/other", release="other-r1")
        e = fail(await env.post("/models/m/other/invoke", PROMPT), 503, "not_ready")
        assert e["missing"] == ["deployment"]
        await _pub(env, tmp_path, model_id="m/h100", release="tiny-h100",
                   engine_set=EngineSet(name="H100", sha256="ab" * 32))
        e = fail(await env.post("/models/m/h100/invoke", PROMPT), 503, "not_ready")
        assert e["missing"] == ["engine_set(H100)"]
        r = await env.post("/models/m/h100/invoke", PROMPT)
        assert r.headers["retry-after"] == "1"

        # another build's release over the loaded artifact
        await _pub(env, tmp_path, model_id="m/old-build", release="tiny-old",
                   source_commit="f" * 40)
        e = fail(await env.post("/models/m/old-build/invoke", PROMPT), 502,
                 "attestation_mismatch")
        assert e["mismatches"] == [{"field": "source_commit", "expected": "f" * 40,
                                    "observed": build_commit()}]
        # other engine settings over the loaded artifact: not served as the release
        # says (no artifact cache to load it by its descriptor)
        desc = {**env.loaded()["descriptor"], "threads": 3}
        await _pub(env, tmp_path, model_id="m/threads", release="tiny-t3", descriptor=desc)
        e = fail(await env.post("/models/m/threads/invoke", PROMPT), 503, "not_ready")
        assert e["missing"] == ["deployment"] and "threads 3 vs the loaded" in e["message"]


async def test_invalid_params(tmp_path: Path) -> None:
    async with router_served(tmp_path) as env:
        await _pub(env, tmp_path)
        cases = [({"request": {"prompt": "x", "voice": "a"}}, "voice"),
                 ({"request": {"prompt": "x"}, "extra": 1}, "extra"),
                 ({"prompt": "x"}, "prompt"),
                 ({"request": "x"}, "request"),
                 ([], "body")]
        for body, param in cases:
            e = fail(await env.post(f"/models/{MID}/invoke", body), 422, "invalid_params")
            assert e["param"] == param and e["rule"], body
        r = await env.http.post(f"{env.url}/models/{MID}/invoke", content=b"{nope",
                                headers={"Authorization": "Bearer token-invoker-0123456789abcdef",
                                         "Content-Type": "application/json"})
        # a body that is not JSON: 400 malformed_json, as on every route (issue 25 item 14)
        assert r.status_code == 400 and r.json()["ok"] is False
        assert r.json()["error"]["code"] == "malformed_json"
        r = await env.http.post(f"{env.url}/models/{MID}/invoke", content=b'{"a":"\xff"}',
                                headers={"Authorization": "Bearer token-invoker-0123456789abcdef",
                                         "Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["ok"] is False
        assert (r.json()["error"]["code"], r.json()["error"]["offset"]) == ("invalid_utf8", 6)


async def test_over_capacity(tmp_path: Path) -> None:
    async with router_served(tmp_path, settings=Settings(index_refresh_s=1,
                                                         max_inflight_invokes=1)) as env:
        await _pub(env, tmp_path)
        got: list[httpx.Response] = []

        async def one() -> None:
            got.append(await env.post(f"/models/{MID}/invoke",
                                      {"request": {"prompt": "count", "max_tokens": 64}}))

        async with trio.open_nursery() as nursery:
            for _ in range(12):
                nursery.start_soon(one)
        codes = sorted(r.status_code for r in got)
        assert 200 in codes and 429 in codes, codes
        busy = next(r for r in got if r.status_code == 429)
        assert busy.headers["retry-after"] == "1"
        e = fail(busy, 429, "over_capacity")
        assert e["retry_after"] == 1


async def test_over_the_service_socket(tmp_path: Path) -> None:
    """The split deployment's transport: identity, chat.generate and the attestation
    check over the runtime's Unix socket."""
    async with router_served(tmp_path, socket=True) as env:
        await _pub(env, tmp_path)
        r = await env.post(f"/models/{MID}/invoke", {"request": {"prompt": "hi",
                                                                 "max_tokens": 3}})
        assert r.status_code == 200, r.text
        assert r.json()["identity"]["attestation"]["source_commit"] == build_commit()
        await _pub(env, tmp_path, model_id="m/old-build", release="tiny-old",
                   source_commit="f" * 40)
        fail(await env.post("/models/m/old-build/invoke", PROMPT), 502, "attestation_mismatch")


async def test_a_broken_result_contract_is_upstream_failure(tmp_path: Path) -> None:
    """A spec declaring a result field the runtime does not produce: the runtime broke
    the contract, so the router reports no results (502 upstream_failure)."""
    from _router_env import TEXT_SPEC
    spec = {**TEXT_SPEC, "results": {**TEXT_SPEC["results"], "fields": [
        *TEXT_SPEC["results"]["fields"], {"name": "score", "type": "number"}]}}
    async with router_served(tmp_path) as env:
        await _pub(env, tmp_path, spec=spec)
        r = await env.post(f"/models/{MID}/invoke", PROMPT)
        fail(r, 502, "upstream_failure")
        assert "results" not in r.json()


async def test_an_embedding_model_the_runtime_did_not_load(tmp_path: Path) -> None:
    """The tiny runtime file's stub embedding folder does not load: an embedding model on
    it is not deployed here (detail: not_ready; invoke: 503, never another model)."""
    from aotx_trio.router.spec.builtin import default_spec
    async with router_served(tmp_path) as env:
        await publish(env.reg, tmp_path / "rt" / "embedding", model_id="m/emb",
                      release="emb-r1", model_type="embedding", spec=default_spec("embedding"))
        assert (await env.get("/models/m/emb")).json()["not_ready"] == "deployment"
        e = fail(await env.post("/models/m/emb/invoke", {"request": {"texts": ["x"]}}), 503,
                 "not_ready")
        assert e["missing"] == ["deployment"]


async def test_a_context_overflow_names_the_field_it_came_from(tmp_path: Path) -> None:
    """A ``prompt`` over the model's context is 422 naming ``prompt`` (the runtime's
    rule ``context_length_exceeded``), never ``messages``; a prompt that fits with a
    ``max_tokens`` that does not names ``max_tokens``."""
    async with router_served(tmp_path) as env:
        await _pub(env, tmp_path)
        context = env.loaded()["descriptor"]["context"]
        long = " ".join(["word"] * (context + 16))
        e = fail(await env.post(f"/models/{MID}/invoke", {"request": {"prompt": long}}),
                 422, "invalid_params")
        assert (e["param"], e["rule"]) == ("prompt", "context_length_exceeded")
        e = fail(await env.post(f"/models/{MID}/invoke",
                                {"request": {"prompt": "hi", "max_tokens": context}}),
                 422, "invalid_params")
        assert (e["param"], e["rule"]) == ("max_tokens", "context_length_exceeded")
