"""The runtime's calls for the serving router (runtime/handler.py, runtime/served.py):
``identity`` (build commit, loaded artifacts and descriptors), ``embed`` (the
embedding model loaded from the runtime file), and ``chat.generate`` with a raw
``prompt`` and its run identity."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import synth_gguf as sg
import trio
from _gateway_env import TINY, TINY_MODEL, make_config, make_runtime_file, short_dir
from _real import real_embedding_dir

from aotx_trio import errors
from aotx_trio.identity import build_commit, descriptor_sha256
from aotx_trio.native.embed import Embedder
from aotx_trio.runtime import boot
from aotx_trio.runtime.handler import ServiceHandler
from aotx_trio.runtime.pack import pack
from aotx_trio.service.client import InProcessClient

pytestmark = pytest.mark.timeout(120)
INVOKE = {"principal": "inv", "actions": ["models_invoke"]}


@pytest.fixture(scope="module")
def with_embedding() -> Iterator[Path]:
    folder = short_dir()
    gguf = sg.write_model(folder / TINY_MODEL, TINY)
    target = folder / "runtime.aotxccir"
    pack(target, models=[gguf], embedding=real_embedding_dir(), shared=True, progress=False)
    yield target
    shutil.rmtree(folder, ignore_errors=True)


@contextlib.asynccontextmanager
async def runtime(ccir: Path) -> AsyncIterator[tuple[ServiceHandler, Path]]:
    folder = short_dir()
    try:
        make_config(folder, {"inv": ("models_invoke",), "reader": ("models_read",)})
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(boot.run_runtime, ccir, folder / "journal",
                                          folder / "grants")
            yield handler, folder
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_identity_of_the_tiny_runtime(tmp_path: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    async with runtime(ccir) as (handler, _):
        ident = await handler.call("identity", {})
        assert ident["runtime_id"] == handler.lineage and ident["gpu"] is None
        assert ident["source_commit"] == build_commit() and ident["engine_sets"] == []
        [row] = ident["artifacts"]          # the stub embedding folder does not load
        gguf = (tmp_path / "rt" / TINY_MODEL).read_bytes()
        assert row["kind"] == "textgen" and row["name"] == TINY_MODEL
        assert row["artifact_sha256"] == hashlib.sha256(gguf).hexdigest()
        assert row["descriptor"] == {"backend": "cpu", "threads": 0, "kv_page_tokens": 8,
                                     "context": 1024}
        assert row["descriptor_sha256"] == descriptor_sha256(row["descriptor"])
        caps = await handler.call("capabilities", {})
        [emb] = [m for m in caps["models"] if m["kind"] == "embedding"]
        assert emb["ready"] is False and emb["not_ready"] == "embedding_load_failed"
        with pytest.raises(errors.InvalidInput) as got:
            await handler.call("embed", {**INVOKE, "texts": ["x"]})
        assert got.value.code == "unknown_model"


async def test_embed_call(with_embedding: Path) -> None:
    texts = ["hello world", "a second, longer sentence to embed"]
    async with runtime(with_embedding) as (handler, folder):
        out = await handler.call("embed", {**INVOKE, "texts": texts})
        assert out["dim"] == 384 and len(out["vectors_b64"]) == 2
        got = np.stack([np.frombuffer(base64.b64decode(v), "<f4") for v in out["vectors_b64"]])
        with Embedder.load(real_embedding_dir()) as emb:
            np.testing.assert_allclose(got, emb.embed(texts), atol=1e-5)
            assert out["tokens"] == [len(emb.tokenize(t)) for t in texts]
        ident = await handler.call("identity", {})
        row = next(a for a in ident["artifacts"] if a["kind"] == "embedding")
        assert out["identity"] == {"source_commit": build_commit(), "gpu": None,
                                   "artifact_sha256": row["artifact_sha256"],
                                   "descriptor_sha256": row["descriptor_sha256"]}
        caps = await handler.call("capabilities", {})
        [emb_row] = [m for m in caps["models"] if m["kind"] == "embedding"]
        assert emb_row["ready"] is True and emb_row["dim"] == 384
        # extracted once, beside the journal, marked complete
        [extracted] = list((folder / "journal" / "models").iterdir())
        assert (extracted / ".complete").is_file()

        with pytest.raises(errors.Forbidden):
            await handler.call("embed", {"principal": "reader", "actions": ["models_invoke"],
                                         "texts": ["x"]})   # not in the deployment grants
        for bad in ([], [1], ["x"] * 257, None, ["x" * 70000]):
            with pytest.raises(errors.InvalidInput):
                await handler.call("embed", {**INVOKE, "texts": bad})

    async with runtime(with_embedding) as (handler, _):   # a second boot reuses nothing stale
        out = await handler.call("embed", {**INVOKE, "texts": ["again"]})
        assert len(out["vectors_b64"]) == 1


async def _generate(handler: ServiceHandler, **params: Any) -> tuple[dict[str, Any],
                                                                   list[dict[str, Any]]]:
    client = InProcessClient(handler)
    async with client.subscribe("chat.generate", {**INVOKE, "model": TINY_MODEL,
                                                  "max_tokens": 3, **params}) as sub:
        return sub.opened, [item async for item in sub]


async def test_chat_generate_raw_prompt_and_identity(tmp_path: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    async with runtime(ccir) as (handler, _):
        opened, items = await _generate(handler, prompt="hello there")
        engine = handler.models.get(TINY_MODEL).engine
        assert opened["prompt_tokens"] == len(engine.tokenize(b"hello there", add_bos=True,
                                                              parse_special=False))
        row = handler.models.identity()[0]
        assert opened["identity"] == {"source_commit": build_commit(), "gpu": None,
                                      "artifact_sha256": row["artifact_sha256"],
                                      "descriptor_sha256": row["descriptor_sha256"]}
        assert "finish_reason" in items[-1]
        chat, _ = await _generate(handler, messages=[{"role": "user", "content": "hello there"}])
        assert chat["prompt_tokens"] > opened["prompt_tokens"]     # the chat template's turns
        for bad in ({"prompt": "x", "messages": [{"role": "user", "content": "y"}]},
                    {"prompt": ""}, {"prompt": 3}):
            with pytest.raises(errors.InvalidInput) as got:
                await _generate(handler, **bad)
            assert got.value.fields["field"] == "prompt"


async def test_a_full_admission_queue_is_over_capacity(tmp_path: Path) -> None:
    """chat.generate on an executor whose queue is full: 429 over_capacity (the router
    passes it on with Retry-After), never a wait without bound."""
    from aotx_trio.native import lib as native
    from aotx_trio.runtime.executor import Executor

    ccir = make_runtime_file(tmp_path / "rt")
    async with runtime(ccir) as (handler, _):
        state = handler.state
        assert state is not None
        # an executor that is not running: its one queue slot stays taken
        handler.executor = Executor(state.device, state.emitter,
                                    native.capacities()["result_bytes"], queue_size=1)
        params = {**INVOKE, "model": TINY_MODEL, "prompt": "x", "max_tokens": 2}
        await handler.open_stream("chat.generate", params)
        with pytest.raises(errors.OverCapacity) as got:
            await handler.open_stream("chat.generate", params)
        assert got.value.code == "over_capacity" and got.value.fields["retry_after"] == 1
