"""The runtime's event fanout (runtime/fanout.py) on a real runtime with the tiny
model: many followers of one conversation share one device read per pass and one
item per view (own / foreign counters), each gets every event once in order; a
reader who loses the right ends with the error while the others go on; a full
follower is dropped as a slow consumer; an operation's followers share the
executor's spans and end with the device's result."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, LINEAGE, TINY_MODEL, Env, embedded

from aotx_trio import errors
from aotx_trio.native import lib as native
from aotx_trio.runtime.executor import OUTPUT_BATCH_BYTES, Executor
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.service.client import InProcessClient, Subscription
from aotx_trio.service.pushed import Pushed
from aotx_trio.vocab import principal_key

pytestmark = pytest.mark.timeout(120)
PEOPLE = {"alice": ALL, "bob": ALL, "carol": ALL}


class Room:
    """alice's room with bob (read, write) and carol (read) as members."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.client = InProcessClient(env.handler)
        self.seq = dict.fromkeys(PEOPLE, 1)
        self.con = ""
        self.space = ""

    async def submit(self, who: str, kind: str, **fields: Any) -> dict[str, Any]:
        seq = self.seq[who]
        self.seq[who] = seq + 1
        out = await self.client.submit(who, list(ALL), kind,
                                       self.env.body(seq * 16 + len(who), seq, **fields))
        receipt: dict[str, Any] = out["receipt"]
        return receipt

    async def setup(self) -> None:
        for who in PEOPLE:
            await self.submit(who, "participant.register")
        self.space = (await self.submit("alice", "space.create", scope="room"))["resource"]
        for who, rights in (("bob", ["read", "write"]), ("carol", ["read"])):
            await self.member(who, rights)
        self.con = (await self.submit("alice", "conversation.create",
                                      space=self.space))["resource"]

    async def member(self, who: str, rights: list[str]) -> None:
        await self.submit("alice", "member.set", space=self.space, permissions=rights,
                          participant=f"par-{LINEAGE}-{principal_key(who)}")

    async def say(self, who: str, text: str, tokens: int = 2) -> str:
        op: str = (await self.submit(who, "input", conversation=self.con, text=text,
                                     model=TINY_MODEL, max_output_tokens=tokens))["operation"]
        return op

    def watch(self, who: str) -> Any:
        return self.client.subscribe("conversation.watch", {
            "principal": who, "actions": list(ALL), "conversation": self.con, "cursor": "0"})


def _fanout(env: Env) -> Fanout:
    assert env.handler.fanout is not None
    return env.handler.fanout


async def _until(check: Any) -> None:
    while not check():
        await trio.sleep(0.005)


STABLE = ("operation", "participant", "sequence", "operation_key", "kind")


async def test_followers_share_one_read_and_one_item_per_view(tmp_path: Path) -> None:
    readers = [*["bob"] * 8, *["carol"] * 8, "alice", "alice"]
    async with embedded(tmp_path, PEOPLE) as env:
        room = Room(env)
        await room.setup()
        fan = _fanout(env)
        got: list[list[Any]] = [[] for _ in readers]
        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                async def follow(i: int) -> None:
                    async with room.watch(readers[i]) as sub:
                        async for item in sub:
                            got[i].append(item)
                            if len(got[i]) == 3:
                                return

                for i in range(len(readers)):
                    n.start_soon(follow, i)
                await _until(lambda: fan.followers() == len(readers))
                passes, reads = fan.passes, fan.reads
                ops = [await room.say(w, f"turn {k}") for k, w in
                       enumerate(("alice", "bob", "alice"))]
        # every follower got every event once, in input order
        for items in got:
            assert [(e["cursor"], e["receipt"]["operation"]) for e in items] == \
                   [(str(k + 1), op) for k, op in enumerate(ops)]
        # one item per view, shared: bob's and carol's view of alice's inputs is the
        # same object; bob's own input is his own view (counters), foreign to the others
        bob, carol, alice = got[0], got[8], got[16]
        for k in range(3):
            assert all(g[k] is got[0 if r == "bob" else 8 if r == "carol" else 16][k]
                       for g, r in zip(got, readers, strict=True))
            assert isinstance(bob[k], Pushed)
        assert bob[0] is carol[0] and bob[2] is carol[2] and bob[1] is not carol[1]
        assert bob[1]["receipt"]["sequence"] is not None
        assert carol[1]["receipt"]["sequence"] is None
        assert alice[1]["receipt"]["sequence"] is None and alice[0]["receipt"]["sequence"]
        # the items say what each reader's own page says
        for who, items in (("bob", bob), ("carol", carol), ("alice", alice)):
            page = await room.client.conversation_events(who, list(ALL), room.con, None, 10)
            assert [{f: e["receipt"][f] for f in STABLE} for e in page["items"]] == \
                   [{f: e["receipt"][f] for f in STABLE} for e in items]
        # device reads: one per pass and topic, plus one right check per reader and
        # publishing pass: not one per follower
        assert fan.reads - reads <= (fan.passes - passes) + 3 * 3
        assert fan.pushed >= 3 * len(readers)


async def test_a_reader_who_loses_the_right_gets_the_error(tmp_path: Path) -> None:
    async with embedded(tmp_path, PEOPLE) as env:
        room = Room(env)
        await room.setup()
        fan = _fanout(env)
        subs: dict[str, Subscription] = {}
        items: dict[str, list[Any]] = {"bob": [], "carol": []}
        failure: list[errors.AotxError] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                async def follow(who: str) -> None:
                    async with room.watch(who) as sub:
                        subs[who] = sub
                        try:
                            async for item in sub:
                                items[who].append(item)
                                if len(items[who]) == 2:
                                    return
                        except errors.AotxError as exc:
                            failure.append(exc)

                n.start_soon(follow, "bob")
                n.start_soon(follow, "carol")
                await _until(lambda: fan.followers() == 2)
                await room.say("alice", "everyone reads this")
                await _until(lambda: len(items["carol"]) == 1)
                await room.member("carol", [])          # carol is out of the room
                await room.say("alice", "carol does not")
        assert [e["cursor"] for e in items["bob"]] == ["1", "2"]
        assert [e["cursor"] for e in items["carol"]] == ["1"]
        assert [e.code for e in failure] == ["conversation_not_found"]
        assert subs["carol"].end_reason == "error"


async def test_a_full_follower_is_dropped_as_a_slow_consumer(tmp_path: Path) -> None:
    async with embedded(tmp_path, PEOPLE) as env:
        room = Room(env)
        await room.setup()
        fan = _fanout(env)
        fan.depth = 2
        _, stream = await env.handler.open_stream("conversation.watch", {
            "principal": "bob", "actions": list(ALL), "conversation": room.con,
            "cursor": "0"})
        first: list[Any] = []
        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                async def one() -> None:
                    first.append(await stream.__anext__())

                n.start_soon(one)
                await _until(lambda: fan.followers() == 1)
                await room.say("alice", "read at once")
            for k in range(4):                        # nobody reads: the buffer fills
                await room.say("alice", f"piling up {k}")
            await _until(lambda: fan.dropped == 1)
            assert fan.followers() == 0
            later = [await stream.__anext__(), await stream.__anext__()]
            with pytest.raises(errors.OverCapacity) as info:
                await stream.__anext__()
        assert [e["cursor"] for e in first + later] == ["1", "2", "3"]
        assert info.value.code == "slow_consumer"


async def test_operation_followers_share_the_executors_spans(tmp_path: Path) -> None:
    async with embedded(tmp_path, PEOPLE) as env:
        room = Room(env)
        await room.setup()
        fan = _fanout(env)
        state = env.handler.state
        assert state is not None
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"])
        env.handler.executor = executor                   # rounds by hand
        op = await room.say("alice", "a long answer", tokens=400)
        readers = ["alice", "alice", "bob"]
        got: list[list[Any]] = [[] for _ in readers]
        with trio.fail_after(60):
            async with trio.open_nursery() as n:
                async def follow(i: int) -> None:
                    async with room.client.subscribe("operation.watch", {
                            "principal": readers[i], "actions": list(ALL),
                            "operation": op, "offset": 0}) as sub:
                        async for item in sub:
                            got[i].append(item)

                for i in range(len(readers)):
                    n.start_soon(follow, i)
                await _until(lambda: fan.followers() == len(readers))
                while executor.knows(op.rpartition("-")[2]):        # the device id
                    await executor.cycle()
                    await trio.sleep(0.01)                # every follower takes its span
        result = await room.client.operation_result("alice", list(ALL), op, 0)
        for items in got:
            spans, end = items[:-1], items[-1]
            assert b"".join(base64.b64decode(s["data"]) for s in spans) == \
                   base64.b64decode(result["data"])
            assert end["end"] == "succeeded"
            assert all(s["next_offset"] == s["offset"] + s["length"] for s in spans)
        live = [s for s in got[0] if isinstance(s, Pushed)]
        assert len(live) > 1
        # the same span objects for every follower of one view: alice's two streams
        assert [s for s in got[1] if isinstance(s, Pushed)] == live
        assert all(a is b for a, b in zip(live, got[1], strict=False))
        # bob (not the actor) follows only saved output: live spans end on an OUTPUT
        # transfer's boundary, never inside bytes the journal does not hold yet
        bob_live = [s for s in got[2] if isinstance(s, Pushed)]
        assert all(s["next_offset"] % OUTPUT_BATCH_BYTES == 0 for s in bob_live), bob_live
        assert len(base64.b64decode(result["data"])) > 2 * OUTPUT_BATCH_BYTES   # it mattered
        assert got[2][-1]["receipt"]["sequence"] is None       # bob's view of alice's


def test_a_dropped_follower_refuses_later_pushes_of_the_same_pass() -> None:
    """One pass can hold several rows for a follower: after the push that dropped it
    (buffer full), the next ones answer False instead of raising on the closed channel
    (which ended the fanout task, and the runtime with it)."""
    from types import SimpleNamespace

    from aotx_trio.runtime.fanout import Follow

    fan = SimpleNamespace(dropped=0, pushed=0, depth=1)
    topic = SimpleNamespace(followers=set())
    f = Follow(fan, topic, "k", None, 0, 1)   # type: ignore[arg-type]
    topic.followers.add(f)
    item = object()
    assert f.push(item) is True                  # type: ignore[arg-type]
    assert f.push(item) is False                 # type: ignore[arg-type]
    assert f.dropped and fan.dropped == 1 and not topic.followers
    assert f.push(item) is False                 # type: ignore[arg-type]
    assert fan.dropped == 1 and fan.pushed == 1


async def test_a_follower_is_told_of_inputs_retired_before_it_got_them(
        tmp_path: Path) -> None:
    """Inputs retired between two passes of the fanout (alice's 1 and 3, interleaved
    with bob's 2 and 4): a live follower at cursor 0 gets a gap item before each live
    input after a retired run, never a silent jump (runtime/conv_events.py)."""
    async with embedded(tmp_path, PEOPLE) as env:
        room = Room(env)
        await room.setup()
        live = _fanout(env)
        fan = Fanout(live.device, live.saver, live.lineage)     # passes run by hand
        params = {"principal": "bob", "actions": list(ALL)}
        _, key = env.handler.callers.caller(params)
        ops = [await room.say(w, f"turn {k}") for k, w in
               enumerate(("alice", "bob", "alice", "bob"))]
        with trio.fail_after(60):
            for op in ops:
                while not (await room.client.operation("alice", list(ALL), op))[
                        "terminal"]["saved"]:
                    await trio.sleep(0.01)
        await room.submit("alice", "participant.retire",
                          retry_floor=str(room.seq["alice"]))
        from aotx_trio.runtime.validate import parse_id
        con = parse_id("conversation", room.con, env.lineage)     # the device id
        with fan.follow_conversation(con, key, lambda: env.handler.callers.caller(
                params), 0) as f:
            fan._conversation(fan._topics[("conversation", con)])
            f.stop()
            got = [dict(item) async for item in f]
        assert [(g.get("gap", False), g.get("first"), g.get("last"), g.get("cursor"))
                for g in got] == [(True, "1", "1", "0"), (False, None, None, "2"),
                                  (True, "3", "3", "2"), (False, None, None, "4")]
        assert got[0]["event_floor"] == "1" and got[3]["receipt"]["operation"] == ops[3]
