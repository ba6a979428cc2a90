"""The device client: one interface, two transports (docs/decisions.md, "The layers").

The gateway reaches the runtime's device only through :class:`DeviceClient`.
Every method is one service call ``call(method, params)`` whose params and
result are plain JSON values (docs/formats/socket.md lists the methods):

* :class:`InProcessClient` calls a :class:`Handler` (the runtime's
  :class:`aotx_trio.runtime.handler.ServiceHandler`) in the same trio run
  (the embedded ``aotx serve``);
* :class:`SocketClient` sends the same calls as frames over the runtime's
  Unix service socket (split deployment); its :meth:`SocketClient.run` is a
  long-lived task that the gateway app's nursery supervises.

Streams (:meth:`DeviceClient.subscribe`) push items from the runtime until
it ends them or the subscriber leaves: in-process a pump task feeds a
bounded channel, over the socket the push frames of docs/formats/socket.md
do.  Either way a subscriber that falls more than ``buffer`` items behind is
dropped: its iteration ends with ``end_reason == "slow_consumer"``.

Errors come back as the same :class:`aotx_trio.errors.AotxError` classes on
both transports.  This module imports nothing from ``runtime`` or ``gateway``.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any, NoReturn

import trio

from aotx_trio import errors
from aotx_trio.errors import RuntimeUnavailable
from aotx_trio.service import protocol, wire
from aotx_trio.service.protocol import Cancel, End, Event, Handler, Item, Request, Response
from aotx_trio.service.wire import SLOW_CONSUMER

log = logging.getLogger("aotx.client")


DEFAULT_BUFFER = 64


class Subscription:
    """One open stream: ``opened`` is the open result; iterate for the items.

    Iteration ends when the stream ends; ``end_reason`` then says why
    (``complete``, ``cancelled``, ``shutdown``, ``slow_consumer``).  A stream that
    ends in an error raises it from the iteration (``RuntimeUnavailable`` when the
    transport is lost)."""

    def __init__(self, opened: Any, items: trio.MemoryReceiveChannel[Any]) -> None:
        self.opened = opened
        self._items = items
        self.end_reason: str | None = None
        self.error: errors.AotxError | None = None
        self.delivered = 0

    def _finish(self, reason: str, error: errors.AotxError | None = None) -> None:
        if self.end_reason is None:
            self.end_reason = reason
            self.error = error

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Any:
        try:
            value = await self._items.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended()
        self.delivered += 1
        return value

    def next_nowait(self) -> Any:
        """The next item if one is buffered already (``trio.WouldBlock`` if not); the
        end as iteration reports it (StopAsyncIteration, or the stream's error)."""
        try:
            value = self._items.receive_nowait()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended()
        self.delivered += 1
        return value

    def _ended(self) -> NoReturn:
        if self.error is not None:
            raise self.error from None
        raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop reading: the items not read yet are dropped, the iteration ends."""
        self._items.close()


class DeviceClient:
    """Typed calls over :meth:`call` and :meth:`subscribe`; subclasses supply the
    transport."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    def subscribe(self, method: str, params: dict[str, Any], *,
                  buffer: int = DEFAULT_BUFFER) -> contextlib.AbstractAsyncContextManager[
                      Subscription]:
        """``async with client.subscribe(m, p) as sub: async for item in sub: ...``;
        leaving the block cancels the stream."""
        raise NotImplementedError

    def watch_saves(self, *, limit: int | None = None,
                    buffer: int = DEFAULT_BUFFER,
                    ) -> contextlib.AbstractAsyncContextManager[Subscription]:
        """The journal's save state, pushed each time more records are saved."""
        params: dict[str, Any] = {} if limit is None else {"limit": limit}
        return self.subscribe("save.watch", params, buffer=buffer)

    # -- reads that need no principal -------------------------------------------------
    async def capabilities(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("capabilities", {})
        return result

    async def save_state(self) -> dict[str, Any]:
        result: dict[str, Any] = await self.call("save_state", {})
        return result

    # -- principal calls: every one carries the gateway's current actions --------------
    async def _p(self, method: str, principal: str, actions: Sequence[str],
                 **params: Any) -> dict[str, Any]:
        params["principal"] = principal
        params["actions"] = list(actions)
        result: dict[str, Any] = await self.call(method, params)
        return result

    async def participant(self, principal: str, actions: Sequence[str]) -> dict[str, Any]:
        return await self._p("participant.get", principal, actions)

    async def submit(self, principal: str, actions: Sequence[str], kind: str,
                     body: dict[str, Any]) -> dict[str, Any]:
        """Admit one mutation; returns ``{"receipt": {...}, "created": bool}`` once the
        admission is saved (created) or the existing receipt (exact retry)."""
        return await self._p("mutation.submit", principal, actions, kind=kind, body=body)

    async def submit_json(self, principal: str, actions: Sequence[str], kind: str,
                          body: dict[str, Any]) -> tuple[dict[str, Any] | bytes, bool, str]:
        """:meth:`submit` as (the receipt, created, operation id); the receipt as a dict
        here, already as the gateway's JSON bytes where the transport can give them
        (:class:`InProcessClient`)."""
        out = await self.submit(principal, actions, kind, body)
        receipt: dict[str, Any] = out["receipt"]
        return receipt, bool(out["created"]), str(receipt["operation"])

    async def space(self, principal: str, actions: Sequence[str], space: str) -> dict[str, Any]:
        return await self._p("space.get", principal, actions, space=space)

    async def spaces(self, principal: str, actions: Sequence[str], cursor: str | None,
                     limit: int) -> dict[str, Any]:
        return await self._p("space.list", principal, actions, cursor=cursor, limit=limit)

    async def members(self, principal: str, actions: Sequence[str], space: str,
                      cursor: str | None, limit: int) -> dict[str, Any]:
        return await self._p("member.list", principal, actions, space=space, cursor=cursor,
                             limit=limit)

    async def conversations(self, principal: str, actions: Sequence[str], space: str,
                            cursor: str | None, limit: int) -> dict[str, Any]:
        return await self._p("conversation.list", principal, actions, space=space,
                             cursor=cursor, limit=limit)

    async def conversation(self, principal: str, actions: Sequence[str],
                           conversation: str) -> dict[str, Any]:
        return await self._p("conversation.get", principal, actions, conversation=conversation)

    async def conversation_events(self, principal: str, actions: Sequence[str],
                                  conversation: str, cursor: str | None,
                                  limit: int) -> dict[str, Any]:
        return await self._p("conversation.events", principal, actions,
                             conversation=conversation, cursor=cursor, limit=limit)

    async def media_put(self, principal: str, actions: Sequence[str], content_type: str,
                        data: bytes) -> dict[str, Any]:
        """Store media bytes as the principal's (answers once durable):
        ``{"media": {"type", "sha256", "content_type", "bytes"}, "created"}``."""
        return await self._p("media.put", principal, actions, content_type=content_type,
                             data=base64.b64encode(data).decode("ascii"))

    async def memory_list(self, principal: str, actions: Sequence[str], space: str,
                          cursor: str | None, limit: int) -> dict[str, Any]:
        return await self._p("memory.list", principal, actions, space=space, cursor=cursor,
                             limit=limit)

    async def memory_get(self, principal: str, actions: Sequence[str], space: str, obj: str,
                         offset: int) -> dict[str, Any]:
        return await self._p("memory.get", principal, actions, space=space, object=obj,
                             offset=offset)

    async def operation(self, principal: str, actions: Sequence[str],
                        operation: str) -> dict[str, Any]:
        return await self._p("operation.get", principal, actions, operation=operation)

    async def operation_result(self, principal: str, actions: Sequence[str], operation: str,
                               offset: int) -> dict[str, Any]:
        return await self._p("operation.result", principal, actions, operation=operation,
                             offset=offset)


class InProcessClient(DeviceClient):
    """Calls the handler directly (embedded deployment)."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        return await self._handler.call(method, params)

    async def submit_json(self, principal: str, actions: Sequence[str], kind: str,
                          body: dict[str, Any]) -> tuple[dict[str, Any] | bytes, bool, str]:
        fn = getattr(self._handler, "submit_json", None)
        if fn is None:
            return await super().submit_json(principal, actions, kind, body)
        data, created, operation = await fn({"principal": principal, "actions": list(actions),
                                             "kind": kind, "body": body})
        return data, created, operation

    @contextlib.asynccontextmanager
    async def subscribe(self, method: str, params: dict[str, Any], *,
                        buffer: int = DEFAULT_BUFFER) -> AsyncIterator[Subscription]:
        opened, items = await self._handler.open_stream(method, params)
        send, receive = trio.open_memory_channel[Any](buffer)
        sub = Subscription(opened, receive)

        async def pump() -> None:
            async with send:
                try:
                    async for value in items:
                        try:
                            send.send_nowait(value)
                        except trio.WouldBlock:
                            sub._finish(SLOW_CONSUMER)
                            return
                    sub._finish(wire.END_COMPLETE)
                except errors.AotxError as exc:
                    if exc.code == SLOW_CONSUMER:   # the runtime's fanout dropped it
                        sub._finish(SLOW_CONSUMER)
                    else:
                        sub._finish(wire.END_ERROR, exc)
                finally:
                    aclose = getattr(items, "aclose", None)
                    if aclose is not None:
                        with trio.CancelScope(shield=True):
                            await aclose()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            try:
                yield sub
            finally:
                sub._finish(wire.END_CANCELLED)
                nursery.cancel_scope.cancel()


class _Stream:
    """The client's side of one socket stream (see :meth:`SocketClient.subscribe`)."""

    def __init__(self, buffer: int) -> None:
        self.opened = trio.Event()
        self.open_frame: Response | errors.AotxError | None = None
        self.send, receive = trio.open_memory_channel[Any](buffer)
        self.sub = Subscription(None, receive)
        self.live = True    # the runtime has not ended it yet
        self.sid = 0
        self.cancel_sent = False

    def finish(self, reason: str, error: errors.AotxError | None = None) -> None:
        self.live = False
        self.sub._finish(reason, error)
        self.send.close()


class SocketClient(DeviceClient):
    """Multiplexes concurrent calls and streams over one Unix-socket connection.

    :meth:`run` connects (retrying until ``connect_timeout``), calls
    ``task_status.started()``, then reads frames and routes them by id: answers
    to the waiting callers, pushed items to their stream's bounded channel (a
    stream whose channel is full is dropped as a slow consumer and cancelled).
    When the connection drops, every waiting call and open stream fails with
    :class:`RuntimeUnavailable` and ``run`` reconnects with backoff; calls made
    while disconnected fail at once.  The frames are a sans-IO
    :class:`aotx_trio.service.protocol.Connection`'s (one per connection): this
    class moves bytes between it and the socket and routes its events.
    """

    def __init__(self, path: str, *, connect_timeout: float = 30.0) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self._stream: trio.SocketStream | None = None
        self._proto = protocol.Connection(protocol.CLIENT)   # the connection's, each time
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[Response | End | errors.AotxError]]] = {}
        self._streams: dict[int, _Stream] = {}
        # streams dropped as slow consumers, to cancel at the runtime now (run())
        self._dropped, self._to_cancel = trio.open_memory_channel[int](math.inf)

    async def _connect(self, deadline: float) -> None:
        delay = 0.05
        while True:
            try:
                self._stream = await trio.open_unix_socket(self.path)
                self._proto = protocol.Connection(protocol.CLIENT)
                return
            except OSError as exc:
                if trio.current_time() + delay > deadline:
                    raise RuntimeUnavailable(
                        f"cannot connect to the service socket {self.path}: {exc}",
                        path=self.path) from exc
                await trio.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _fail_waiting(self, reason: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for event, box in waiting.values():
            box.append(RuntimeUnavailable(reason, path=self.path))
            event.set()
        streams, self._streams = self._streams, {}
        for st in streams.values():
            exc = RuntimeUnavailable(reason, path=self.path)
            if st.open_frame is None:
                st.open_frame = exc
                st.opened.set()
            st.finish(wire.END_ERROR, exc)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._connect(trio.current_time() + self.connect_timeout)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._cancel_dropped)
            task_status.started()
            try:
                await self._serve()
            finally:
                nursery.cancel_scope.cancel()

    async def _cancel_dropped(self) -> None:
        """Cancel at once, at the runtime, each stream dropped as a slow consumer (its
        subscriber may not leave for a long time: a body blocked on its HTTP client),
        so the runtime stops following and pushing it."""
        async for sid in self._to_cancel:
            st, stream = self._streams.get(sid), self._stream
            if st is None or not st.live or stream is None:
                continue
            with contextlib.suppress(OSError, trio.BrokenResourceError,
                                     trio.ClosedResourceError):
                await self._send(stream, Cancel(sid))

    async def _serve(self) -> None:
        try:
            while True:
                stream = self._stream
                assert stream is not None
                try:
                    await self._read_loop(stream, self._proto)
                    reason = "the runtime closed the service socket"
                except (OSError, trio.BrokenResourceError, errors.FrameError) as exc:
                    reason = f"service socket failed: {exc}"
                log.warning("%s; reconnecting", reason)
                self._stream = None
                self._fail_waiting(reason)
                with trio.move_on_after(0):
                    await stream.aclose()
                await self._connect(math.inf)
        finally:
            self._fail_waiting("the device client stopped")
            if self._stream is not None:
                with trio.CancelScope(shield=True):
                    await self._stream.aclose()
                self._stream = None

    async def _read_loop(self, stream: trio.SocketStream, conn: protocol.Connection) -> None:
        while True:
            event = conn.next_event()
            if event is protocol.Signal.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif event is protocol.Signal.CLOSED:
                return
            elif isinstance(event, Item):
                self._route_item(event)
            elif isinstance(event, (Response, End)):
                self._route_answer(event)

    def _route_item(self, event: Item) -> None:
        """Hand the item to each of its streams (the one value to all of them)."""
        streams = [self._streams.get(i) for i in event.ids]
        if len(streams) == 1 and streams[0] is None:
            log.warning("frame for unknown request id %r", event.ids[0])
        for st in streams:        # a stream this side ended already: nothing to route
            if st is not None and st.open_frame is not None:
                self._item(st, event.value)

    def _route_answer(self, event: Response | End) -> None:
        st = self._streams.get(event.id)
        if st is not None:
            self._stream_event(st, event)
            return
        entry = self._waiting.pop(event.id, None)
        if entry is None:
            log.warning("frame for unknown request id %r", event.id)
            return
        entry[1].append(event)
        entry[0].set()

    def _item(self, st: _Stream, value: Any) -> None:
        if st.sub.end_reason is None:
            try:
                st.send.send_nowait(value)
            except trio.WouldBlock:
                st.sub._finish(SLOW_CONSUMER)
                st.send.close()
                if not st.cancel_sent:       # cancelled at the runtime now (run())
                    st.cancel_sent = True
                    self._dropped.send_nowait(st.sid)

    def _stream_event(self, st: _Stream, event: Response | End) -> None:
        """Route the open answer or the end of stream ``st``."""
        if st.open_frame is None:
            if isinstance(event, Response) and event.error is None:
                st.open_frame = event
                st.opened.set()
                return
            st.open_frame = event.error or errors.FrameError("the stream ended unopened")
            st.opened.set()
            self._streams.pop(st.sid, None)
            st.finish(wire.END_ERROR)
            return
        self._streams.pop(st.sid, None)
        if isinstance(event, End):
            reason, error = event.reason, event.error
        else:
            reason = wire.END_ERROR
            error = event.error or errors.FrameError("an answer frame on an open stream")
        if error is not None and error.code == SLOW_CONSUMER:   # the runtime dropped it
            reason, error = SLOW_CONSUMER, None
        st.finish(reason, error)

    async def _send(self, stream: trio.SocketStream, event: Event) -> None:
        self._proto.send(event)
        data = self._proto.data_to_send()
        async with self._send_lock:
            # A frame is never left half-written: cancellation waits for the send.
            with trio.CancelScope(shield=True):
                await stream.send_all(data)

    def _connected(self) -> trio.SocketStream:
        stream = self._stream
        if stream is None:
            raise RuntimeUnavailable(f"the service socket {self.path} is not connected",
                                     path=self.path)
        return stream

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        stream = self._connected()
        req_id = next(self._ids)
        event = trio.Event()
        box: list[Response | End | errors.AotxError] = []
        self._waiting[req_id] = (event, box)
        try:
            await self._send(stream, Request(req_id, method, params))
            await event.wait()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise RuntimeUnavailable(f"service socket send failed: {exc}",
                                     path=self.path) from exc
        finally:
            self._waiting.pop(req_id, None)
        reply = box[0]
        if isinstance(reply, errors.AotxError):
            raise reply
        if isinstance(reply, Response) and reply.error is None:
            return reply.result
        raise reply.error or errors.FrameError("failure frame without an error object")

    @contextlib.asynccontextmanager
    async def subscribe(self, method: str, params: dict[str, Any], *,
                        buffer: int = DEFAULT_BUFFER) -> AsyncIterator[Subscription]:
        stream = self._connected()
        sid = next(self._ids)
        st = _Stream(buffer)
        st.sid = sid
        self._streams[sid] = st
        try:
            try:
                await self._send(stream, Request(sid, method, params, stream=True))
                await st.opened.wait()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                raise RuntimeUnavailable(f"service socket send failed: {exc}",
                                         path=self.path) from exc
            opened = st.open_frame
            if isinstance(opened, errors.AotxError):
                raise opened
            assert opened is not None
            st.sub.opened = opened.result
            yield st.sub
        finally:
            st.sub._finish(wire.END_CANCELLED)
            if st.live and not st.cancel_sent and self._streams.get(sid) is st \
                    and self._stream is stream:
                # Tell the runtime; its end frame then removes the stream.
                with trio.move_on_after(1, shield=True):
                    try:
                        await self._send(stream, Cancel(sid))
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        self._streams.pop(sid, None)
