"""The device client: one interface, two transports (DESIGN.md, "client").

The gateway reaches the runtime's device only through :class:`DeviceClient`.
Every method is one service call ``call(method, params)`` whose params and
result are plain JSON values (docs/formats/socket.md lists the methods):

* :class:`InProcessClient` calls a :class:`Handler` (the runtime's
  :class:`aotx_trio.runtime.service.ServiceHandler`) in the same trio run
  (the embedded ``aotx serve``);
* :class:`SocketClient` sends the same calls as frames over the runtime's
  Unix service socket (split deployment); its :meth:`SocketClient.run` is a
  long-lived task that the gateway app's nursery supervises.

Errors come back as the same :class:`aotx_trio.errors.AotxError` classes on
both transports.  This module imports nothing from ``runtime`` or ``gateway``.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Sequence
from typing import Any, Protocol

import trio

from aotx_trio import errors, wire

log = logging.getLogger("aotx.client")


class RuntimeUnavailable(errors.Refusal):
    """The runtime's service socket is not connected (the gateway answers 503)."""

    default_code = "runtime_unavailable"


class SavePending(errors.Refusal):
    """The device admitted the operation but the journal did not save it in time
    (disk trouble); an exact retry answers once it is saved (the gateway answers 503)."""

    default_code = "save_pending"


wire.register_error_kind(RuntimeUnavailable)
wire.register_error_kind(SavePending)


class Handler(Protocol):
    async def call(self, method: str, params: dict[str, Any]) -> Any: ...


class DeviceClient:
    """Typed calls over :meth:`call`; subclasses supply the transport."""

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

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


class SocketClient(DeviceClient):
    """Multiplexes concurrent calls over one Unix-socket connection.

    :meth:`run` connects (retrying until ``connect_timeout``), calls
    ``task_status.started()``, then reads responses and routes them to the
    waiting callers by request id.  When the connection drops, every waiting
    call fails with :class:`RuntimeUnavailable` and ``run`` reconnects with
    backoff; calls made while disconnected fail at once.
    """

    def __init__(self, path: str, *, connect_timeout: float = 30.0) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[trio.Event, list[Any]]] = {}

    async def _connect(self, deadline: float) -> trio.SocketStream:
        delay = 0.05
        while True:
            try:
                return await trio.open_unix_socket(self.path)
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

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._stream = await self._connect(trio.current_time() + self.connect_timeout)
        task_status.started()
        try:
            while True:
                stream = self._stream
                try:
                    await self._read_loop(stream)
                    reason = "the runtime closed the service socket"
                except (OSError, trio.BrokenResourceError, wire.FrameError) as exc:
                    reason = f"service socket failed: {exc}"
                log.warning("%s; reconnecting", reason)
                self._stream = None
                self._fail_waiting(reason)
                with trio.move_on_after(0):
                    await stream.aclose()
                self._stream = await self._connect(math.inf)
        finally:
            self._fail_waiting("the device client stopped")
            if self._stream is not None:
                with trio.CancelScope(shield=True):
                    await self._stream.aclose()
                self._stream = None

    async def _read_loop(self, stream: trio.SocketStream) -> None:
        reader = wire.FrameReader(stream)
        while True:
            frame = await reader.read()
            if frame is None:
                return
            entry = self._waiting.pop(frame.get("id", -1), None)
            if entry is None:
                log.warning("response for unknown request id %r", frame.get("id"))
                continue
            entry[1].append(frame)
            entry[0].set()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        stream = self._stream
        if stream is None:
            raise RuntimeUnavailable(f"the service socket {self.path} is not connected",
                                     path=self.path)
        req_id = next(self._ids)
        event = trio.Event()
        box: list[Any] = []
        self._waiting[req_id] = (event, box)
        try:
            frame = wire.encode_frame(wire.request(req_id, method, params))
            async with self._send_lock:
                # A frame is never left half-written: cancellation waits for the send.
                with trio.CancelScope(shield=True):
                    await stream.send_all(frame)
            await event.wait()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise RuntimeUnavailable(f"service socket send failed: {exc}",
                                     path=self.path) from exc
        finally:
            self._waiting.pop(req_id, None)
        reply = box[0]
        if isinstance(reply, errors.AotxError):
            raise reply
        if reply.get("ok"):
            return reply.get("result")
        raise wire.error_from_frame(reply)
