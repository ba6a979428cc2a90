"""The service socket: serves a handler, answers out of order, replaces stale sockets,
refuses a second runtime, reports bad frames, and removes its socket on exit."""

from __future__ import annotations

import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from aotx_trio import errors
from aotx_trio.runtime import socket_server as service
from aotx_trio.service import wire
from aotx_trio.service.pushed import Pushed


class SlowEcho:
    """Answers ``echo`` after ``delay`` seconds; ``fail`` raises the named class."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        if method == "echo":
            await trio.sleep(params.get("delay", 0))
            return params
        if method == "fail":
            raise errors.BelowRetryFloor("below", code="below_retry_floor", retry_floor="4")
        if method == "crash":
            raise RuntimeError("bug")
        raise errors.NotFound(f"no method {method}", code="method_not_found")


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes: keep it short.
    short = Path(tempfile.mkdtemp(prefix="aotx-t-", dir="/tmp"))
    yield short / "service.sock"
    shutil.rmtree(short, ignore_errors=True)


async def _call_raw(path: Path, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    stream = await trio.open_unix_socket(str(path))
    async with stream:
        for f in frames:
            await stream.send_all(wire.encode_frame(f))
        reader = wire.FrameReader(stream)
        out = []
        for _ in frames:
            frame = await reader.read()
            assert frame is not None
            out.append(frame)
        return out


async def test_serves_calls_out_of_order_and_cleans_up(sock_path: Path) -> None:
    async with trio.open_nursery() as n:
        got = await n.start(service.serve_socket, sock_path, SlowEcho())
        assert got == sock_path
        mode = sock_path.lstat().st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        frames = [wire.request(1, "echo", {"delay": 0.2, "n": 1}),
                  wire.request(2, "echo", {"delay": 0, "n": 2}),
                  wire.request(3, "fail", {}),
                  wire.request(4, "crash", {})]
        replies = await _call_raw(sock_path, frames)
        assert replies[0]["id"] != 1  # answers come back out of order: the slow one later
        by_id = {r["id"]: r for r in replies}
        assert by_id[1] == {"id": 1, "ok": True, "result": {"delay": 0.2, "n": 1}}
        assert by_id[2]["result"]["n"] == 2
        assert by_id[3]["kind"] == "BelowRetryFloor"
        assert by_id[3]["error"]["retry_floor"] == "4"
        assert by_id[4]["error"]["code"] == "internal_error"
        n.cancel_scope.cancel()
    assert not sock_path.exists()


async def test_bad_frame_gets_error_then_close(sock_path: Path) -> None:
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, SlowEcho())
        stream = await trio.open_unix_socket(str(sock_path))
        async with stream:
            await stream.send_all(b"\x00\x00\x00\x00")
            reader = wire.FrameReader(stream)
            frame = await reader.read()
            assert frame is not None and frame["ok"] is False
            assert frame["error"]["code"] == "frame_invalid"
            assert await reader.read() is None
        # The server still serves new connections.
        (reply,) = await _call_raw(sock_path, [wire.request(5, "echo", {"x": 1})])
        assert reply["result"] == {"x": 1}
        n.cancel_scope.cancel()


async def test_request_without_method_is_refused(sock_path: Path) -> None:
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, SlowEcho())
        (reply,) = await _call_raw(sock_path, [{"id": 9, "params": {}}])
        assert reply["id"] == 9 and reply["error"]["code"] == "frame_invalid"
        n.cancel_scope.cancel()


async def test_stale_socket_file_is_replaced(sock_path: Path) -> None:
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(sock_path))
    s.close()  # a socket file nobody listens on (a crashed runtime's)
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, SlowEcho())
        (reply,) = await _call_raw(sock_path, [wire.request(1, "echo", {})])
        assert reply["ok"] is True
        n.cancel_scope.cancel()


async def test_second_runtime_on_a_live_socket_is_refused(sock_path: Path) -> None:
    async with trio.open_nursery() as n:
        await n.start(service.serve_socket, sock_path, SlowEcho())
        with pytest.raises(errors.ConfigError, match="another runtime"):
            await service.serve_socket(sock_path, SlowEcho())
        n.cancel_scope.cancel()


async def test_regular_file_at_the_socket_path_is_refused(sock_path: Path) -> None:
    sock_path.write_text("not a socket")
    with pytest.raises(errors.ConfigError, match="not a socket"):
        await service.serve_socket(sock_path, SlowEcho())
    assert sock_path.read_text() == "not a socket"


class Broadcast:
    """``watch`` streams that all push the same :class:`Pushed` items once ``go`` is set
    (what the fanout does), then a plain item of their own."""

    def __init__(self, items: list[Pushed]) -> None:
        self.items = items
        self.go = trio.Event()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        raise errors.NotFound("no calls", code="method_not_found")

    async def open_stream(self, method: str, params: dict[str, Any]) -> tuple[Any, Any]:
        async def items() -> Any:
            await self.go.wait()
            for item in self.items:
                yield item
            yield {"own": params["n"]}
        return {"n": params["n"]}, items()


async def test_one_item_pushed_to_many_streams_is_one_shared_frame(sock_path: Path) -> None:
    """Items the fanout pushes to many streams of one connection go out as one shared
    item frame per item (the ids, then the JSON once: docs/formats/socket.md), in
    order with each stream's other frames, in very few writes; a plain item is its
    own frame."""
    first = Pushed({"cursor": "1", "text": "naïve"})
    second = Pushed({"cursor": "2"})
    handler = Broadcast([first, second])
    conns: list[service._Connection] = []
    real = service._Connection.__init__

    def keep(self: service._Connection, *a: Any) -> None:
        real(self, *a)
        conns.append(self)

    service._Connection.__init__ = keep  # type: ignore[method-assign]
    try:
        with trio.fail_after(20):
            async with trio.open_nursery() as n:
                await n.start(service.serve_socket, sock_path, handler)
                stream = await trio.open_unix_socket(str(sock_path))
                async with stream:
                    ids = [3, 5, 9, 12]
                    for sid in ids:
                        await stream.send_all(wire.encode_frame(
                            wire.request(sid, "watch", {"n": sid}, stream=True)))
                    reader = wire.FrameReader(stream)
                    for _ in ids:
                        body = await reader.read_body()
                        assert body is not None and b'"stream":true' in body
                    await trio.testing.wait_all_tasks_blocked()   # all at go.wait()
                    writes = conns[0].writes
                    handler.go.set()
                    per: dict[int, list[Any]] = {sid: [] for sid in ids}
                    bodies = []
                    while any(len(v) < 3 for v in per.values()):
                        body = await reader.read_body()
                        assert body is not None
                        frame = wire.decode_body(body)
                        if "item" not in frame:
                            assert frame["end"] == "complete"   # a stream done already
                            continue
                        bodies.append(body)
                        for sid in frame.get("ids", [frame.get("id")]):
                            per[sid].append(frame["item"])
                    # each stream: both shared items, then its own, in order
                    assert per == {s: [first, second, {"own": s}] for s in ids}
                    # the first went out as one shared frame for all four (the ids in the
                    # order the stream tasks ran, trio's, not fixed), the JSON once
                    order = wire.decode_body(bodies[0])["ids"]
                    assert sorted(order) == ids
                    listed = b",".join(b"%d" % i for i in order)
                    assert bodies[0] == b'{"ids":[' + listed + b'],"item":' + \
                        wire.compact(first) + b"}"
                    # 12 item deliveries, far fewer frames; a lone stream's is a plain one
                    assert len(bodies) <= 8
                    assert all(b.startswith(b'{"ids":[') == (b'"own"' not in b)
                               for b in bodies if b'"cursor":"2"' not in b)
                    # 16 frames (12 items, 4 ends) and far fewer writes than that
                    assert conns[0].writes - writes <= 8
                n.cancel_scope.cancel()
    finally:
        service._Connection.__init__ = real  # type: ignore[method-assign]


async def test_the_socket_client_routes_a_shared_frame_to_every_stream(
        sock_path: Path) -> None:
    """SocketClient: each subscription named by a shared item frame gets the item once,
    in order with its own items, all of them the same decoded object."""
    from aotx_trio.service.client import SocketClient

    first = Pushed({"cursor": "1", "receipt": {"status": "admitted"}})
    handler = Broadcast([first])
    with trio.fail_after(20):
        async with trio.open_nursery() as n:
            await n.start(service.serve_socket, sock_path, handler)
            client = SocketClient(str(sock_path))
            await n.start(client.run)
            got: dict[int, list[Any]] = {}

            async def follow(k: int, task_status: trio.TaskStatus[None]) -> None:
                async with client.subscribe("watch", {"n": k}) as sub:
                    assert sub.opened == {"n": k}
                    task_status.started()
                    got[k] = [await sub.__anext__(), await sub.__anext__()]

            async with trio.open_nursery() as subs:
                for k in range(6):
                    await subs.start(follow, k)
                handler.go.set()
            assert sorted(got) == list(range(6))
            values = [v[0] for v in got.values()]
            assert all(v == first for v in values)
            assert all(v is values[0] for v in values)     # decoded once, shared
            assert [v[1] for v in got.values()] == [{"own": k} for k in got]
            n.cancel_scope.cancel()
