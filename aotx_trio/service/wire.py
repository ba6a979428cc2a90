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
* item     ``{"id": <int>, "item": <json>}``
* end      ``{"id": <int>, "end": "<reason>"}``, with ``error`` and ``kind`` when the
  reason is ``error``
* cancel   ``{"id": <int>, "cancel": true}`` (client to runtime; answered by an end)

Binary values travel as base64 strings.  This module is a leaf: it knows
frames and the error round trip, nothing of the methods themselves.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.errors import FrameError

MAX_FRAME = 4 * 1024 * 1024
_LEN = struct.Struct("<I")

#: End reasons of a stream.
END_COMPLETE = "complete"        # the method has nothing more to push
END_CANCELLED = "cancelled"      # the client sent a cancel frame
END_ERROR = "error"              # the method failed; error + kind say how
END_SHUTDOWN = "shutdown"        # the runtime is stopping
END_REASONS = (END_COMPLETE, END_CANCELLED, END_ERROR, END_SHUTDOWN)


def encode_frame(obj: dict[str, Any]) -> bytes:
    """One frame: length prefix + compact UTF-8 JSON."""
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes is over the limit of {MAX_FRAME}",
                         length=len(body))
    return _LEN.pack(len(body)) + body


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


class FrameReader:
    """Reads whole frames from a trio stream (keeps the partial bytes between reads)."""

    def __init__(self, stream: trio.abc.ReceiveStream, max_frame: int = MAX_FRAME) -> None:
        self._stream = stream
        self._buf = bytearray()
        self._max = max_frame

    async def _fill(self, n: int) -> bool:
        while len(self._buf) < n:
            chunk = await self._stream.receive_some(65536)
            if not chunk:
                if self._buf:
                    raise FrameError(
                        f"connection closed inside a frame ({len(self._buf)} of {n} bytes)",
                        offset=len(self._buf))
                return False
            self._buf += chunk
        return True

    async def read(self) -> dict[str, Any] | None:
        """The next frame's object, or None at a clean end of stream."""
        body = await self.read_body()
        return None if body is None else decode_body(body)

    async def read_body(self) -> bytes | None:
        """The next frame's body bytes (not decoded), or None at a clean end of stream."""
        if not await self._fill(4):
            return None
        (n,) = _LEN.unpack_from(self._buf, 0)
        if n == 0 or n > self._max:
            raise FrameError(f"frame length {n} is outside 1..{self._max}", offset=0, length=n)
        if not await self._fill(4 + n):
            raise FrameError("connection closed inside a frame", offset=len(self._buf))
        body = bytes(self._buf[4:4 + n])
        del self._buf[:4 + n]
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
