"""The runtime's Unix service socket (<journal>/service.sock; docs/formats/socket.md).

:func:`serve_socket` serves any :class:`Handler` over the socket.  Each
connection is read frame by frame; each call runs in its own task (at most
``MAX_IN_FLIGHT`` per connection) and each stream in its own task (at most
``MAX_STREAMS``); every frame is written whole, one writer at a time per
connection, which writes every frame queued by then in one ``send_all``
(:meth:`_Connection._flush`), so answers and pushed items of different ids
interleave in any order.  The frames themselves (their bytes, the events they
carry, one shared item frame ``{"ids":[...],"item":...}`` for one pushed item
queued for several streams next to each other) are the sans-IO
:class:`aotx_trio.service.protocol.Connection`'s; this module only moves bytes
between it and the socket and runs the handler's calls and streams.  A cancel
frame ends its stream with ``end: "cancelled"``; when the runtime stops, open
streams end with ``end: "shutdown"``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket as _socket
import stat
from pathlib import Path

import trio

from aotx_trio import errors
from aotx_trio.service import protocol, wire
from aotx_trio.service.protocol import MAX_STREAMS, End, Event, Handler, Item, Request, Response

log = logging.getLogger("aotx.service")

MAX_IN_FLIGHT = 256
SOCKET_NAME = "service.sock"


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


class _Connection:
    """The trio side of one connection: moves bytes between the socket and its
    :class:`~aotx_trio.service.protocol.Connection` and runs the requests' tasks."""

    def __init__(self, stream: trio.abc.Stream, handler: Handler) -> None:
        self.stream = stream
        self.handler = handler
        self.proto = protocol.Connection(protocol.SERVER)
        self._writing = False             # a task is in send_all
        self._wrote = trio.Event()        # set (and replaced) when a write ends
        self.slots = trio.Semaphore(MAX_IN_FLIGHT)
        self.streams: dict[int, trio.CancelScope] = {}
        self._queued = 0                  # sends queued so far
        self._taken = 0                   # sends a writer took so far (all queued up to it)
        self._broken: BaseException | None = None
        self.writes = 0                   # send_all calls (tests, benchmarks)

    async def send(self, event: Event) -> None:
        """Write the frame of ``event`` whole, in order with the frames queued before it
        (see :meth:`_flush`).  An item pushed to many streams (:class:`Pushed`) joins
        the frame queued right before it when that is the same item's: one shared item
        frame for all of their streams (:meth:`protocol.Connection.send`)."""
        if self._broken is not None:
            raise trio.BrokenResourceError("the connection failed") from self._broken
        self.proto.send(event)
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
                    self._taken = self._queued
                    await self.stream.send_all(self.proto.data_to_send())
                self.writes += 1
            except BaseException as exc:
                self._broken = exc
                raise
            finally:
                self._writing = False
                wrote, self._wrote = self._wrote, trio.Event()
                wrote.set()

    async def _reply(self, event: Event) -> None:
        """:meth:`send`; a connection that failed or closed meanwhile is let be."""
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await self.send(event)

    async def call(self, req: Request) -> None:
        try:
            answer = Response(req.id, await self.handler.call(req.method, req.params))
        except errors.AotxError as exc:
            answer = Response(req.id, error=exc)
        except Exception as exc:
            answer = Response(req.id, error=_internal(exc, req.method))
        finally:
            self.slots.release()
        await self._reply(answer)

    async def run_stream(self, req: Request) -> None:
        sid = req.id
        try:
            if sid in self.streams:
                raise errors.FrameError(f"stream id {sid} is already open")
            opened, items = await self.handler.open_stream(req.method, req.params)
        except errors.AotxError as exc:
            await self.send(Response(sid, error=exc))
            return
        except Exception as exc:
            await self.send(Response(sid, error=_internal(exc, req.method)))
            return
        scope = self.streams[sid] = trio.CancelScope()
        end = End(sid, wire.END_COMPLETE)
        try:
            await self.send(Response(sid, opened, stream=True))
            with scope:
                try:
                    async for value in items:
                        await self.send(Item((sid,), value))
                except errors.AotxError as exc:
                    end = End(sid, wire.END_ERROR, exc)
                except Exception as exc:
                    end = End(sid, wire.END_ERROR, _internal(exc, req.method))
            if scope.cancelled_caught:
                end = End(sid, wire.END_CANCELLED)
        except trio.Cancelled:
            end = End(sid, wire.END_SHUTDOWN)
            raise
        finally:
            self.streams.pop(sid, None)
            aclose = getattr(items, "aclose", None)
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                if aclose is not None:
                    await aclose()
                await self._reply(end)

    async def _next_event(self) -> protocol.Event | protocol.Signal:
        while (event := self.proto.next_event()) is protocol.Signal.NEED_DATA:
            self.proto.receive_data(await self.stream.receive_some(65536))
        return event

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                try:
                    event = await self._next_event()
                except errors.FrameError as exc:
                    with trio.move_on_after(1):
                        await self.send(Response(0, error=exc))
                    break
                if event is protocol.Signal.CLOSED:
                    break
                if isinstance(event, protocol.Cancel):
                    scope = self.streams.get(event.id)
                    if scope is not None:
                        scope.cancel()
                elif isinstance(event, protocol.BadRequest):
                    await self.send(Response(event.id, error=event.error))
                elif not isinstance(event, Request):
                    pass             # a client never sends the runtime's frames: ignored
                elif event.stream:
                    if len(self.streams) >= MAX_STREAMS:
                        await self.send(Response(event.id, error=errors.OverCapacity(
                            f"at most {MAX_STREAMS} open streams per connection",
                            code="too_many_streams")))
                        continue
                    nursery.start_soon(self.run_stream, event)
                else:
                    await self.slots.acquire()
                    nursery.start_soon(self.call, event)
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
