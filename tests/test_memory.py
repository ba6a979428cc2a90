"""Shared memory end to end (runtime/memory.py) through a real hypercorn with httpx: an
input's text and its all-MiniLM-L6-v2 embedding are retained before it runs (the
vectors equal the embedder's alone), read back as rows and exact byte spans (text null
on a partial UTF-8 span), visible to readers of the space only, kept across a restart
and after a cancellation; and the recall block (ranking, history and byte limits)."""

from __future__ import annotations

import base64
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import synth_gguf as sg
import trio
import trio.testing
from _gateway_env import ALL, LINEAGE, SCHEMA, TINY, TINY_MODEL, served, token_for
from _real import real_embedding_dir

from aotx_trio.native.device import MemoryRow
from aotx_trio.native.embed import Embedder
from aotx_trio.runtime import memory, pack
from aotx_trio.vocab import principal_key

pytestmark = pytest.mark.timeout(240)
BASE = "/aotx/v1/shared"


@pytest.fixture(scope="module")
def ccir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared runtime file: the tiny synthetic Gemma and the real MiniLM."""
    folder = tmp_path_factory.mktemp("rt-memory")
    gguf = sg.write_model(folder / TINY_MODEL, TINY)
    target = folder / "runtime.aotxccir"
    pack.pack(target, models=[gguf], embedding=real_embedding_dir(), shared=True,
              lineage=LINEAGE, progress=False)
    return target


@cache
def embedder() -> Embedder:
    return Embedder.load(real_embedding_dir())


def _auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for(who)}"}


async def _json(r: Any) -> Any:
    """The JSON body of an httpx or a Quart test-client response."""
    return await r.get_json() if hasattr(r, "get_json") else r.json()


class Client:
    """Sequenced calls over httpx (a real hypercorn) or Quart's test client."""

    def __init__(self, http: Any) -> None:
        self.http = http
        self.seq: dict[str, int] = {}

    async def post(self, who: str, path: str, **fields: Any) -> dict[str, Any]:
        seq = self.seq.get(who, 1)
        body = {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{seq:030x}{len(who):02x}",
                "sequence": str(seq), **fields}
        r = await self.http.post(BASE + path, headers=_auth(who), json=body)
        out: dict[str, Any] = await _json(r)
        assert r.status_code == 202, out
        self.seq[who] = seq + 1
        return out

    async def get(self, who: str, path: str, status: int = 200) -> Any:
        r = await self.http.get(BASE + path, headers=_auth(who))
        out = await _json(r)
        assert r.status_code == status, out
        return out

    async def settled(self, who: str, op: str) -> dict[str, Any]:
        """The receipt once its terminal result is saved (the memory transfer, enqueued
        before the run, is saved by then too)."""
        with trio.fail_after(60):
            while True:
                r = await self.get(who, f"/operations/{op}")
                if r["terminal"]["saved"]:
                    return dict(r)
                await trio.sleep(0.02)


async def _setup(c: Client) -> tuple[str, str]:
    for who in ("alice", "bob"):
        await c.post(who, "/participant")
    space = (await c.post("alice", "/spaces", scope="room"))["resource"]
    con = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
    return space, con


async def test_retention_reads_and_visibility(tmp_path: Path, ccir: Path) -> None:
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        caps = await c.get("alice", "/capabilities")
        assert caps["features"]["memory"] is True and caps["capacities"]["memory"] == 4096
        space, con = await _setup(c)
        text = "Le café est fermé le lundi."
        op = (await c.post("alice", f"/conversations/{con}/inputs", text=text,
                           model=TINY_MODEL, max_output_tokens=4))["operation"]
        await c.settled("alice", op)
        page = await c.get("alice", f"/spaces/{space}/memory")
        assert page["next_cursor"] is None
        text_row, emb_row = page["items"]
        assert (text_row["kind"], emb_row["kind"]) == ("text", "embedding")
        assert text_row["source"] == op and emb_row["source"] == text_row["object"]
        assert text_row["owner"] == space and text_row["room"] == space
        assert text_row["actor"] == f"par-{LINEAGE}-{principal_key('alice')}"
        assert text_row["conversation"] == con and text_row["scope"] == "room"
        assert text_row["byte_length"] == len(text.encode()) and emb_row["dim"] == 384
        one = await c.get("alice", f"/spaces/{space}/memory/{text_row['object']}")
        assert one["text"] == text and one["total"] == len(text.encode())
        assert base64.b64decode(one["data"]) == text.encode()
        # a span starting inside "é": exact bytes, text null
        at = text.encode().index("é".encode()) + 1
        part = await c.get("alice", f"/spaces/{space}/memory/{text_row['object']}?offset={at}")
        assert part["text"] is None and base64.b64decode(part["data"]) == text.encode()[at:]
        # the embedding equals the embedder's alone
        vec = await c.get("alice", f"/spaces/{space}/memory/{emb_row['object']}")
        got = np.frombuffer(base64.b64decode(vec["data"]), "<f4")
        want = embedder().embed([text])[0]
        assert got.shape == (384,) and np.allclose(got, want, atol=1e-5)
        assert vec["text"] is None or len(vec["text"]) > 0
        # bob: no member of the room -> not found; with read -> sees the rows
        err = await c.get("bob", f"/spaces/{space}/memory", 404)
        assert err["error"]["code"] == "space_not_found"
        await c.get("bob", f"/spaces/{space}/memory/{text_row['object']}", 404)
        await c.post("alice", f"/spaces/{space}/members",
                     participant=f"par-{LINEAGE}-{principal_key('bob')}",
                     permissions=["write"])
        err = await c.get("bob", f"/spaces/{space}/memory", 403)
        assert err["error"]["code"] == "forbidden"
        await c.post("alice", f"/spaces/{space}/members",
                     participant=f"par-{LINEAGE}-{principal_key('bob')}",
                     permissions=["read"])
        assert (await c.get("bob", f"/spaces/{space}/memory"))["items"] == page["items"]
        # unknown objects, malformed ids, bad cursors
        await c.get("alice", f"/spaces/{space}/memory/mem-{LINEAGE}-{'7' * 32}", 404)
        await c.get("alice", f"/spaces/{space}/memory/nope", 404)
        await c.get("alice", f"/spaces/{space}/memory?cursor=x", 422)
        await c.get("alice", f"/spaces/{space}/memory/{text_row['object']}?offset=-1", 422)
        # another private space of alice: another memory owner, nothing in it
        other = (await c.post("alice", "/spaces"))["resource"]
        assert (await c.get("alice", f"/spaces/{other}/memory"))["items"] == []


async def test_cancellation_after_retention_keeps_memory(tmp_path: Path, ccir: Path) -> None:
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        space, con = await _setup(c)
        receipt = await c.post("alice", f"/conversations/{con}/inputs", text="keep this note",
                               model=TINY_MODEL, max_output_tokens=1000)
        # retention runs after the lease (the 202 does not wait for it): cancel once done
        with trio.fail_after(30):
            while srv.handler.memory.retained != 1:
                await trio.sleep(0.01)
        await c.post("alice", "/participant/cancellations",
                     target_sequence=receipt["sequence"])
        done = await c.settled("alice", receipt["operation"])
        assert done["cancel_requested"] is True       # cancelled after retention
        assert done["status"] in ("cancelled", "succeeded")
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert [r["kind"] for r in rows] == ["text", "embedding"]
        assert rows[0]["source"] == receipt["operation"]


async def test_the_input_202_does_not_wait_for_the_embedder(tmp_path: Path,
                                                            ccir: Path) -> None:
    """An embedder that blocks until released (its limiter held by another caller): the
    input's POST is answered 202 while it is blocked; the input is leased (running)
    with no memory yet; once released, its memory is retained after the lease."""
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        space, con = await _setup(c)
        mem = srv.handler.memory
        release, held = trio.Event(), trio.Event()

        async def hold() -> None:
            async with mem.limiter:
                held.set()
                await release.wait()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await held.wait()
            runs = mem.embed_runs
            with trio.fail_after(30):
                receipt = await c.post("alice", f"/conversations/{con}/inputs",
                                       text="a note held back", model=TINY_MODEL,
                                       max_output_tokens=4)          # 202 (Client.post)
            assert not release.is_set() and mem.embed_runs == runs and mem.retained == 0
            with trio.fail_after(30):
                while (await c.get("alice", f"/operations/{receipt['operation']}")
                       )["status"] != "running":
                    await trio.sleep(0.01)
            assert (await c.get("alice", f"/spaces/{space}/memory"))["items"] == []
            release.set()
        done = await c.settled("alice", receipt["operation"])
        assert done["status"] == "succeeded"
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert [r["kind"] for r in rows] == ["text", "embedding"]
        assert rows[0]["source"] == receipt["operation"]


# ---- the recall block ---------------------------------------------------------------


def _row(actor: str = "ab" * 16, source: str = "01" * 16) -> MemoryRow:
    return MemoryRow(object="02" * 16, version=1, kind="text", scope="private", mode=1,
                     origin="retained", byte_length=4, owner="03" * 16, room=None,
                     source=source, actor=actor, conversation="04" * 16, admission_number=1,
                     dim=0)


def test_render_recalled_keeps_rank_order_within_the_byte_limit() -> None:
    items = [(_row(), 0.9, b"first line\nstill first"), (_row(), 0.8, b"x" * 2000),
             (_row(), 0.7, b"third <image:" + b"0" * 64 + b">")]
    block = memory.render_recalled(items, limit=300)
    assert block.startswith(memory.RECALL_HEADER)
    lines = block[len(memory.RECALL_HEADER):].split(b"\n")
    assert lines[0] == b"- first line still first"
    assert lines[1].startswith(b"- third <image:")                # the link stays text
    assert len(block) <= 300 and b"x" * 100 not in block
    assert memory.render_recalled([(_row(), 0.9, b"y" * 2000)], limit=300) == b""
    assert memory.render_recalled([]) == b""


async def test_memory_survives_a_restart(tmp_path: Path, ccir: Path) -> None:
    from _gateway_env import embedded, short_dir

    folder = short_dir()
    people = {"alice": ALL}
    try:
        async with embedded(tmp_path, people, ccir=ccir, folder=folder) as env:
            c = Client(env.client)
            await c.post("alice", "/participant")
            space = (await c.post("alice", "/spaces"))["resource"]
            con = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
            op = (await c.post("alice", f"/conversations/{con}/inputs", text="durable note",
                               model=TINY_MODEL, max_output_tokens=2))["operation"]
            await c.settled("alice", op)
            before = await c.get("alice", f"/spaces/{space}/memory")
        async with embedded(tmp_path, people, ccir=ccir, folder=folder) as env:
            c = Client(env.client)
            assert await c.get("alice", f"/spaces/{space}/memory") == before
            one = await c.get("alice", f"/spaces/{space}/memory/{before['items'][0]['object']}")
            assert one["text"] == "durable note"
    finally:
        import shutil
        shutil.rmtree(folder, ignore_errors=True)


async def test_recall_puts_the_answer_into_the_context_with_the_real_models(
        tmp_path: Path) -> None:
    """The real Gemma 3 270M and MiniLM: a note retained in one conversation is recalled
    into another conversation of the space (the greedy answer repeats its code), not
    into a conversation of another space, and not twice into its own conversation."""
    from _real import real_gguf

    rt = tmp_path / "real.aotxccir"
    pack.pack(rt, models=[real_gguf()], embedding=real_embedding_dir(), shared=True,
              lineage=LINEAGE, progress=False)
    async with served(tmp_path, {"alice": ALL}, ccir=rt) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
        c = Client(http)
        caps = await c.get("alice", "/capabilities")
        model = next(m["name"] for m in caps["models"] if m["kind"] == "text")
        await c.post("alice", "/participant")
        space = (await c.post("alice", "/spaces", scope="room"))["resource"]
        con = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
        con2 = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
        other = (await c.post("alice", "/spaces", scope="room"))["resource"]
        con3 = (await c.post("alice", f"/spaces/{other}/conversations"))["resource"]
        note = (await c.post("alice", f"/conversations/{con}/inputs",
                             text="Note: the code for the blue vault is 7391.", model=model,
                             max_output_tokens=4))["operation"]
        await c.settled("alice", note)
        prompts: dict[str, bytes] = {}
        ex = srv.handler.executor
        assert ex is not None
        ex.on_complete = lambda job, status: prompts.__setitem__(
            job.conversation, job.model.engine.detokenize(job.prompt))
        answers = {}
        for cc in (con2, con3, con):
            op = (await c.post("alice", f"/conversations/{cc}/inputs",
                               text="What is the code for the blue vault?", model=model,
                               max_output_tokens=24))["operation"]
            await c.settled("alice", op)
            answers[cc] = (await c.get("alice", f"/operations/{op}/result"))["text"]
    ids = {cc: cc.rsplit("-", 1)[1] for cc in (con, con2, con3)}
    block = memory.RECALL_HEADER + b"- Note: the code for the blue vault is 7391.\n\n"
    assert block in prompts[ids[con2]]
    assert memory.RECALL_HEADER not in prompts[ids[con3]]      # another space
    # its own conversation: the note is in its history, never recalled a second time
    # (the other conversation's question is recalled: space memory, similar)
    own = prompts[ids[con]]
    assert own.count(b"the code for the blue vault is 7391") == 1
    assert b"- What is the code for the blue vault?" in own
    assert "7391" in answers[con2]
    assert "7391" not in answers[con3]


async def test_publication_over_http(tmp_path: Path, ccir: Path) -> None:
    people = {"alice": ALL, "bob": ALL, "writer": ("shared_read", "shared_write")}
    async with served(tmp_path, people, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        for who in people:
            await c.post(who, "/participant")
        mine = (await c.post("alice", "/spaces"))["resource"]
        con = (await c.post("alice", f"/spaces/{mine}/conversations"))["resource"]
        op = (await c.post("alice", f"/conversations/{con}/inputs", text="shared fact",
                           model=TINY_MODEL, max_output_tokens=2))["operation"]
        await c.settled("alice", op)
        text_row, emb_row = (await c.get("alice", f"/spaces/{mine}/memory"))["items"]
        room = (await c.post("alice", "/spaces", scope="room"))["resource"]
        await c.post("alice", f"/spaces/{room}/members",
                     participant=f"par-{LINEAGE}-{principal_key('bob')}",
                     permissions=["read"])
        assert (await c.get("bob", f"/spaces/{room}/memory"))["items"] == []

        async def publish(who: str, obj: str, version: str, status: int) -> Any:
            seq = c.seq[who]
            body = {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{seq:031x}f",
                    "sequence": str(seq), "object": obj, "source_version": version}
            r = await http.post(f"{BASE}/spaces/{room}/publications", headers=_auth(who),
                                json=body)
            assert r.status_code == status, r.text
            if status == 202:
                c.seq[who] = seq + 1
            return r.json()

        assert (await publish("alice", text_row["object"], "2", 409))["error"]["code"] == \
            "version_conflict"
        assert (await publish("alice", emb_row["object"], "1", 409))["error"]["code"] == \
            "publication_unsupported"
        assert (await publish("writer", text_row["object"], "1", 403))["error"]["code"] == \
            "forbidden"
        receipt = await publish("alice", text_row["object"], "1", 202)
        assert receipt["kind"] == "publication" and receipt["resource"] == room
        result = await c.get("alice", f"/operations/{receipt['operation']}/result")
        objects = __import__("json").loads(result["text"])["objects"]
        rows = (await c.get("bob", f"/spaces/{room}/memory"))["items"]
        assert [r["object"] for r in rows] == objects
        assert [(r["kind"], r["origin"], r["owner"]) for r in rows] == [
            ("text", "published", room), ("embedding", "published", room)]
        assert rows[0]["source"] == text_row["object"]
        one = await c.get("bob", f"/spaces/{room}/memory/{objects[0]}")
        assert one["text"] == "shared fact"
        # the original stays private
        await c.get("bob", f"/spaces/{mine}/memory", 404)


async def test_concurrent_retention_texts_share_encoder_runs() -> None:
    """Eight texts handed over at once: the first runs alone, the seven that queued
    meanwhile share the next run; each gets its own vector, equal to the embedder's
    alone; a caller cancelled in its run leaves its batch to the next caller."""
    from aotx_trio.runtime.served import EmbeddingModel

    service = memory.MemoryService(None, EmbeddingModel("e", "", "", embedder=embedder()))  # type: ignore[arg-type]
    texts = [f"note number {i} about the harbour" for i in range(8)]
    got: dict[int, np.ndarray] = {}

    async def one(i: int) -> None:
        got[i] = await service.embed_one(texts[i])

    async with trio.open_nursery() as nursery:
        for i in range(8):
            nursery.start_soon(one, i)
    assert service.embed_runs == 2
    want = embedder().embed(texts)
    for i in range(8):
        assert np.allclose(got[i], want[i], atol=1e-5)
    # cancelled while waiting for the encoder (held by another caller): its batch goes
    # back to the queue, and the caller behind it takes and runs it
    got.clear()
    first = trio.CancelScope()

    async def cancelled() -> None:
        with first:
            await service.embed_one(texts[0])

    async with trio.open_nursery() as nursery:
        async with service.limiter:
            nursery.start_soon(cancelled)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(one, 1)
            await trio.testing.wait_all_tasks_blocked()
            first.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert service._draining and service._queue == []   # the next caller took both
    assert np.allclose(got[1], want[1], atol=1e-5)
    assert service._queue == [] and not service._draining and service.embed_runs == 3


async def test_recall_picks_the_nearest_memory_with_the_real_models(tmp_path: Path) -> None:
    """Four notes in a space, the answer only in one of them: a question in a fresh
    conversation recalls that note first (the nearest by MiniLM), and the real Gemma's
    greedy answer carries its code, which no other context holds."""
    from _real import real_gguf

    rt = tmp_path / "real.aotxccir"
    pack.pack(rt, models=[real_gguf()], embedding=real_embedding_dir(), shared=True,
              lineage=LINEAGE, progress=False)
    notes = ["The train to Oslo leaves from platform 4 every morning.",
             "Note: the code for the blue vault is 7391.",
             "The red door in the hall opens only on Tuesdays.",
             "Our garden key hangs under the green pot by the gate."]
    async with served(tmp_path, {"alice": ALL}, ccir=rt) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
        c = Client(http)
        caps = await c.get("alice", "/capabilities")
        model = next(m["name"] for m in caps["models"] if m["kind"] == "text")
        await c.post("alice", "/participant")
        space = (await c.post("alice", "/spaces", scope="room"))["resource"]
        for text in notes:   # each in its own conversation: space memory, not history
            con = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
            op = (await c.post("alice", f"/conversations/{con}/inputs", text=text,
                               model=model, max_output_tokens=2))["operation"]
            await c.settled("alice", op)
        ask = (await c.post("alice", f"/spaces/{space}/conversations"))["resource"]
        prompts: list[bytes] = []
        assert srv.handler.executor is not None
        srv.handler.executor.on_complete = lambda job, status: prompts.append(
            job.model.engine.detokenize(job.prompt))
        op = (await c.post("alice", f"/conversations/{ask}/inputs",
                           text="What is the code for the blue vault?", model=model,
                           max_output_tokens=24))["operation"]
        await c.settled("alice", op)
        answer = (await c.get("alice", f"/operations/{op}/result"))["text"]
    (prompt,) = prompts
    block = prompt[prompt.index(memory.RECALL_HEADER):].split(b"\n\n", 1)[0]
    lines = block.split(b"\n")[1:]
    assert lines[0] == b"- " + notes[1].encode()          # the nearest note first
    assert prompt.count(b"7391") == 1                       # only memory holds the code
    assert "7391" in answer
