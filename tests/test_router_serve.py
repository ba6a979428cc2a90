"""``aotx serve`` registers the default models on a fresh data folder (the real
default Gemma GGUF and all-MiniLM-L6-v2), so invoke works out of the box through
``default/text`` and ``default/embedding``; a second start registers nothing new."""

from __future__ import annotations

import base64
import functools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import trio
from _gateway_env import short_dir
from _real import real_embedding_dir, real_gguf

from aotx_trio.identity import build_commit
from aotx_trio.native.embed import Embedder
from aotx_trio.registry.backends import open_store
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.runtime.pack import pack
from aotx_trio.serve import serve_embedded

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def real_runtime() -> Iterator[Path]:
    folder = short_dir()
    target = folder / "runtime.aotxccir"
    pack(target, models=[real_gguf()], embedding=real_embedding_dir(), shared=True,
         progress=False)
    yield target
    shutil.rmtree(folder, ignore_errors=True)


async def _serve_once(data: Path, capsys: pytest.CaptureFixture[str], token: str | None,
                      check: Any) -> str:
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(functools.partial(serve_embedded, data, "127.0.0.1:0",
                                                      shutdown=shutdown))
        if token is None:
            out = capsys.readouterr().out.splitlines()
            token = out[out.index("aotx serve: admin token (shown once, stored only as its "
                                  "SHA-256):") + 1].strip()
        async with httpx.AsyncClient(base_url=binds[0], timeout=120,
                                     headers={"Authorization": f"Bearer {token}"}) as http:
            await check(http)
        shutdown.set()
    return token


async def test_serve_registers_and_invokes_the_default_models(
        real_runtime: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = short_dir()
    try:
        data = root / "data"
        data.mkdir()
        os.link(real_runtime, data / "runtime.aotxccir")   # same file system: no copy

        async def first(http: httpx.AsyncClient) -> None:
            models = (await http.get("/models")).json()["models"]
            assert sorted(m["model_type"] for m in models) == ["embedding", "textgen"]
            chain = (await http.get("/aliases/default/text")).json()["chain"]
            assert chain[0]["target"].startswith("aotx/default/textgen/" + build_commit()[:12])
            d = (await http.get("/models/default/embedding")).json()
            assert d["servable"] is True and d["manifest"]["model_type"] == "embedding"

            r = await http.post("/models/default/text/invoke", json={"request": {
                "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}})
            assert r.status_code == 200, r.text
            body = r.json()
            [res] = body["results"]
            assert res["text"].strip() and 1 <= res["completion_tokens"] <= 8
            ident = body["identity"]
            assert ident["requested_alias"] == "default/text"
            assert ident["attestation"]["source_commit"] == build_commit()
            r = await http.post("/models/default/text/invoke", json={"request": {
                "prompt": "The capital of France is", "max_tokens": 4}})
            assert r.json()["ok"] is True and r.json()["results"][0]["prompt_tokens"] > 4

            texts = ["a cat sits on the mat", "the stock market fell today"]
            r = await http.post("/models/default/embedding/invoke",
                                json={"request": {"texts": texts}})
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["results"]) == 2 == len(body["identity"]["result_ids"])
            vecs = [np.frombuffer(base64.b64decode(x["embedding_b64"]), "<f4")
                    for x in body["results"]]
            assert all(v.shape == (384,) for v in vecs)
            assert [x["dimension"] for x in body["results"]] == [384, 384]
            with Embedder.load(real_embedding_dir()) as emb:
                want = emb.embed(texts)
            np.testing.assert_allclose(np.stack(vecs), want, atol=1e-5)

        token = await _serve_once(data, capsys, None, first)
        store = open_store(data=data)
        try:
            events = len(store.feed_read(0, 1000))
            # the embedding artifact the runtime reports is the folder's own store address
            art = store_artifact(store, real_embedding_dir())
            assert store.keys("published") == sorted(
                f"aotx/default/{k}/{build_commit()[:12]}-{s[:12]}"
                for k, s in (("embedding", art.sha256),
                             ("textgen", store_artifact(store, real_gguf()).sha256)))
        finally:
            store.close()

        async def second(http: httpx.AsyncClient) -> None:
            r = await http.post("/models/default/embedding/invoke",
                                json={"request": {"texts": ["again"]}})
            assert r.status_code == 200 and len(r.json()["results"]) == 1

        await _serve_once(data, capsys, token, second)
        store = open_store(data=data)
        try:
            assert len(store.feed_read(0, 1000)) == events    # nothing new
        finally:
            store.close()
        await _serve_once(data, capsys, token, functools.partial(_worked_example,
                                                                 data=data))
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _worked_example(http: httpx.AsyncClient, data: Path) -> None:
    """docs/formats/registry.md's worked example on ``aotx serve``: ``aotx registry
    publish`` over the default GGUF without ``--context`` (descriptor context 2048,
    the runtime's packed model another).  It is never ``servable`` while the runtime
    does not serve that descriptor (the reason says why); the first invoke loads the
    GGUF by the release's descriptor and is attested with it (never 502
    attestation_mismatch), and then it reads servable."""
    import json
    import subprocess
    import sys

    from aotx_trio.identity import descriptor_sha256

    mid = "runs/demo/r1/checkpoints/step-000200000.inference-gemma-r1.json"
    spec = data / "spec.json"
    spec.write_text(json.dumps({"spec_dsl": 2, "interaction": "request_response",
                                "params": [{"name": "prompt", "type": "string"},
                                           {"name": "max_tokens", "type": "integer",
                                            "default": 4}],
                                "results": {"fields": [
                                    {"name": "text", "type": "string"},
                                    {"name": "prompt_tokens", "type": "integer"},
                                    {"name": "completion_tokens", "type": "integer"},
                                    {"name": "finish_reason", "type": "string"}],
                                    "delivery": ["inline"]}}))
    proc = await trio.to_thread.run_sync(lambda: subprocess.run(
        [sys.executable, "-m", "aotx_trio", "registry", "publish", mid, "--artifact",
         str(real_gguf()), "--spec", str(spec), "--type", "textgen", "--release",
         "gemma-r1", "--data", str(data), "--json"],
        capture_output=True, text=True, timeout=240, env=dict(os.environ)))
    assert proc.returncode == 0, proc.stderr
    d = (await http.get(f"/models/{mid}")).json()
    assert (d["servable"], d["not_ready"]) == (False, "deployment")
    assert "context 2048 vs the loaded" in d["reason"]
    r = await http.post(f"/models/{mid}/invoke", json={"request": {
        "prompt": "The capital of France is", "max_tokens": 4}})
    assert r.status_code == 200, r.text
    desc = {"backend": "cpu", "threads": 0, "kv_page_tokens": 8, "context": 2048}
    assert r.json()["identity"]["attestation"]["descriptor_sha256"] == \
        descriptor_sha256(desc)
    assert (await http.get(f"/models/{mid}")).json()["servable"] is True
