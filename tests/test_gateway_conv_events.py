"""GET /conversations/{con}/events through a real hypercorn with httpx: pages by
input-order cursor, foreign counters null, rights, the SSE stream with
Last-Event-ID resume, and the gap a retirement leaves."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, LINEAGE, SCHEMA, TINY_MODEL, served, token_for
from test_gateway_events import _events

from aotx_trio.vocab import principal_key

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object (?!_events ):"
        "pytest.PytestUnraisableExceptionWarning"),
]
BASE = "/aotx/v1/shared"
PEOPLE = {"alice": ALL, "bob": ALL, "carol": ALL}


def _body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


def _auth(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_for(who)}"}


class Room:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.seq = {"alice": 1, "bob": 1, "carol": 1}
        self.con = ""

    async def post(self, who: str, path: str, **fields: Any) -> httpx.Response:
        seq = self.seq[who]
        r = await self.http.post(BASE + path, headers=_auth(who),
                                 json=_body(seq * 100 + len(who), seq, **fields))
        assert r.status_code == 202, r.text
        self.seq[who] = seq + 1
        return r

    async def setup(self) -> None:
        for who in self.seq:
            await self.post(who, "/participant")
        space = (await self.post("alice", "/spaces", scope="room")).json()["resource"]
        await self.post("alice", f"/spaces/{space}/members",
                        participant=f"par-{LINEAGE}-{principal_key('bob')}",
                        permissions=["read", "write"])
        r = await self.post("alice", f"/spaces/{space}/conversations")
        self.con = r.json()["resource"]

    async def say(self, who: str, text: str) -> str:
        r = await self.post(who, f"/conversations/{self.con}/inputs", text=text,
                            model=TINY_MODEL, max_output_tokens=2)
        op: str = r.json()["operation"]
        return op

    async def page(self, who: str, query: str = "") -> httpx.Response:
        return await self.http.get(f"{BASE}/conversations/{self.con}/events{query}",
                                   headers=_auth(who))


async def test_pages_follow_input_order(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(
            base_url=srv.url, timeout=30) as http:
        room = Room(http)
        await room.setup()
        ops = [await room.say(w, f"turn {i}") for i, w in enumerate(("alice", "bob", "alice"))]
        got = (await room.page("bob", "?limit=2")).json()
        assert [e["cursor"] for e in got["items"]] == ["1", "2"]
        assert [e["receipt"]["operation"] for e in got["items"]] == ops[:2]
        assert (got["next_cursor"], got["more"], got["gap"], got["event_floor"]) == \
               ("2", True, False, "0")
        # alice's input is foreign to bob: counters null; his own carries them
        assert got["items"][0]["receipt"]["sequence"] is None
        assert got["items"][1]["receipt"]["sequence"] is not None
        rest = (await room.page("bob", "?cursor=2")).json()
        assert [e["cursor"] for e in rest["items"]] == ["3"]
        assert (rest["next_cursor"], rest["more"]) == ("3", False)
        end = (await room.page("alice", "?cursor=3")).json()
        assert (end["items"], end["next_cursor"], end["more"]) == ([], "3", False)
        # no right on the room: not found; bad arguments name the field
        r = await room.page("carol")
        assert r.status_code == 404 and r.json()["error"]["code"] == "conversation_not_found"
        for query, field in (("?cursor=x", "cursor"), ("?cursor=9", "cursor"),
                             ("?limit=0", "limit"), ("?stream=yes", "stream")):
            r = await room.page("alice", query)
            assert r.status_code == 422 and r.json()["error"]["field"] == field, query
        assert (await http.get(f"{BASE}/conversations/{room.con}/events")).status_code == 401


async def test_the_stream_pushes_inputs_and_resumes(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(
            base_url=srv.url, timeout=30) as http:
        room = Room(http)
        await room.setup()
        first = await room.say("alice", "before the stream")
        url = f"{BASE}/conversations/{room.con}/events?stream=true"
        seen: list[tuple[str | None, str]] = []
        with trio.fail_after(60):
            async with http.stream("GET", url, headers=_auth("bob")) as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                assert resp.status_code == 200
                assert resp.headers["content-type"].startswith("text/event-stream")
                said = False
                async for event_id, kind, data in stream:
                    if kind == "comment":
                        if not said:
                            said = True
                            second = await room.say("bob", "during the stream")
                        continue
                    assert kind == "input"
                    seen.append((event_id, data["receipt"]["operation"]))
                    if len(seen) == 2:
                        break
            assert seen == [(f"{room.con}/1", first), (f"{room.con}/2", second)]
            third = await room.say("alice", "while nobody listens")
            resume = {**_auth("bob"), "Last-Event-ID": f"{room.con}/2"}
            async with http.stream("GET", url, headers=resume) as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                async for event_id, kind, data in stream:
                    if kind == "input":
                        assert (event_id, data["receipt"]["operation"]) == \
                               (f"{room.con}/3", third)
                        break


async def test_a_retirement_leaves_a_gap(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(
            base_url=srv.url, timeout=30) as http:
        room = Room(http)
        await room.setup()
        op = await room.say("alice", "soon retired")
        await room.say("bob", "kept")
        with trio.fail_after(30):
            while (await http.get(f"{BASE}/operations/{op}",
                                  headers=_auth("alice"))).json()["terminal"]["saved"] is False:
                await trio.sleep(0.01)
        await room.post("alice", "/participant/retirements",
                        retry_floor=str(room.seq["alice"]))
        got = (await room.page("bob")).json()
        assert (got["gap"], got["event_floor"]) == (True, "1")
        assert [e["cursor"] for e in got["items"]] == ["2"]
        url = f"{BASE}/conversations/{room.con}/events?stream=true&cursor=0"
        with trio.fail_after(30):
            async with http.stream("GET", url, headers=_auth("bob")) as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                kinds = []
                async for event_id, kind, _data in stream:
                    if kind == "comment":
                        continue
                    kinds.append((kind, event_id))
                    if kind == "input":
                        break
        assert kinds == [("gap", f"{room.con}/1"), ("input", f"{room.con}/2")]


async def test_gaps_in_the_middle_of_the_window_are_reported(tmp_path: Path) -> None:
    """Retirements of cursors 1, 3-5 and 10-13 (alice's inputs, interleaved with
    bob's): a read from cursor 2 returns 6-9 and says which runs it passed (3-5,
    10-13), with the event floor 1 (every input at or below it is retired); pages
    carry their own gaps and continue past them; the stream sends one gap event per
    run before the inputs after it, then follows new inputs."""
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(
            base_url=srv.url, timeout=30) as http:
        room = Room(http)
        await room.setup()
        plan = ["alice", "bob", "alice", "alice", "alice", "bob", "bob", "bob", "bob",
                "alice", "alice", "alice", "alice"]
        ops = [await room.say(who, f"turn {i + 1}") for i, who in enumerate(plan)]
        with trio.fail_after(60):
            for op in ops:
                while not (await http.get(f"{BASE}/operations/{op}", headers=_auth(
                        "alice"))).json()["terminal"]["saved"]:
                    await trio.sleep(0.01)
        await room.post("alice", "/participant/retirements",
                        retry_floor=str(room.seq["alice"]))

        got = (await room.page("bob", "?cursor=2")).json()
        assert [e["cursor"] for e in got["items"]] == ["6", "7", "8", "9"]
        assert got["gap"] is True and got["event_floor"] == "1"
        assert got["gaps"] == [{"first": "3", "last": "5"}, {"first": "10", "last": "13"}]
        assert (got["next_cursor"], got["more"]) == ("13", False)
        whole = (await room.page("bob")).json()
        assert whole["gaps"][0] == {"first": "1", "last": "1"} and whole["gap"] is True
        assert [e["cursor"] for e in whole["items"]] == ["2", "6", "7", "8", "9"]

        first = (await room.page("bob", "?cursor=2&limit=2")).json()
        assert [e["cursor"] for e in first["items"]] == ["6", "7"]
        assert (first["gaps"], first["next_cursor"], first["more"]) == (
            [{"first": "3", "last": "5"}], "7", True)
        second = (await room.page("bob", "?cursor=7&limit=2")).json()
        assert [e["cursor"] for e in second["items"]] == ["8", "9"]
        assert (second["gaps"], second["next_cursor"]) == (
            [{"first": "10", "last": "13"}], "13")
        last = (await room.page("bob", "?cursor=13")).json()
        assert (last["items"], last["gap"], last["gaps"]) == ([], False, [])

        url = f"{BASE}/conversations/{room.con}/events?stream=true&cursor=2"
        with trio.fail_after(60):
            async with http.stream("GET", url, headers=_auth("bob")) as resp, \
                    contextlib.aclosing(_events(resp)) as stream:
                seen: list[tuple[str, str, Any]] = []
                async for event_id, kind, data in stream:
                    if kind == "comment":
                        continue
                    seen.append((kind, event_id, data))
                    if event_id == f"{room.con}/13":
                        later = await room.say("bob", "after the gaps")
                    if kind == "input" and data["cursor"] == "14":
                        assert data["receipt"]["operation"] == later
                        break
        assert [(k, i.rsplit("/", 1)[1]) for k, i, _ in seen] == [
            ("gap", "5"), ("input", "6"), ("input", "7"), ("input", "8"), ("input", "9"),
            ("gap", "13"), ("input", "14")]
        assert seen[0][2] == {"cursor": "2", "first": "3", "last": "5", "event_floor": "1"}
        assert seen[5][2] == {"cursor": "9", "first": "10", "last": "13",
                              "event_floor": "1"}


async def test_conversation_watch_over_the_socket(tmp_path: Path) -> None:
    """The split deployment's shape: conversation.watch rides the push frames."""
    from _gateway_env import embedded

    from aotx_trio.service import client

    async with embedded(tmp_path, {"alice": ALL}) as env:
        sc = client.SocketClient(str(env.folder / "journal" / "service.sock"),
                                 connect_timeout=5)
        async with trio.open_nursery() as n:
            await n.start(sc.run)
            me = ("alice", list(ALL))
            await sc.submit(*me, "participant.register", env.body(1, 1))
            space = (await sc.submit(*me, "space.create", env.body(2, 2)))["receipt"]["resource"]
            con = (await sc.submit(*me, "conversation.create",
                                   {**env.body(3, 3), "space": space}))["receipt"]["resource"]
            with trio.fail_after(30):
                async with sc.subscribe("conversation.watch", {
                        "principal": "alice", "actions": list(ALL), "conversation": con,
                        "cursor": "0"}) as sub:
                    assert sub.opened == {"cursor": "0", "event_floor": "0", "gap": False}
                    ops = []
                    for i in range(2):
                        out = await sc.submit(*me, "input", {
                            **env.body(10 + i, 4 + i), "conversation": con,
                            "text": f"hello {i}", "model": TINY_MODEL,
                            "max_output_tokens": 2})
                        ops.append(out["receipt"]["operation"])
                        item = await sub.__anext__()
                        assert (item["cursor"], item["receipt"]["operation"]) == \
                               (str(i + 1), ops[-1])
            page = await sc.conversation_events("alice", list(ALL), con, None, 10)
            assert [e["receipt"]["operation"] for e in page["items"]] == ops
            n.cancel_scope.cancel()
