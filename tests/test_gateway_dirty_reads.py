"""No dirty reads (issue 10 item 3), through a real hypercorn on loopback + httpx.

While the journal cannot save (every fsync fails), an admission is committed on
the device but not saved: its actor sees it (its receipt says committed, not
saved), every other participant's read that would show it answers 503
``save_pending`` instead of 200; once the disk is back the same read waits for
the save and answers.  Reads of saved state answer at once meanwhile."""

from __future__ import annotations

import errno
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, SCHEMA, TINY_MODEL, served, token_for

from aotx_trio.runtime.journal_file import FileOps
from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(120)


class FailingFsync(FileOps):
    def fsync(self, fd: int) -> None:
        raise OSError(errno.ENOSPC, "injected: no space left")


def _body(lineage: str, key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": lineage, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


class Caller:
    def __init__(self, http: httpx.AsyncClient, name: str, lineage: str) -> None:
        self.http, self.name, self.lineage, self.seq = http, name, lineage, 0
        self.auth = {"Authorization": f"Bearer {token_for(name)}"}

    async def post(self, path: str, **fields: Any) -> httpx.Response:
        self.seq += 1
        return await self.http.post(BASE_PATH + path, headers=self.auth, json=_body(
            self.lineage, 1000 + self.seq, self.seq, **fields))

    async def get(self, path: str) -> httpx.Response:
        return await self.http.get(BASE_PATH + path, headers=self.auth)


def _status(resp: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body: dict[str, Any] = resp.json()
    if code is not None:
        assert body["error"]["code"] == code, body
    return body


async def test_others_never_read_unsaved_admissions(tmp_path: Path) -> None:
    async with served(tmp_path, {"eve": ALL, "bob": ALL}) as srv:
        handler = srv.handler
        assert handler.state is not None
        emitter = handler.state.emitter
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
            eve, bob = Caller(http, "eve", srv.lineage), Caller(http, "bob", srv.lineage)
            for c in (eve, bob):
                _status(await c.post("/participant"), 202)
            saved_space = _status(await eve.post("/spaces", scope="instance"), 202)["resource"]
            con = _status(await eve.post(f"/spaces/{saved_space}/conversations"),
                          202)["resource"]

            good = emitter.ops
            emitter.ops = FailingFsync()
            handler.save_timeout = handler.read_wait = 0.3
            try:
                # eve's instance space: committed, not saved
                err = _status(await eve.post("/spaces", scope="instance"), 503, "save_pending")
                op = err["error"]["operation"]
                mine = _status(await eve.get(f"/operations/{op}"), 200)
                assert mine["device"]["committed"] is True
                assert mine["admission"]["saved"] is False
                space = mine["resource"]
                _status(await eve.get(f"/spaces/{space}"), 200)          # the actor sees it
                # anybody else: never the unsaved space
                body = _status(await bob.get(f"/spaces/{space}"), 503, "save_pending")
                assert "Retry-After" in (await bob.get(f"/spaces/{space}")).headers
                assert body["error"]["retry_after"] >= 1
                _status(await bob.get("/spaces"), 503, "save_pending")
                # saved state still answers at once (item 6: no wait behind pending saves)
                t0 = time.perf_counter()
                got = _status(await bob.get(f"/spaces/{saved_space}"), 200)
                assert got["id"] == saved_space
                _status(await bob.get("/participant"), 200)
                assert time.perf_counter() - t0 < 0.25
            finally:
                emitter.ops = good
                handler.save_timeout = 30.0
                handler.read_wait = 10.0
            # the disk is back: the same reads wait for the save and answer
            with trio.fail_after(30):
                got = _status(await bob.get(f"/spaces/{space}"), 200)
                assert got["id"] == space
                listed = _status(await bob.get("/spaces"), 200)
                assert space in [s["id"] for s in listed["items"]]
            emitter.ops = FailingFsync()
            handler.save_timeout = handler.read_wait = 0.3
            try:
                # an unsaved input: another member reads neither its receipt nor the
                # conversation that counts it
                err = _status(await eve.post(f"/conversations/{con}/inputs", text="hi",
                                             model=TINY_MODEL, max_output_tokens=2),
                              503, "save_pending")
                input_op = err["error"]["operation"]
                _status(await bob.get(f"/operations/{input_op}"), 503, "save_pending")
                _status(await bob.get(f"/conversations/{con}"), 503, "save_pending")
                _status(await bob.get(f"/spaces/{saved_space}/conversations"), 503,
                        "save_pending")
                assert _status(await eve.get(f"/conversations/{con}"), 200)["inputs"] == "1"
            finally:
                emitter.ops = good
                handler.save_timeout = 30.0
                handler.read_wait = 10.0
            with trio.fail_after(30):
                receipt = _status(await bob.get(f"/operations/{input_op}"), 200)
                assert receipt["admission"]["saved"] is True
                assert receipt["sequence"] is None               # foreign counters hidden
                assert _status(await bob.get(f"/conversations/{con}"), 200)["inputs"] == "1"
