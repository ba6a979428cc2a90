"""POST /v1/embeddings with the official ``openai`` client as a black box (unchanged but
for base_url and api_key) against a real hypercorn on loopback, on a runtime file
holding the real all-MiniLM-L6-v2: vectors equal the embedder's alone, in both
encodings; GET /v1/models lists the embedding model; errors in OpenAI's terms."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import synth_gguf as sg
import trio
from _gateway_env import ALL, LINEAGE, TINY, TINY_MODEL, served, token_for
from _real import real_embedding_dir

from aotx_trio.native.embed import Embedder
from aotx_trio.runtime import pack

pytestmark = pytest.mark.timeout(240)
INVOKER = (*ALL, "models_invoke", "models_read")
TEXTS = ["A cat sits on the mat.", "Ein Hund läuft im Park.", ""]


@pytest.fixture(scope="module")
def ccir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rt-embed")
    gguf = sg.write_model(folder / TINY_MODEL, TINY)
    target = folder / "runtime.aotxccir"
    pack.pack(target, models=[gguf], embedding=real_embedding_dir(), shared=True,
              lineage=LINEAGE, progress=False)
    return target


@cache
def embedder() -> Embedder:
    return Embedder.load(real_embedding_dir())


def _client(url: str, who: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token_for(who), max_retries=0,
                         timeout=60)


async def test_embeddings_equal_the_embedder_alone(tmp_path: Path, ccir: Path) -> None:
    async with served(tmp_path, {"alice": INVOKER}, ccir=ccir) as srv:
        def run() -> tuple[Any, Any, Any, Any]:
            c = _client(srv.url)
            models = c.models.list()
            default = c.embeddings.create(model="embedding", input=TEXTS)   # base64 wire
            floats = c.embeddings.create(model="embedding", input=TEXTS[0],
                                         encoding_format="float")
            return models, default, floats, None

        models, default, floats, _ = await trio.to_thread.run_sync(run)
        async with httpx.AsyncClient(base_url=srv.url) as http:
            raw = await http.post("/v1/embeddings", json={
                "model": "embedding", "input": TEXTS[:2], "encoding_format": "float"},
                headers={"Authorization": f"Bearer {token_for('alice')}"})
    assert {m.id for m in models.data} == {TINY_MODEL, "embedding"}
    want = embedder().embed(TEXTS)
    assert [d.index for d in default.data] == [0, 1, 2]
    for d, w in zip(default.data, want, strict=True):
        assert np.allclose(np.asarray(d.embedding, dtype=np.float32), w, atol=1e-6)
        assert len(d.embedding) == 384
    assert np.allclose(np.asarray(floats.data[0].embedding, dtype=np.float32), want[0],
                       atol=1e-6)
    tokens = sum(len(embedder().tokenize(t)) for t in TEXTS)
    assert default.usage.prompt_tokens == tokens == default.usage.total_tokens
    assert default.model == "embedding"
    body = raw.json()
    assert raw.status_code == 200 and body["object"] == "list"
    assert body["data"][1]["object"] == "embedding"
    assert np.allclose(np.asarray(body["data"][1]["embedding"], dtype=np.float32), want[1],
                       atol=1e-6)


async def test_embedding_errors_in_openai_terms(tmp_path: Path, ccir: Path) -> None:
    people = {"alice": INVOKER, "reader": ("shared_read", "models_read")}
    long: dict[str, Any] = {}
    async with served(tmp_path, people, ccir=ccir) as srv:
        def run() -> list[tuple[type[Exception], str | None]]:
            c = _client(srv.url)
            seen: list[tuple[type[Exception], str | None]] = []
            calls: list[Any] = [
                lambda: c.embeddings.create(model="nope", input="x"),
                lambda: c.embeddings.create(model="embedding", input=[]),
                lambda: c.embeddings.create(model="embedding", input=[[1, 2, 3]]),
                lambda: c.embeddings.create(model="embedding", input="x", dimensions=12),
                lambda: c.embeddings.create(model="embedding", input="x",
                                            extra_body={"bogus": 1}),
                lambda: c.embeddings.create(model="embedding",
                                            input=["short", "word " * 300]),
                lambda: c.embeddings.create(model="embedding", input="word " * 254),
                lambda: _client(srv.url, "reader").embeddings.create(model="embedding",
                                                                     input="x"),
                lambda: _client(srv.url, "nobody").embeddings.create(model="embedding",
                                                                     input="x"),
            ]
            for call in calls:
                try:
                    call()
                    seen.append((type(None), None))
                except openai.APIStatusError as exc:
                    body = exc.body if isinstance(exc.body, dict) else {}
                    seen.append((type(exc), body.get("code")))
                    if body.get("code") == "context_length_exceeded":
                        long.update(body)
            return seen


        seen = await trio.to_thread.run_sync(run)
    assert seen == [
        (openai.NotFoundError, "model_not_found"),
        (openai.BadRequestError, "invalid_parameter"),
        (openai.BadRequestError, "invalid_parameter"),
        (openai.BadRequestError, "unsupported_parameter"),
        (openai.BadRequestError, "unsupported_parameter"),
        (openai.BadRequestError, "context_length_exceeded"),   # not silently cut
        (type(None), None),                                     # exactly the limit
        (openai.PermissionDeniedError, "forbidden"),
        (openai.AuthenticationError, "invalid_api_key"),
    ]
    assert (long["param"], long["limit"], long["type"]) == \
        ("input.1", 256, "invalid_request_error")
    assert "256 tokens" in long["message"]
    # the limit exactly (embedded above): 254 word pieces and [CLS], [SEP]
    assert len(embedder().tokenize("word " * 254)) == 256
