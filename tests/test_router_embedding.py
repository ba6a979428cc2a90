"""Embedding invoke on a real hypercorn with the real all-MiniLM-L6-v2 in the runtime
(and the tiny text model): the tree-listing artifact address the runtime reports is
the store's, one float32 vector per text as ``embedding_b64``, contract violations,
and upload delivery to a local HTTPS server (trustme CA, loopback allowed through the
policy's configuration), with a failing batch reporting no results."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import synth_gguf as sg
import trustme
from _gateway_env import TINY, TINY_MODEL, short_dir
from _real import real_embedding_dir
from _router_env import RouterEnv, publish, router_served
from test_router_upload import Server, ca, https, local_policy  # noqa: F401  (fixtures)

from aotx_trio.native.embed import Embedder
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.router.spec.builtin import default_spec
from aotx_trio.runtime.pack import pack

pytestmark = pytest.mark.timeout(120)
EMB = "runs/demo/minilm/inference-minilm-r1.json"
TEXTS = ["a cat sits on the mat", "the stock market fell today", "ünïcödé ✓"]


@pytest.fixture(scope="module")
def runtime_with_embedding() -> Iterator[Path]:
    import shutil
    folder = short_dir()
    gguf = sg.write_model(folder / TINY_MODEL, TINY)
    target = folder / "runtime.aotxccir"
    pack(target, models=[gguf], embedding=real_embedding_dir(), shared=True, progress=False)
    yield target
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    with Embedder.load(real_embedding_dir()) as emb:
        return emb.embed(TEXTS)


async def _pub(env: RouterEnv) -> None:
    await publish(env.reg, real_embedding_dir(), model_id=EMB, release="minilm-r1",
                  model_type="embedding", spec=default_spec("embedding"),
                  descriptor=env.loaded("embedding")["descriptor"])


def fail(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.json()["ok"] is False and r.json()["error"]["code"] == code, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


async def test_embedding_inline(tmp_path: Path, runtime_with_embedding: Path,
                                reference: np.ndarray) -> None:
    async with router_served(tmp_path, ccir=runtime_with_embedding) as env:
        # the artifact address the runtime computes from its components is the store's
        art = await env.reg.run(store_artifact, env.reg.store, real_embedding_dir())
        assert env.loaded("embedding")["artifact_sha256"] == art.sha256
        await _pub(env)
        assert (await env.get(f"/models/{EMB}")).json()["servable"] is True
        r = await env.post(f"/models/{EMB}/invoke", {"request": {"texts": TEXTS}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert [set(x) for x in body["results"]] == [{"embedding_b64", "dimension"}] * 3
        got = np.stack([np.frombuffer(base64.b64decode(x["embedding_b64"]), "<f4")
                        for x in body["results"]])
        np.testing.assert_allclose(got, reference, atol=1e-5)
        assert len(body["identity"]["result_ids"]) == 3
        assert body["identity"]["release"] == "minilm-r1"

        for request, param in (({"texts": []}, "texts"), ({}, "texts"),
                               ({"texts": ["x"], "pooling": "max"}, "pooling"),
                               ({"texts": [1]}, "texts[0]")):
            e = fail(await env.post(f"/models/{EMB}/invoke", {"request": request}), 422,
                     "invalid_params")
            assert e["param"] == param, (request, e)


async def test_embedding_upload_delivery(tmp_path: Path, runtime_with_embedding: Path,
                                         reference: np.ndarray, https: Server,  # noqa: F811
                                         ca: tuple[trustme.CA, str]) -> None:  # noqa: F811
    policy = local_policy(https, ca[1])
    async with router_served(tmp_path, ccir=runtime_with_embedding, upload=policy) as env:
        await _pub(env)
        base = f"https://localhost:{https.port}"
        targets = [{"output_id": f"v{i}", "put_url": f"{base}/vec/{i}?X-Sig=secret"}
                   for i in range(3)]
        r = await env.post(f"/models/{EMB}/invoke", {"request": {"texts": TEXTS},
                                                     "output_targets": targets})
        assert r.status_code == 200, r.text
        assert r.json()["results"] == [{"output_id": f"v{i}", "dimension": 384}
                                       for i in range(3)]
        put = {path: body for _, path, body in https.received}
        for i in range(3):
            vec = np.frombuffer(put[f"/vec/{i}?X-Sig=secret"], "<f4")
            np.testing.assert_allclose(vec, reference[i], atol=1e-5)

        # one target fails: the batch reports no results, and no URL is echoed
        https.received.clear()
        bad = [*targets[:2], {"output_id": "v2", "put_url": f"{base}/fail?X-Sig=secret"}]
        r = await env.post(f"/models/{EMB}/invoke", {"request": {"texts": TEXTS},
                                                     "output_targets": bad})
        e = fail(r, 502, "upload_failed")
        assert "results" not in r.json() and "secret" not in r.text
        assert e["output_id"] == "v2"

        # refused before any work: the wrong count, http, another host
        https.received.clear()
        for wrong, rule in ((targets[:2], "count"),
                            ([*targets[:2], {"output_id": "v2", "put_url": "http://x/y"}],
                             None),
                            ([*targets[:2], {"output_id": "v2",
                                             "put_url": "https://evil.example/x"}], None)):
            e = fail(await env.post(f"/models/{EMB}/invoke",
                                    {"request": {"texts": TEXTS}, "output_targets": wrong}),
                     422, "invalid_params")
            assert rule is None or e["rule"] == rule
            assert "secret" not in str(e)
        assert https.received == []
