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

from aotx_trio import errors, wire
from aotx_trio.pushed import Pushed
from aotx_trio.runtime import socket_server as service


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


def test_a_pushed_item_frame_is_the_plain_frame_encoded_once() -> None:
    item = Pushed({"cursor": "7", "text": "naïve ☃", "data": None, "n": [1, 2.5]})
    for sid in (1, 12345678901):
        assert service.item_frame(sid, item) == wire.encode_frame(wire.item(sid, dict(item)))
    assert service.item_frame(3, {"plain": True}) == \
        wire.encode_frame(wire.item(3, {"plain": True}))
    calls = []
    item.encoded("probe", lambda v: calls.append(v) or b"x")
    item.encoded("probe", lambda v: calls.append(v) or b"y")
    assert calls == [item] and item.encoded("probe", bytes) == b"x"
