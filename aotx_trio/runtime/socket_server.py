"""The runtime's Unix service socket (<journal>/service.sock; docs/formats/socket.md).

:func:`serve_socket` serves any :class:`Handler` over the socket.  Each
connection is read frame by frame; each call runs in its own task (at most
``MAX_IN_FLIGHT`` per connection) and each stream in its own task (at most
``MAX_STREAMS``); every frame is written whole, one writer at a time per
connection, which writes every frame queued by then in one ``send_all``
(:meth:`_Connection._flush`), so answers and pushed items of different ids
interleave in any order.  One pushed item (:class:`Pushed`) queued for several
streams next to each other goes out as one shared item frame
(``{"ids":[...],"item":...}``, docs/formats/socket.md).  A
cancel frame ends its stream with ``end: "cancelled"``; when the runtime stops,
open streams end with ``end: "shutdown"``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket as _socket
import stat
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

import trio

from aotx_trio import errors
from aotx_trio.service import wire
from aotx_trio.service.pushed import Pushed

log = logging.getLogger("aotx.service")

MAX_IN_FLIGHT = 256
MAX_STREAMS = 1024
SOCKET_NAME = "service.sock"


class Handler(Protocol):
    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    async def open_stream(self, method: str, params: dict[str, Any],
                          ) -> tuple[Any, AsyncIterator[Any]]: ...


async def _listen_unix(path: Path) -> trio.SocketListener:
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise errors.ConfigError(f"{path} exists and is not a socket", path=str(path))
        try:
            probe = await trio.open_unix_socket(str(path))
        except OSError:
            path.unlink()
        else:
            await probe.aclose()
            raise errors.ConfigError(f"another runtime is listening on {path}", path=str(path))
    sock = trio.socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    old = os.umask(0o177)  # the socket file is rw for its owner only
    try:
        await sock.bind(str(path))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.ENAMETOOLONG or "too long" in str(exc):
            raise errors.ConfigError(f"socket path too long ({len(str(path))} bytes): {path}",
                                     path=str(path)) from exc
        raise
    finally:
        os.umask(old)
    sock.listen(128)
    return trio.SocketListener(sock)


def _internal(exc: Exception, what: object) -> errors.AotxError:
    """A bug: logged here, reported to the caller without details."""
    log.error("service %s failed", what, exc_info=exc)
    return errors.AotxError(f"internal error: {type(exc).__name__}", code="internal_error")


def _request_parts(req: dict[str, Any]) -> tuple[int, str, dict[str, Any]]:
    req_id, method, params = req.get("id"), req.get("method"), req.get("params", {})
    if not isinstance(req_id, int) or not isinstance(method, str) \
            or not isinstance(params, dict):
        raise errors.FrameError("request needs an integer id, a string method and an "
                                "object params")
    return req_id, method, params


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


#: room left in a frame for a shared item frame's ids (MAX_STREAMS ids of <= 19 digits)
_IDS_ROOM = MAX_STREAMS * 20 + 64


class _Shared:
    """One pushed item queued for several streams of a connection: written as one
    shared item frame ``{"ids":[...],"item":...}`` (docs/formats/socket.md)."""

    __slots__ = ("ids", "item")

    def __init__(self, sid: int, item: Pushed) -> None:
        self.item = item
        self.ids = [sid]

    def frame(self) -> bytes:
        if len(self.ids) == 1:
            return item_frame(self.ids[0], self.item)
        body = b'{"ids":[%s],"item":%s}' % (b",".join(b"%d" % i for i in self.ids),
                                             self.item.encoded("wire", _compact))
        return struct.pack("<I", len(body)) + body


def item_frame(sid: int, value: Any) -> bytes:
    """The item frame of ``value`` on stream ``sid``: the same bytes as
    ``wire.encode_frame(wire.item(sid, value))``, but an item pushed to many streams
    (:class:`aotx_trio.service.pushed.Pushed`) is JSON-encoded once for all of them."""
    if not isinstance(value, Pushed):
        return wire.encode_frame(wire.item(sid, value))
    body = b'{"id":%d,"item":%s}' % (sid, value.encoded("wire", _compact))
    if len(body) > wire.MAX_FRAME:
        raise errors.FrameError(f"frame of {len(body)} bytes is over the limit of "
                                f"{wire.MAX_FRAME}", length=len(body))
    return struct.pack("<I", len(body)) + body


class _Connection:
    def __init__(self, stream: trio.abc.Stream, handler: Handler) -> None:
        self.stream = stream
        self.handler = handler
        self._writing = False             # a task is in send_all
        self._wrote = trio.Event()        # set (and replaced) when a write ends
        self.slots = trio.Semaphore(MAX_IN_FLIGHT)
        self.streams: dict[int, trio.CancelScope] = {}
        self._pending: list[bytes | _Shared] = []   # frames queued, not written yet
        self._queued = 0                  # frames queued so far
        self._taken = 0                   # frames a writer took so far (all queued up to it)
        self._broken: BaseException | None = None
        self.writes = 0                   # send_all calls (tests, benchmarks)

    async def reply(self, frame: dict[str, Any]) -> None:
        await self.send(wire.encode_frame(frame))

    async def send(self, data: bytes) -> None:
        """Write one whole frame, in order with the frames queued before it (see
        :meth:`_flush`)."""
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection failed") from self._broken
        self._pending.append(data)
        await self._flush()

    async def push(self, sid: int, value: Any) -> None:
        """Write item ``value`` of stream ``sid``.  An item pushed to many streams
        (:class:`Pushed`) that the stream right before in the queue also pushes joins
        that stream's frame: one shared item frame carries it to all of them (500
        streams of one event: one frame of their ids and the item's JSON once, not
        500 copies)."""
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection failed") from self._broken
        if not isinstance(value, Pushed):
            self._pending.append(item_frame(sid, value))
            return await self._flush()
        last = self._pending[-1] if self._pending else None
        if isinstance(last, _Shared) and last.item is value:
            last.ids.append(sid)
        else:
            size = len(value.encoded("wire", _compact))
            if size + _IDS_ROOM > wire.MAX_FRAME:     # too big to share: its own frame
                self._pending.append(item_frame(sid, value))
            else:
                self._pending.append(_Shared(sid, value))
        await self._flush()

    async def _flush(self) -> None:
        """Return once the frame just queued is taken by a write (written whole, in
        queue order, or the connection fails).  One task at a time writes: it first
        lets the tasks woken with it (a fanout pass pushing one event to 500 streams
        of this connection) queue their frames, then writes every frame queued by
        then in one ``send_all``; a task whose frame it took returns at once, one
        that queued during the write waits for it to end (all woken together, no
        lock handed from task to task) and writes the next batch.  A client that
        does not read blocks the writer and so every sender of its connection."""
        self._queued += 1
        mine = self._queued
        while self._taken < mine:
            if self._writing:
                await self._wrote.wait()
                if self._broken is not None:
                    raise trio.BrokenResourceError("the connection failed") from self._broken
                continue
            self._writing = True
            try:
                with trio.CancelScope(shield=True):
                    # the other tasks woken with this one (a fanout pass) queue theirs first
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    batch, self._pending = self._pending, []
                    self._taken = self._queued
                    data = b"".join([f.frame() if isinstance(f, _Shared) else f
                                     for f in batch])
                    await self.stream.send_all(data)
                self.writes += 1
            except BaseException as exc:
                self._broken = exc
                raise
            finally:
                self._writing = False
                wrote, self._wrote = self._wrote, trio.Event()
                wrote.set()

    async def call(self, req: dict[str, Any]) -> None:
        req_id = req.get("id")
        rid = req_id if isinstance(req_id, int) else 0
        try:
            req_id, method, params = _request_parts(req)
            frame = wire.success(req_id, await self.handler.call(method, params))
        except errors.AotxError as exc:
            frame = wire.failure(rid, exc)
        except Exception as exc:
            frame = wire.failure(rid, _internal(exc, req.get("method")))
        finally:
            self.slots.release()
        try:
            await self.reply(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def run_stream(self, req: dict[str, Any]) -> None:
        rid = req["id"] if isinstance(req.get("id"), int) else 0
        try:
            sid, method, params = _request_parts(req)
            if sid in self.streams:
                raise errors.FrameError(f"stream id {sid} is already open")
            opened, items = await self.handler.open_stream(method, params)
        except errors.AotxError as exc:
            await self.reply(wire.failure(rid, exc))
            return
        except Exception as exc:
            await self.reply(wire.failure(rid, _internal(exc, req.get("method"))))
            return
        scope = self.streams[sid] = trio.CancelScope()
        end = wire.end(sid, wire.END_COMPLETE)
        try:
            await self.reply(wire.success(sid, opened, stream=True))
            with scope:
                try:
                    async for value in items:
                        await self.push(sid, value)
                except errors.AotxError as exc:
                    end = wire.end(sid, wire.END_ERROR, exc)
                except Exception as exc:
                    end = wire.end(sid, wire.END_ERROR, _internal(exc, method))
            if scope.cancelled_caught:
                end = wire.end(sid, wire.END_CANCELLED)
        except trio.Cancelled:
            end = wire.end(sid, wire.END_SHUTDOWN)
            raise
        finally:
            self.streams.pop(sid, None)
            aclose = getattr(items, "aclose", None)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                if aclose is not None:
                    await aclose()
                try:
                    await self.reply(end)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass

    async def serve(self) -> None:
        reader = wire.FrameReader(self.stream)
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    req = await reader.read()
                except errors.FrameError as exc:
                    with trio.move_on_after(1):
                        await self.reply(wire.failure(0, exc))
                    break
                if req is None:
                    break
                if req.get("cancel") is True:
                    scope = self.streams.get(req.get("id", -1))
                    if scope is not None:
                        scope.cancel()
                elif req.get("stream") is True:
                    if len(self.streams) >= MAX_STREAMS:
                        await self.reply(wire.failure(
                            req["id"] if isinstance(req.get("id"), int) else 0,
                            errors.OverCapacity(f"at most {MAX_STREAMS} open streams per "
                                                "connection", code="too_many_streams")))
                        continue
                    nursery.start_soon(self.run_stream, req)
                else:
                    await self.slots.acquire()
                    nursery.start_soon(self.call, req)
            nursery.cancel_scope.cancel()   # the client left: end its streams


async def _serve_connection(stream: trio.abc.Stream, handler: Handler) -> None:
    try:
        await _Connection(stream, handler).serve()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await stream.aclose()


async def serve_socket(path: str | os.PathLike[str], handler: Handler, *,
                       task_status: trio.TaskStatus[Path] = trio.TASK_STATUS_IGNORED) -> None:
    """Listen on ``path`` and answer with ``handler`` until cancelled; calls
    ``task_status.started(path)`` once the socket accepts connections and removes
    the socket file on the way out."""
    p = Path(path)
    listener = await _listen_unix(p)
    st = p.lstat()
    ours = (st.st_dev, st.st_ino, st.st_ctime_ns)
    try:
        async with trio.open_nursery() as nursery:
            async def conn(stream: trio.SocketStream) -> None:
                try:
                    await _serve_connection(stream, handler)
                except Exception:  # one connection's failure never stops the service
                    log.exception("service connection failed")

            await nursery.start(trio.serve_listeners, conn, [listener])
            task_status.started(p)
    finally:
        with trio.move_on_after(1) as scope:
            scope.shield = True
            await listener.aclose()
        try:  # only our own socket file: a successor may already listen at this path
            st = p.lstat()
            if (st.st_dev, st.st_ino, st.st_ctime_ns) == ours:
                p.unlink()
        except FileNotFoundError:
            pass
