"""The device client: both transports give the same results and the same errors;
the socket client multiplexes concurrent calls, fails waiting calls when the
runtime goes away, and reconnects."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from aotx_trio import client, errors
from aotx_trio.runtime import service


class Recorder:
    """A handler that answers with what it was asked (and raises on request)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        if params.get("raise"):
            raise errors.JournalHold("journal on hold", code="journal_hold", hold=["disk"])
        await trio.sleep(params.get("delay", 0))
        return {"method": method, "params": params}


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes: keep it short.
    short = Path(tempfile.mkdtemp(prefix="aotx-t-", dir="/tmp"))
    yield short / "service.sock"
    shutil.rmtree(short, ignore_errors=True)


async def _exercise(c: client.DeviceClient) -> list[Any]:
    out: list[Any] = [
        await c.capabilities(),
        await c.participant("alice", ["shared_read"]),
        await c.submit("alice", ["shared_write"], "space.create", {"scope": "room"}),
        await c.spaces("alice", ["shared_read"], "5", 10),
        await c.operation_result("alice", ["shared_read"], "op-x", 7),
    ]
    with pytest.raises(errors.JournalHold) as info:
        await c.call("x", {"raise": True})
    out.append(info.value.envelope())
    return out


async def test_both_transports_agree(sock_path: Path) -> None:
    local = await _exercise(client.InProcessClient(Recorder()))
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, Recorder())
        sc = client.SocketClient(str(sock_path), connect_timeout=5)
        await n.start(sc.run)
        remote = await _exercise(sc)
        n.cancel_scope.cancel()
    assert remote == local
    assert local[2] == {"method": "mutation.submit",
                        "params": {"kind": "space.create", "body": {"scope": "room"},
                                   "principal": "alice", "actions": ["shared_write"]}}
    assert local[5] == {"error": {"code": "journal_hold", "message": "journal on hold",
                                  "hold": ["disk"]}}


async def test_socket_client_multiplexes_concurrent_calls(sock_path: Path) -> None:
    results: dict[int, Any] = {}
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, Recorder())
        sc = client.SocketClient(str(sock_path), connect_timeout=5)
        await n.start(sc.run)

        async def one(i: int) -> None:
            results[i] = await sc.call("echo", {"i": i, "delay": (50 - i) / 1000})

        async with trio.open_nursery() as inner:
            for i in range(50):
                inner.start_soon(one, i)
        n.cancel_scope.cancel()
    assert {i: r["params"]["i"] for i, r in results.items()} == {i: i for i in range(50)}


async def test_runtime_loss_fails_waiting_calls_then_reconnects(sock_path: Path) -> None:
    failures: list[str] = []
    async with trio.open_nursery() as n:
        sc = client.SocketClient(str(sock_path), connect_timeout=5)

        async def waiter() -> None:
            try:
                await sc.call("slow", {"delay": 30})
            except client.RuntimeUnavailable as exc:
                failures.append(exc.code)

        async with trio.open_nursery() as runtime:   # the first runtime process
            await runtime.start(service.serve_socket, sock_path, Recorder())
            await n.start(sc.run)
            n.start_soon(waiter)
            await trio.sleep(0.05)
            runtime.cancel_scope.cancel()            # it goes away mid-call
        with trio.fail_after(10):
            while not failures:
                await trio.sleep(0.01)
        assert failures == ["runtime_unavailable"]
        with pytest.raises(client.RuntimeUnavailable):
            await sc.call("now", {})
        await n.start(service.serve_socket, sock_path, Recorder())   # restarted
        with trio.fail_after(10):
            while True:
                try:
                    reply = await sc.call("again", {})
                    break
                except client.RuntimeUnavailable:
                    await trio.sleep(0.05)
        assert reply["method"] == "again"
        n.cancel_scope.cancel()


async def test_socket_client_gives_up_when_no_runtime(sock_path: Path) -> None:
    sc = client.SocketClient(str(sock_path), connect_timeout=0.2)
    with pytest.raises(client.RuntimeUnavailable, match="cannot connect"):
        await sc.run()
