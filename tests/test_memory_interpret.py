"""Shared memory mode 2 and the execution deadline (runtime/memory.py) with the real
runtime: two copies of the tiny synthetic Gemma, one packed with the automatic-memory
capability (``aotx pack --auto-memory``), and the real all-MiniLM-L6-v2.  The flagged
model's inputs are recorded with mode 2 and interpreted by that same model (call 1,
its greedy output retained with its embedding; call 2, the recall query); the other
model's stay mode 1; a failed call falls back to mode 1; recovery keeps the recorded
mode after the flag is taken away; memory processing counts against the deadline."""

from __future__ import annotations

import base64
import functools
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import synth_gguf as sg
import trio
import trio.testing
from _gateway_env import (
    ALL,
    LINEAGE,
    TINY,
    TINY_MODEL,
    embedded,
    make_config,
    served,
    short_dir,
)
from _real import real_embedding_dir
from test_memory import Client, _setup, embedder

from aotx_trio.native.engine import Engine
from aotx_trio.runtime import boot, memory, pack
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.prompt import render_chat
from aotx_trio.service.client import InProcessClient

pytestmark = pytest.mark.timeout(240)
AUTO = "auto.gguf"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rt-interpret")
    sg.write_model(folder / AUTO, TINY)
    sg.write_model(folder / TINY_MODEL, TINY)
    return folder


def _runtime(models: Path, target: Path, auto: bool = True) -> Path:
    pack.pack(target, models=[models / AUTO, models / TINY_MODEL],
              embedding=real_embedding_dir(), shared=True, lineage=LINEAGE, progress=False,
              auto_memory=[AUTO] if auto else [])
    return target


@cache
def _offline(model: Path, instruction: bytes, text: str) -> bytes:
    """What a memory call on ``model`` answers, from the engine alone (greedy)."""
    with Engine.load(model, max_seqs=1) as eng:
        prompt = render_chat(eng, [("user", instruction + text.encode())])
        out = b"".join(eng.generate(prompt, max_tokens=memory.CALL_TOKENS))
    return memory._line(out)


def _modes(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(r["kind"], r["retention_mode"]) for r in rows]


async def test_mode_2_interprets_with_the_requested_model(tmp_path: Path, models: Path) -> None:
    ccir = _runtime(models, tmp_path / "rt.aotxccir")
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        caps = await c.get("alice", "/capabilities")
        assert {m["name"]: m["automatic_memory"] for m in caps["models"]
                if m["kind"] == "text"} == {AUTO: True, TINY_MODEL: False}
        ended: dict[str, Job] = {}
        srv.handler.executor.on_complete = lambda job, status: ended.setdefault(job.op_id, job)
        space, con = await _setup(c)
        text = "The blue door code is 7781."
        op = (await c.post("alice", f"/conversations/{con}/inputs", text=text, model=AUTO,
                           max_output_tokens=4))["operation"]
        done = await c.settled("alice", op)
        assert done["status"] == "succeeded"
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert _modes(rows) == [("text", 2), ("embedding", 2), ("interpretation", 2),
                                ("embedding", 2)]
        note_row, note_emb = rows[2], rows[3]
        assert note_row["source"] == op and note_emb["source"] == note_row["object"]
        # call 1: the requested model's own greedy interpretation, and its embedding
        want = _offline(models / AUTO, memory.INTERPRET_PROMPT, text)
        assert want
        got = await c.get("alice", f"/spaces/{space}/memory/{note_row['object']}")
        assert got["text"] == want.decode()
        vec = await c.get("alice", f"/spaces/{space}/memory/{note_emb['object']}")
        assert np.allclose(np.frombuffer(base64.b64decode(vec["data"]), "<f4"),
                           embedder().embed([want.decode()])[0], atol=1e-5)
        # call 2: the recall query, embedded next to the input's own embedding
        query = _offline(models / AUTO, memory.RECALL_QUERY_PROMPT, text)
        job = ended[op.rsplit("-", 1)[1]]
        assert job.retention_mode == 2 and isinstance(job.query, tuple)
        assert np.allclose(job.query[1], embedder().embed([query.decode()])[0], atol=1e-5)
        assert srv.handler.memory.interpreted == 1 and srv.handler.memory.calls_failed == 0
        # the model without the flag: mode 1, no interpretation
        op2 = (await c.post("alice", f"/conversations/{con}/inputs", text="Plain note.",
                            model=TINY_MODEL, max_output_tokens=4))["operation"]
        await c.settled("alice", op2)
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert _modes(rows[4:]) == [("text", 1), ("embedding", 1)]
        assert ended[op2.rsplit("-", 1)[1]].retention_mode == 1
        assert srv.handler.memory.interpreted == 1


async def test_a_failed_memory_call_falls_back_to_mode_1(
        tmp_path: Path, models: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls that time out: the input still runs on its mode 1 memory (recorded mode 2,
    no interpretation); the model's next inputs are mode 1 until FALLBACK_S passed."""
    ccir = _runtime(models, tmp_path / "rt.aotxccir")
    monkeypatch.setattr(memory, "CALL_TIMEOUT_S", 0.0)     # every call times out
    monkeypatch.setattr(memory, "FALLBACK_S", 1.0)
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir) as srv, \
            httpx.AsyncClient(base_url=srv.url) as http:
        c = Client(http)
        space, con = await _setup(c)

        async def say(text: str) -> dict[str, Any]:
            op = (await c.post("alice", f"/conversations/{con}/inputs", text=text, model=AUTO,
                               max_output_tokens=4))["operation"]
            return await c.settled("alice", op)

        assert (await say("first"))["status"] == "succeeded"
        assert srv.handler.memory.calls_failed == 2 and srv.handler.memory.interpreted == 0
        assert (await say("second"))["status"] == "succeeded"
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert _modes(rows) == [("text", 2), ("embedding", 2), ("text", 1), ("embedding", 1)]
        monkeypatch.setattr(memory, "CALL_TIMEOUT_S", 20.0)
        await trio.sleep(1.0)                                   # the fallback ran out
        assert (await say("third"))["status"] == "succeeded"
        rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
        assert [k for k, _ in _modes(rows[4:])] == ["text", "embedding", "interpretation",
                                                    "embedding"]
        assert {m for _, m in _modes(rows[4:])} == {2}


async def test_recovery_keeps_the_recorded_mode_when_the_flag_is_taken_away(
        tmp_path: Path, models: Path) -> None:
    ccir = _runtime(models, tmp_path / "rt.aotxccir")
    folder = short_dir()
    try:
        async with embedded(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir,
                            folder=folder) as env:
            c = Client(env.client)
            space, con = await _setup(c)
            op = (await c.post("alice", f"/conversations/{con}/inputs", text="Keep 42.",
                               model=AUTO, max_output_tokens=4))["operation"]
            await c.settled("alice", op)
            before = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
            assert {m for _, m in _modes(before)} == {2} and len(before) == 4
        pack.pack(ccir, no_auto_memory=[AUTO], progress=False)   # the flag flipped off
        async with embedded(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir,
                            folder=folder) as env:
            c = Client(env.client)
            c.seq = {"alice": 5, "bob": 2}
            caps = await c.get("alice", "/capabilities")
            assert not any(m.get("automatic_memory") for m in caps["models"])
            assert (await c.get("alice", f"/spaces/{space}/memory"))["items"] == before
            op = (await c.post("alice", f"/conversations/{con}/inputs", text="Now plain.",
                               model=AUTO, max_output_tokens=4))["operation"]
            await c.settled("alice", op)
            rows = (await c.get("alice", f"/spaces/{space}/memory"))["items"]
            assert rows[:4] == before
            assert _modes(rows[4:]) == [("text", 1), ("embedding", 1)]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ---- the execution deadline includes memory processing -----------------------------

@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Real time (rate 1) that the test can also jump forward."""
    return trio.testing.MockClock(rate=1.0)


def _body(kind: str, seq: int, **fields: Any) -> dict[str, Any]:
    return {"principal": "alice", "actions": list(ALL), "kind": kind,
            "body": {"schema": "aotx.shared.mutation.v1", "lineage": LINEAGE,
                     "operation_key": f"{seq:032x}", "sequence": str(seq), **fields}}


async def test_memory_processing_counts_against_the_execution_deadline(
        tmp_path: Path, models: Path, clock: trio.testing.MockClock) -> None:
    """The submit is answered while the embedder is blocked (held by another caller
    until released): retention runs after the lease, not on the acknowledgment's path.
    The input is leased (running) with no memory yet; the wait for the embedder passes
    the 5 s deadline that started at the lease: the input ends deadline_exceeded
    without generating; its memory, retained inside the deadline, stays.  The same
    input without the wait succeeds."""
    ccir = _runtime(models, tmp_path / "rt.aotxccir", auto=False)
    folder = short_dir()
    try:
        make_config(folder, {"alice": ALL})
        who = {"principal": "alice", "actions": list(ALL)}
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(functools.partial(
                boot.run_runtime, ccir, folder / "journal", folder / "grants", socket=False,
                execution_deadline_s=5.0))
            client = InProcessClient(handler)
            await client.call("mutation.submit", _body("participant.register", 1))
            space = (await client.call("mutation.submit",
                                       _body("space.create", 2)))["receipt"]["resource"]
            con = (await client.call("mutation.submit", _body(
                "conversation.create", 3, space=space)))["receipt"]["resource"]

            async def settled(op: str) -> dict[str, Any]:
                while True:
                    r = await client.call("operation.get", {**who, "operation": op})
                    if r["terminal"]["saved"]:
                        return dict(r)
                    await trio.sleep(0.02)

            release, held = trio.Event(), trio.Event()

            async def hold() -> None:
                async with handler.memory.limiter:
                    held.set()
                    await release.wait()

            nursery.start_soon(hold)
            await held.wait()
            runs = handler.memory.embed_runs
            with trio.fail_after(30):   # answered while the embedder is blocked
                answer = await client.call("mutation.submit", _body(
                    "input", 4, conversation=con, model=TINY_MODEL, max_output_tokens=4,
                    text="Remember the slow one."))
            op = answer["receipt"]["operation"]
            assert answer["receipt"]["status"] in ("admitted", "running")
            assert not release.is_set() and handler.memory.embed_runs == runs
            with trio.fail_after(30):   # leased while its memory waits for the embedder
                while (await client.call("operation.get",
                                         {**who, "operation": op}))["status"] != "running":
                    await trio.sleep(0.01)
            assert (await client.call("memory.list", {**who, "space": space}))["items"] == []
            assert handler.memory.retained == 0
            clock.jump(10.0)                     # memory processing takes 10 s
            release.set()
            done = await settled(op)
            assert done["status"] == "deadline_exceeded"
            assert done["result"]["output_tokens"] == 0       # it never generated
            rows = (await client.call("memory.list", {**who, "space": space}))["items"]
            assert [(r["kind"], r["retention_mode"]) for r in rows] == \
                [("text", 1), ("embedding", 1)]               # memory stays
            assert rows[0]["source"] == op
            r = await client.call("mutation.submit", _body(
                "input", 5, conversation=con, model=TINY_MODEL, max_output_tokens=4,
                text="Remember the quick one."))
            assert (await settled(r["receipt"]["operation"]))["status"] == "succeeded"
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

