"""Service-socket framing: length-prefixed JSON frames (docs/formats/socket.md).

A frame is a 4-byte little-endian unsigned length ``N`` (1 <= N <= MAX_FRAME)
followed by ``N`` bytes of UTF-8 JSON holding one object.

Calls (one request, one answer):

* request  ``{"id": <int>, "method": "<name>", "params": {...}}``
* success  ``{"id": <int>, "ok": true, "result": <json>}``
* failure  ``{"id": <int>, "ok": false, "error": {"code", "message", ...},
  "kind": "<AotxError subclass name>"}``

Streams (one request, an open answer, pushed items, one end):

* open     ``{"id": <int>, "method": "<name>", "params": {...}, "stream": true}``
* opened   ``{"id": <int>, "ok": true, "result": <json>, "stream": true}`` (or a failure)
* item     ``{"id": <int>, "item": <json>}``, or the shared item frame
  ``{"ids": [<int>, ...], "item": <json>}`` (one item for several streams)
* end      ``{"id": <int>, "end": "<reason>"}``, with ``error`` and ``kind`` when the
  reason is ``error``
* cancel   ``{"id": <int>, "cancel": true}`` (client to runtime; answered by an end)

Binary values travel as base64 strings.  This module is a leaf: it knows
frames (their bytes: :class:`FrameBuffer` cuts a byte stream into frame bodies,
``encode_frame`` and :func:`item_frame` write them), their shapes and the error
round trip, nothing of the methods themselves; :mod:`aotx_trio.service.protocol`
turns frames into events and back for both ends of a connection.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.errors import FrameError
from aotx_trio.service.pushed import Pushed

MAX_FRAME = 4 * 1024 * 1024
_LEN = struct.Struct("<I")

#: End reasons of a stream.
END_COMPLETE = "complete"        # the method has nothing more to push
END_CANCELLED = "cancelled"      # the client sent a cancel frame
END_ERROR = "error"              # the method failed; error + kind say how
END_SHUTDOWN = "shutdown"        # the runtime is stopping
END_REASONS = (END_COMPLETE, END_CANCELLED, END_ERROR, END_SHUTDOWN)

#: The error code of a stream dropped for falling behind (the runtime's fanout, or a
#: client's own bounded buffer); the clients report it as ``end_reason``.
SLOW_CONSUMER = "slow_consumer"


def compact(value: Any) -> bytes:
    """``value`` as compact UTF-8 JSON (the encoding of every frame body)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def prefixed(body: bytes) -> bytes:
    """One frame of ``body``: its length prefix, then the body."""
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the limit of {MAX_FRAME}",
                         length=len(body))
    return _LEN.pack(len(body)) + body


def encode_frame(obj: dict[str, Any]) -> bytes:
    """One frame: length prefix + compact UTF-8 JSON."""
    return prefixed(compact(obj))


def item_frame(ids: Sequence[int], value: Any) -> bytes:
    """The item frame of ``value`` on the streams ``ids``: ``{"id":N,"item":...}`` for
    one stream (the bytes of ``encode_frame(item(N, value))``), the shared item frame
    ``{"ids":[N1,N2,...],"item":...}`` for several.  An item pushed to many streams
    (:class:`Pushed`) is JSON-encoded once for all of them."""
    if not isinstance(value, Pushed):
        if len(ids) == 1:
            return encode_frame(item(ids[0], value))
        raw = compact(value)
    else:
        raw = value.encoded("wire", compact)
    if len(ids) == 1:
        return prefixed(b'{"id":%d,"item":%s}' % (ids[0], raw))
    return prefixed(b'{"ids":[%s],"item":%s}' % (b",".join(b"%d" % i for i in ids), raw))


def decode_body(body: bytes) -> dict[str, Any]:
    """The JSON object of one frame body (the bytes after the length prefix)."""
    try:
        obj = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise FrameError(f"frame body is not UTF-8 at byte offset {exc.start}",
                         offset=exc.start) from exc
    except json.JSONDecodeError as exc:
        raise FrameError(f"frame body is not JSON at byte offset {exc.pos}: {exc.msg}",
                         offset=exc.pos) from exc
    except RecursionError as exc:
        raise FrameError("frame body is nested too deeply", offset=0) from exc
    if not isinstance(obj, dict):
        raise FrameError("frame body is not a JSON object", offset=0)
    return obj


class FrameBuffer:
    """Cuts a byte stream into frame bodies, sans I/O: :meth:`feed` the bytes as they
    come (``b""`` at the end of the stream), take the whole bodies with
    :meth:`next_body`."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame
        self.closed = False       # the peer ended the stream (fed b"")

    def feed(self, data: bytes | bytearray) -> None:
        if data:
            self._buf += data
        else:
            self.closed = True

    def next_body(self) -> bytes | None:
        """The next whole frame's body, or None: more bytes needed (or, ``closed``, a
        clean end of stream).  FrameError for a length outside 1..max_frame (as soon as
        the prefix is in) or a stream that ended inside a frame."""
        need = 4
        if len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf, 0)
            if n == 0 or n > self._max:
                raise FrameError(f"frame length {n} is outside 1..{self._max}", offset=0,
                                 length=n)
            need = 4 + n
            if len(self._buf) >= need:
                body = bytes(self._buf[4:need])
                del self._buf[:need]
                return body
        if self.closed and self._buf:
            raise FrameError(f"connection closed inside a frame ({len(self._buf)} of {need} "
                             "bytes)", offset=len(self._buf))
        return None


class FrameReader:
    """Reads whole frames from a trio stream (a :class:`FrameBuffer` fed from it)."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame: int = MAX_FRAME) -> None:
        self._stream = stream
        self._frames = FrameBuffer(max_frame)

    async def read(self) -> dict[str, Any] | None:
        """The next frame's object, or None at a clean end of stream."""
        body = await self.read_body()
        return None if body is None else decode_body(body)

    async def read_body(self) -> bytes | None:
        """The next frame's body bytes (not decoded), or None at a clean end of stream."""
        while (body := self._frames.next_body()) is None and not self._frames.closed:
            self._frames.feed(await self._stream.receive_some(65536))
        return body


# --------------------------------------------------------------------------- frame shapes


def request(req_id: int, method: str, params: dict[str, Any], *,
            stream: bool = False) -> dict[str, Any]:
    frame: dict[str, Any] = {"id": req_id, "method": method, "params": params}
    if stream:
        frame["stream"] = True
    return frame


def success(req_id: int, result: Any, *, stream: bool = False) -> dict[str, Any]:
    frame: dict[str, Any] = {"id": req_id, "ok": True, "result": result}
    if stream:
        frame["stream"] = True
    return frame


def _error_fields(exc: errors.AotxError) -> dict[str, Any]:
    return {"error": exc.envelope()["error"], "kind": type(exc).__name__}


def failure(req_id: int, exc: errors.AotxError) -> dict[str, Any]:
    return {"id": req_id, "ok": False, **_error_fields(exc)}


def item(stream_id: int, value: Any) -> dict[str, Any]:
    return {"id": stream_id, "item": value}


def end(stream_id: int, reason: str, exc: errors.AotxError | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = {"id": stream_id, "end": reason}
    if exc is not None:
        frame.update(_error_fields(exc))
    return frame


def cancel(stream_id: int) -> dict[str, Any]:
    return {"id": stream_id, "cancel": True}


def error_from_frame(frame: dict[str, Any]) -> errors.AotxError:
    """Rebuild the exception a failure or error-end frame carries (same class, code and
    fields)."""
    body = frame.get("error")
    if not isinstance(body, dict):
        return FrameError("failure frame without an error object")
    fields = {k: v for k, v in body.items() if k not in ("code", "message")}
    cls = errors.by_name(str(frame.get("kind", ""))) or errors.AotxError
    return cls(str(body.get("message", "")), code=str(body.get("code", "error")), **fields)
