"""GET /operations/{op}/events through a real hypercorn with httpx: output bytes as
they are produced, an end event, Last-Event-ID resume with every byte exactly once,
keepalive comments, 404 before any stream, and a slow subscriber dropped."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, LINEAGE, SCHEMA, TINY_MODEL, Served, served, token_for

from aotx_trio.native import lib as native
from aotx_trio.runtime.executor import Executor

pytestmark = [
    pytest.mark.timeout(120),
    # A client that walks away mid-stream leaves httpx's/httpcore's own nested body
    # generators to the garbage collector (their known wart, not ours): the response
    # itself is closed by ``async with``.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (?!_events ):"
        "pytest.PytestUnraisableExceptionWarning"),
]
BASE = "/aotx/v1/shared"


def _body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


async def _setup(srv: Served, http: httpx.AsyncClient) -> str:
    """alice registers, makes a space and a conversation; returns the conversation."""
    assert (await http.post(BASE + "/participant", json=_body(1, 1))).status_code == 202
    space = (await http.post(BASE + "/spaces", json=_body(2, 2))).json()["resource"]
    r = await http.post(f"{BASE}/spaces/{space}/conversations", json=_body(3, 3))
    assert r.status_code == 202
    con: str = r.json()["resource"]
    return con


def _manual_executor(srv: Served) -> Executor:
    """Swap in an executor that runs only when the test calls ``cycle()``."""
    state = srv.handler.state
    assert state is not None
    executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"])
    srv.handler.executor = executor
    return executor


async def _events(resp: httpx.Response) -> AsyncIterator[tuple[str | None, str, Any]]:
    """(id, event, data) of each event; comments come as (None, "comment", text)."""
    event_id, kind, data = None, "message", []
    async for line in resp.aiter_lines():
        if line.startswith(":"):
            yield None, "comment", line[1:].strip()
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield event_id, kind, json.loads("\n".join(data))
            event_id, kind, data = None, "message", []


async def test_output_streams_then_resumes_exactly_once(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL}) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as http:
        con = await _setup(srv, http)
        executor = _manual_executor(srv)
        srv.app.config["AOTX_SSE_KEEPALIVE_S"] = 0.02   # each comment drives one round
        r = await http.post(f"{BASE}/conversations/{con}/inputs",
                            json=_body(4, 4, text="Hello world", model=TINY_MODEL,
                                       max_output_tokens=40))
        assert r.status_code == 202
        op = r.json()["operation"]
        url = f"{BASE}/operations/{op}/events"
        got = bytearray()
        last_id = None
        with trio.fail_after(60):
            async with http.stream("GET", url) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                assert resp.headers["cache-control"] == "no-store"
                outputs = 0
                async with contextlib.aclosing(_events(resp)) as stream:
                    async for event_id, kind, data in stream:
                        if kind == "comment":
                            await executor.cycle()     # the stream is open: let it run
                            continue
                        assert kind == "output"
                        assert data["offset"] == len(got)
                        got += base64.b64decode(data["data"])
                        assert event_id == f"{op}/{data['next_offset']}" == f"{op}/{len(got)}"
                        last_id = event_id
                        outputs += 1
                        if outputs == 2:
                            break                      # the client goes away mid-stream
                        await executor.cycle()
            while (await http.get(f"{BASE}/operations/{op}")).json()["status"] == "running":
                await executor.cycle()             # it finishes while nobody listens
            assert last_id is not None
            async with http.stream("GET", url, headers={"Last-Event-ID": last_id}) as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                async for event_id, kind, data in stream:
                    if kind == "output":
                        assert data["offset"] == len(got)
                        got += base64.b64decode(data["data"])
                    elif kind == "end":
                        assert event_id == f"{op}/{len(got)}"
                        assert data["status"] == "succeeded"
                        assert data["receipt"]["operation"] == op
                        break
        result = (await http.get(f"{BASE}/operations/{op}/result")).json()
        assert bytes(got) == base64.b64decode(result["data"])
        assert outputs == 2 and len(got) == result["length"] > 0


async def test_explicit_offset_wins_and_a_finished_operation_streams_at_once(
        tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL}) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as http:
        con = await _setup(srv, http)
        r = await http.post(f"{BASE}/conversations/{con}/inputs",
                            json=_body(4, 4, text="Hello", model=TINY_MODEL,
                                       max_output_tokens=12))
        op = r.json()["operation"]
        with trio.fail_after(30):
            while (await http.get(f"{BASE}/operations/{op}")).json()["status"] != "succeeded":
                await trio.sleep(0.01)
        full = base64.b64decode((await http.get(f"{BASE}/operations/{op}/result")).json()["data"])
        assert len(full) >= 2
        async with http.stream("GET", f"{BASE}/operations/{op}/events?offset=1",
                               headers={"Last-Event-ID": f"{op}/0"}) as resp:
            seen = [(k, d) async for _, k, d in _events(resp) if k != "comment"]
        assert [k for k, _ in seen] == ["output", "end"]
        assert seen[0][1]["offset"] == 1 and base64.b64decode(seen[0][1]["data"]) == full[1:]


async def test_errors_come_before_any_stream(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL, "eve": ("shared_write",)}) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            auth = {"Authorization": f"Bearer {token_for('alice')}"}
            unknown = f"{BASE}/operations/op-{LINEAGE}-{9:032x}/events"
            r = await http.get(unknown, headers=auth)
            assert r.status_code == 404 and r.json()["error"]["code"] == "operation_not_found"
            assert (await http.get(unknown)).status_code == 401
            r = await http.get(unknown, headers={"Authorization": f"Bearer {token_for('eve')}"})
            assert r.status_code == 403 and r.json()["error"]["action"] == "shared_read"
            r = await http.get(unknown + "?offset=%C2%B2", headers=auth)
            assert r.status_code == 422 and r.json()["error"]["field"] == "offset"


async def test_idle_streams_get_keepalives(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL}) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as http:
        srv.app.config["AOTX_SSE_KEEPALIVE_S"] = 0.05
        con = await _setup(srv, http)
        _manual_executor(srv)                      # never runs: the stream stays idle
        r = await http.post(f"{BASE}/conversations/{con}/inputs",
                            json=_body(4, 4, text="Hello", model=TINY_MODEL))
        op = r.json()["operation"]
        comments = []
        with trio.fail_after(30):
            async with http.stream("GET", f"{BASE}/operations/{op}/events") as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                async for _, kind, text in stream:
                    assert kind == "comment"
                    comments.append(text)
                    if comments.count("keepalive") == 3:
                        break
        assert comments[0] == "aotx operation events"
