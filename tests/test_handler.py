"""The runtime's service handler: the save.watch stream on a real device + journal,
over both transports, and the participant counters before/after registration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, Env, embedded

from aotx_trio import errors
from aotx_trio.service import client

pytestmark = pytest.mark.timeout(120)


def _submit(env: Env, who: str, key: int, seq: int, kind: str = "participant.register",
            **body: Any) -> dict[str, Any]:
    return {"principal": who, "actions": list(ALL), "kind": kind,
            "body": env.body(key, seq, **body)}


async def _watch_while_registering(env: Env, c: client.DeviceClient) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    with trio.fail_after(30):
        async with c.watch_saves(limit=2) as sub:
            got.append(sub.opened)
            for i, who in enumerate(("alice", "bob")):
                await c.call("mutation.submit", _submit(env, who, i + 1, 1))
                got.append(await sub.__anext__())
            with pytest.raises(StopAsyncIteration):
                await sub.__anext__()
        assert sub.end_reason == "complete"
    return got


def _check_advancing(states: list[dict[str, Any]]) -> None:
    saved = [int(s["saved_records"]) for s in states]
    assert saved == sorted(saved) and saved[0] < saved[1] < saved[2], saved
    assert {s["source"] for s in states} == {"journal"}
    assert len({s["commit_digest"] for s in states}) == 3   # each save moves the chain


async def test_save_watch_in_process(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL}) as env:
        _check_advancing(await _watch_while_registering(env, client.InProcessClient(
            env.handler)))


async def test_save_watch_over_the_socket(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL}) as env:
        sc = client.SocketClient(str(env.folder / "journal" / "service.sock"),
                                 connect_timeout=5)
        async with trio.open_nursery() as n:
            await n.start(sc.run)
            _check_advancing(await _watch_while_registering(env, sc))
            n.cancel_scope.cancel()


async def test_save_watch_refuses_a_bad_limit_and_unknown_streams(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL}) as env:
        c = client.InProcessClient(env.handler)
        for bad in (0, -1, "2", True, 1.5):
            with pytest.raises(errors.InvalidInput) as info:
                async with c.subscribe("save.watch", {"limit": bad}):
                    pass
            assert info.value.fields["field"] == "limit"
        with pytest.raises(errors.NotFound):
            async with c.subscribe("operation.get", {}):
                pass


async def test_retry_floor_reads_the_same_before_and_after_registration(
        tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL}) as env:
        me = {"principal": "alice", "actions": list(ALL)}
        before = await env.handler.call("participant.get", me)
        assert before["participant"] is None
        await env.handler.call("mutation.submit", _submit(env, "alice", 1, 1))
        after = await env.handler.call("participant.get", me)
        assert before["retry_floor"] == after["retry_floor"] == "1"
        assert after["participant"]["retry_floor"] == "1"
        assert (before["next_sequence"], after["next_sequence"]) == ("1", "2")


async def test_reads_never_wait_behind_saves(tmp_path: Path) -> None:
    """Split-deployment shape (the socket client): with every fsync slowed to 2 s and
    twenty writes waiting for their saves, a read still answers at once."""
    import time

    writers = [f"w{i}" for i in range(20)]
    async with embedded(tmp_path, {"alice": ALL, **dict.fromkeys(writers, ALL)}) as env:
        state = env.handler.state
        assert state is not None
        ops = state.emitter.ops
        real = ops.fsync
        sc = client.SocketClient(str(env.folder / "journal" / "service.sock"),
                                 connect_timeout=5)
        async with trio.open_nursery() as n:
            await n.start(sc.run)
            for who in ["alice", *writers]:
                await sc.submit(who, list(ALL), "participant.register", env.body(1, 1))

            def slow(fd: int) -> None:
                time.sleep(2.0)
                real(fd)

            ops.fsync = slow  # type: ignore[method-assign]
            waiting: list[str] = []

            async def write(i: int) -> None:   # one writer each: sequences stay in order
                out = await sc.submit(writers[i], list(ALL), "space.create",
                                      env.body(100 + i, 2))
                waiting.append(out["receipt"]["status"])

            for i in range(20):
                n.start_soon(write, i)
            await trio.sleep(0.3)
            assert waiting == []                     # all still waiting for their save
            t0 = time.perf_counter()
            me = await sc.participant("alice", list(ALL))
            took = time.perf_counter() - t0
            assert me["participant"] is not None
            assert took < 0.5, took                  # not behind the 2-second fsyncs
            ops.fsync = real  # type: ignore[method-assign]
            with trio.fail_after(30):
                while len(waiting) < 20:
                    await trio.sleep(0.05)
            n.cancel_scope.cancel()


METHODS = ("ping", "capabilities", "save_state", "metrics", "participant.get",
           "mutation.submit", "space.get", "space.list", "member.list", "conversation.list",
           "conversation.get", "conversation.events", "operation.get", "operation.result",
           "identity", "embed", "media.put", "model.load", "memory.list", "memory.get")
STREAMS = ("save.watch", "operation.watch", "conversation.watch", "chat.generate")


async def test_every_call_group_routes_its_methods(tmp_path: Path) -> None:
    """The handler's groups (runtime/calls_*.py) answer every method and stream of
    docs/formats/socket.md: a call without parameters is refused by the method, never
    as ``method_not_found``."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        for fn, names in ((env.handler.call, METHODS), (env.handler.open_stream, STREAMS)):
            for name in names:
                try:
                    await fn(name, {})
                except errors.AotxError as exc:
                    assert exc.code != "method_not_found", name
        for fn in (env.handler.call, env.handler.open_stream):
            with pytest.raises(errors.NotFound) as info:
                await fn("no.such", {})
            assert info.value.code == "method_not_found"
