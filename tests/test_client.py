"""The device client: both transports give the same results and the same errors,
for calls and for streams (items, end reasons, cancel, slow consumers); the socket
client multiplexes concurrent calls and streams, fails waiting calls and open
streams when the runtime goes away, and reconnects."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from aotx_trio import errors
from aotx_trio.runtime import socket_server as service
from aotx_trio.service import client
from aotx_trio.service.pushed import Pushed


class Recorder:
    """A handler that answers with what it was asked (and raises on request)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.open_streams = 0
        self.closed = trio.Event()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        self.calls.append((method, params))
        if params.get("raise"):
            raise errors.JournalHold("journal on hold", code="journal_hold", hold=["disk"])
        await trio.sleep(params.get("delay", 0))
        return {"method": method, "params": params}

    # streams: count (n items, then complete), burst (n items without a pause),
    # forever (one item per ``delay``), boom (one item, then an error), dropped (one
    # item, then the runtime drops it as a slow consumer), shared (the same pushed
    # items to every stream)
    async def open_stream(self, method: str, params: dict[str, Any],
                          ) -> tuple[Any, AsyncIterator[Any]]:
        if method == "shared":
            return {"stream": method}, self._shared(params.get("n", 1))
        if method not in ("count", "burst", "forever", "boom", "dropped"):
            raise errors.NotFound(f"no stream {method}", code="method_not_found")
        self.calls.append((method, params))
        return {"stream": method}, self._items(method, params)

    async def _items(self, method: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        self.open_streams += 1
        try:
            i = 0
            while method == "forever" or i < params.get("n", 1):
                if method == "forever":
                    await trio.sleep(params.get("delay", 0.001))
                elif method != "burst":
                    await trio.lowlevel.checkpoint()
                yield {"i": i}
                i += 1
            if method == "boom":
                raise errors.JournalHold("hold", code="journal_hold", hold=["disk"])
            if method == "dropped":
                raise errors.OverCapacity("fell behind", code="slow_consumer")
        finally:
            self.open_streams -= 1
            self.closed.set()


    async def _shared(self, n: int) -> AsyncIterator[Any]:
        for i in range(n):
            await trio.lowlevel.checkpoint()
            yield SHARED[i]


SHARED = [Pushed({"i": i, "text": "é" * i}) for i in range(8)]


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


# --------------------------------------------------------------------------- streams


@contextlib.asynccontextmanager
async def _transport(kind: str, sock_path: Path, handler: Recorder,
                     ) -> AsyncIterator[client.DeviceClient]:
    if kind == "inprocess":
        yield client.InProcessClient(handler)
        return
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, handler)
        sc = client.SocketClient(str(sock_path), connect_timeout=5)
        await n.start(sc.run)
        yield sc
        n.cancel_scope.cancel()


TRANSPORTS = ["inprocess", "socket"]


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_stream_items_then_complete(kind: str, sock_path: Path) -> None:
    h = Recorder()
    async with _transport(kind, sock_path, h) as c:
        with trio.fail_after(10):
            async with c.subscribe("count", {"n": 3}) as sub:
                assert sub.opened == {"stream": "count"}
                got = [item async for item in sub]
            assert got == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert sub.end_reason == "complete" and sub.error is None
            assert sub.delivered == 3
            await h.closed.wait()
    assert h.open_streams == 0


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_stream_refused_at_open(kind: str, sock_path: Path) -> None:
    async with _transport(kind, sock_path, Recorder()) as c:
        with pytest.raises(errors.NotFound) as info:
            async with c.subscribe("nope", {}):
                raise AssertionError("opened")
        assert info.value.code == "method_not_found"
        # the connection is still good for calls after a refused open
        assert (await c.call("ping", {}))["method"] == "ping"


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_stream_error_is_raised_with_its_class(kind: str, sock_path: Path) -> None:
    async with _transport(kind, sock_path, Recorder()) as c:
        got: list[Any] = []
        with trio.fail_after(10):
            async with c.subscribe("boom", {"n": 1}) as sub:
                with pytest.raises(errors.JournalHold) as info:
                    async for item in sub:
                        got.append(item)
        assert got == [{"i": 0}]
        assert sub.end_reason == "error"
        assert info.value.fields == {"hold": ["disk"]}


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_leaving_the_block_cancels_the_stream_at_the_runtime(kind: str,
                                                                   sock_path: Path) -> None:
    h = Recorder()
    async with _transport(kind, sock_path, h) as c:
        with trio.fail_after(10):
            async with c.subscribe("forever", {"delay": 0.001}) as sub:
                seen = 0
                async for _ in sub:
                    seen += 1
                    if seen == 3:
                        break
            assert sub.end_reason == "cancelled"
            await h.closed.wait()      # the runtime side ended its generator
            assert h.open_streams == 0
            assert (await c.call("after", {}))["method"] == "after"


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_slow_consumer_is_dropped(kind: str, sock_path: Path) -> None:
    h = Recorder()
    async with _transport(kind, sock_path, h) as c:
        with trio.fail_after(10):
            async with c.subscribe("burst", {"n": 50}, buffer=2) as sub:
                while sub.end_reason is None:       # let the items pile up unread
                    await trio.sleep(0.01)
                got = [item async for item in sub]
            assert sub.end_reason == "slow_consumer"
            assert got == [{"i": 0}, {"i": 1}]    # what fitted the buffer, in order
            await h.closed.wait()
            assert h.open_streams == 0


async def test_many_streams_and_calls_share_one_connection(sock_path: Path) -> None:
    h = Recorder()
    results: dict[int, list[Any]] = {}
    async with _transport("socket", sock_path, h) as c:
        async def one(i: int) -> None:
            async with c.subscribe("count", {"n": i % 5 + 1}) as sub:
                results[i] = [x["i"] async for x in sub]
            results[-i - 1] = [(await c.call("echo", {"i": i}))["params"]["i"]]

        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                for i in range(20):
                    n.start_soon(one, i)
    for i in range(20):
        assert results[i] == list(range(i % 5 + 1))
        assert results[-i - 1] == [i]


async def test_runtime_shutdown_ends_open_streams(sock_path: Path) -> None:
    h = Recorder()
    runtime = trio.CancelScope()

    async def run_runtime(task_status: trio.TaskStatus[Path]) -> None:
        with runtime:
            await service.serve_socket(sock_path, h, task_status=task_status)

    async with trio.open_nursery() as n:
        sc = client.SocketClient(str(sock_path), connect_timeout=5)
        await n.start(run_runtime)
        await n.start(sc.run)
        with trio.fail_after(10):
            async with sc.subscribe("forever", {"delay": 0.005}) as sub:
                first = await sub.__anext__()
                runtime.cancel()                         # the runtime stops
                rest = [item async for item in sub]
        assert first == {"i": 0}
        assert sub.end_reason == "shutdown" and sub.error is None
        assert all("i" in item for item in rest)
        n.cancel_scope.cancel()


async def test_connection_loss_fails_an_open_stream(sock_path: Path) -> None:
    """A runtime that vanishes mid-stream (no end frame): the iteration raises
    RuntimeUnavailable instead of hanging."""
    from aotx_trio.service import wire

    async def abrupt(stream: trio.SocketStream) -> None:
        reader = wire.FrameReader(stream)
        req = await reader.read()
        assert req is not None and req["stream"] is True
        await stream.send_all(wire.encode_frame(wire.success(req["id"], {}, stream=True)))
        await stream.send_all(wire.encode_frame(wire.item(req["id"], 1)))
        await stream.aclose()                       # gone, without an end frame

    sock_path.parent.mkdir(parents=True, exist_ok=True)
    sock = trio.socket.socket(trio.socket.AF_UNIX)
    await sock.bind(str(sock_path))
    sock.listen(1)
    listener = trio.SocketListener(sock)
    async with trio.open_nursery() as n:
        n.start_soon(trio.serve_listeners, abrupt, [listener])
        sc = client.SocketClient(str(sock_path), connect_timeout=5)
        await n.start(sc.run)
        with trio.fail_after(10):
            async with sc.subscribe("x", {}) as sub:
                assert await sub.__anext__() == 1
                with pytest.raises(errors.RuntimeUnavailable):
                    await sub.__anext__()
        assert sub.end_reason == "error"
        n.cancel_scope.cancel()


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_a_stream_the_runtime_drops_ends_as_a_slow_consumer(kind: str,
                                                                  sock_path: Path) -> None:
    async with _transport(kind, sock_path, Recorder()) as c:
        with trio.fail_after(10):
            async with c.subscribe("dropped", {"n": 1}) as sub:
                got = [item async for item in sub]
        assert got == [{"i": 0}]
        assert (sub.end_reason, sub.error) == ("slow_consumer", None)


@pytest.mark.parametrize("kind", TRANSPORTS)
async def test_pushed_items_reach_every_stream_as_one_object(kind: str,
                                                             sock_path: Path) -> None:
    """The runtime pushes one shared item to many streams: over the socket it is
    decoded once, and every stream gets the same object (as in process)."""
    got: list[list[Any]] = [[], [], []]
    async with _transport(kind, sock_path, Recorder()) as c:
        with trio.fail_after(10):
            async with trio.open_nursery() as n:
                async def one(i: int) -> None:
                    async with c.subscribe("shared", {"n": 5}) as sub:
                        got[i] = [item async for item in sub]

                for i in range(3):
                    n.start_soon(one, i)
    assert got[0] == [dict(x) for x in SHARED[:5]]
    for k in range(5):
        assert got[0][k] is got[1][k] is got[2][k]
        assert isinstance(got[0][k], Pushed)
