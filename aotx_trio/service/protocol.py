"""The service socket's protocol, sans I/O (docs/formats/socket.md).

A :class:`Connection` is one end of one service-socket connection, the runtime's
(``SERVER``) or the device client's (``CLIENT``), as h11's ``Connection`` is of
an HTTP one: it holds no socket.  Bytes in, events out::

    conn.receive_data(data)          # what the socket gave (b"" at its end)
    while (event := conn.next_event()) is not Signal.NEED_DATA: ...

and events in, bytes out::

    conn.send(Response(7, result))   # queues its frame
    await stream.send_all(conn.data_to_send())

The events are the frame kinds: a runtime reads :class:`Request`,
:class:`Cancel` and :class:`BadRequest`; a client reads :class:`Response`,
:class:`Item` and :class:`End`; both read ``Signal.CLOSED`` at a clean end of
the stream.  A framing error (length, UTF-8, JSON, not an object, the stream
ended inside a frame) raises :class:`~aotx_trio.errors.FrameError`; the
connection is then unusable.

Both ends share one item value among the streams it reaches: the runtime queues
one :class:`~aotx_trio.service.pushed.Pushed` item pushed to several streams
next to each other as one shared item frame (``{"ids":[...],"item":...}``,
encoded once), and the client decodes the same item bytes once (the last
``RECENT_ITEMS`` kept) and hands every stream the same value.

:class:`Handler` is what a runtime dispatches the requests to (the runtime's
``ServiceHandler``; the in-process client calls it directly).
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aotx_trio import errors
from aotx_trio.errors import FrameError
from aotx_trio.service import wire
from aotx_trio.service.pushed import Pushed

log = logging.getLogger("aotx.client")

Role = Literal["client", "server"]
CLIENT: Role = "client"
SERVER: Role = "server"

MAX_STREAMS = 1024     # streams open at once per connection (the runtime refuses more)
RECENT_ITEMS = 32      # item frames' values a client keeps to share among the streams
#: room left in a frame for a shared item frame's ids (MAX_STREAMS ids of <= 19 digits)
_IDS_ROOM = MAX_STREAMS * 20 + 64


class Handler(Protocol):
    """What the runtime's service handler offers a client (both transports)."""

    async def call(self, method: str, params: dict[str, Any]) -> Any: ...

    async def open_stream(self, method: str, params: dict[str, Any],
                          ) -> tuple[Any, AsyncIterator[Any]]:
        """Check and open a stream: (its open result, an async iterator of its items)."""
        ...


class Signal(enum.Enum):
    NEED_DATA = "need_data"    # no whole frame yet: receive_data more
    CLOSED = "closed"          # the peer ended the stream between frames


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Request:
    """Client to runtime: a call, or the opening of a stream (``stream``)."""
    id: int
    method: str
    params: dict[str, Any]
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Cancel:
    """Client to runtime: end stream ``id``."""
    id: int


@dataclass(frozen=True, slots=True)
class BadRequest:
    """A request frame without an integer id, a string method and an object params
    (``id`` 0 when it had no usable one): answered with a failure, not a framing error."""
    id: int
    error: FrameError
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Response:
    """Runtime to client: a call's answer or a stream's open answer (``stream``): its
    ``result``, or the ``error`` it failed with."""
    id: int
    result: Any = None
    error: errors.AotxError | None = None
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Item:
    """Runtime to client: one item of each stream of ``ids`` (one id, or the ids of a
    shared item frame), in that order."""
    ids: tuple[int, ...]
    value: Any


@dataclass(frozen=True, slots=True)
class End:
    """Runtime to client: stream ``id`` ended (``reason`` one of ``wire.END_REASONS``;
    ``error`` when it is ``error``)."""
    id: int
    reason: str
    error: errors.AotxError | None = None


Event = Request | Cancel | BadRequest | Response | Item | End


def encode(event: Event) -> bytes:
    """The frame of ``event`` (FrameError when it is over the size limit)."""
    if isinstance(event, Request):
        return wire.encode_frame(wire.request(event.id, event.method, event.params,
                                              stream=event.stream))
    if isinstance(event, Cancel):
        return wire.encode_frame(wire.cancel(event.id))
    if isinstance(event, Response):
        if event.error is not None:
            return wire.encode_frame(wire.failure(event.id, event.error))
        return wire.encode_frame(wire.success(event.id, event.result, stream=event.stream))
    if isinstance(event, Item):
        return wire.item_frame(event.ids, event.value)
    if isinstance(event, End):
        return wire.encode_frame(wire.end(event.id, event.reason, event.error))
    raise TypeError(f"a {type(event).__name__} is never sent")


class _Shared:
    """One pushed item queued for several streams, next to each other in the queue."""

    __slots__ = ("ids", "value")

    def __init__(self, sid: int, value: Pushed) -> None:
        self.value = value
        self.ids = [sid]


# --------------------------------------------------------------------------- connection


class Connection:
    """One end (``role``) of a service-socket connection: parses the bytes received into
    events and queues the frames of the events sent (see the module's doc)."""

    def __init__(self, role: Role, *, max_frame: int = wire.MAX_FRAME) -> None:
        self.role = role
        self._frames = wire.FrameBuffer(max_frame)
        self._out: list[bytes | _Shared] = []      # frames queued, not taken yet
        self._recent: dict[bytes, Any] = {}        # item bytes -> the value decoded

    # -- bytes in, events out ----------------------------------------------------------
    def receive_data(self, data: bytes | bytearray) -> None:
        """Bytes received from the peer; ``b""``: the peer ended the stream."""
        self._frames.feed(data)

    def next_event(self) -> Event | Signal:
        """The next event, ``Signal.NEED_DATA`` (no whole frame yet) or ``Signal.CLOSED``
        (the peer ended the stream); FrameError for a frame that breaks the framing."""
        while (body := self._frames.next_body()) is not None:
            event = self._request(body) if self.role == SERVER else self._answer(body)
            if event is not None:
                return event
        return Signal.CLOSED if self._frames.closed else Signal.NEED_DATA

    def _request(self, body: bytes) -> Event | None:
        obj = wire.decode_body(body)
        rid = obj.get("id")
        if obj.get("cancel") is True:
            return Cancel(rid) if isinstance(rid, int) else None   # unknown: ignored
        method, params = obj.get("method"), obj.get("params", {})
        stream = obj.get("stream") is True
        if not isinstance(rid, int) or not isinstance(method, str) \
                or not isinstance(params, dict):
            return BadRequest(rid if isinstance(rid, int) else 0, FrameError(
                "request needs an integer id, a string method and an object params"),
                stream)
        return Request(rid, method, params, stream)

    def _answer(self, body: bytes) -> Event | None:
        shared = self._item(body)
        if shared is not None:
            return shared
        obj = wire.decode_body(body)
        ids = obj.get("ids")
        if isinstance(ids, list) and "item" in obj:
            return Item(tuple(i for i in ids if isinstance(i, int)), obj["item"])
        fid = obj.get("id")
        if not isinstance(fid, int):
            log.warning("frame for unknown request id %r", fid)
            return None
        if "item" in obj:
            return Item((fid,), obj["item"])
        if "end" in obj:
            reason = str(obj["end"])
            return End(fid, reason,
                       wire.error_from_frame(obj) if reason == wire.END_ERROR else None)
        return Response(fid, obj.get("result"),
                        None if obj.get("ok") else wire.error_from_frame(obj),
                        obj.get("stream") is True)

    def _item(self, body: bytes) -> Item | None:
        """The item of ``body`` if it is an item frame laid out as the runtime writes it
        (``{"id":N,"item":VALUE}``, or the shared ``{"ids":[N,...],"item":VALUE}``);
        None: decode it as any frame.  The same item bytes decode once, to one value."""
        if not body.endswith(b"}"):
            return None
        if body.startswith(b'{"ids":['):
            cut = body.find(b'],"item":', 8)
            if cut < 0:
                return None
            try:
                ids = tuple(int(x) for x in body[8:cut].split(b","))
            except ValueError:
                return None
            raw = body[cut + 9:-1]
        elif body.startswith(b'{"id":'):
            cut = body.find(b',"item":', 6)
            digits = body[6:cut] if cut > 0 else b""
            if not digits.isdigit() or len(digits) > 18:
                return None
            ids = (int(digits),)
            raw = body[cut + 8:-1]
        else:
            return None
        value = self._recent.get(raw)
        if value is None:
            try:
                value = json.loads(raw)
            except (ValueError, RecursionError):   # not that layout: the general path
                return None
            if isinstance(value, dict):
                value = Pushed(value)
            if len(self._recent) >= RECENT_ITEMS:
                del self._recent[next(iter(self._recent))]
            self._recent[raw] = value
        return Item(ids, value)

    # -- events in, bytes out ----------------------------------------------------------
    def send(self, event: Event) -> None:
        """Queue the frame of ``event`` (FrameError, nothing queued, when it is over the
        size limit).  An item (:class:`Pushed`) of one stream whose frame queued last is
        the same pushed item's joins that frame: one shared item frame carries it to all
        of their streams (500 streams of one event: one frame of their ids and the
        item's JSON once, not 500 copies)."""
        value = event.value if isinstance(event, Item) and len(event.ids) == 1 else None
        if isinstance(value, Pushed):
            assert isinstance(event, Item)
            last = self._out[-1] if self._out else None
            if isinstance(last, _Shared) and last.value is value:
                last.ids.append(event.ids[0])
                return
            if len(value.encoded("wire", wire.compact)) + _IDS_ROOM <= wire.MAX_FRAME:
                self._out.append(_Shared(event.ids[0], value))
                return              # else too big to share: its own frame
        self._out.append(encode(event))

    def data_to_send(self) -> bytes:
        """Every frame queued so far, back to back, each whole (the queue is emptied)."""
        out, self._out = self._out, []
        return b"".join([f if isinstance(f, bytes) else wire.item_frame(f.ids, f.value)
                         for f in out])
