"""Service-socket framing: length-prefixed JSON frames (docs/formats/socket.md).

A frame is a 4-byte little-endian unsigned length ``N`` (1 <= N <= MAX_FRAME)
followed by ``N`` bytes of UTF-8 JSON holding one object.

* request  ``{"id": <int>, "method": "<name>", "params": {...}}``
* success  ``{"id": <int>, "ok": true, "result": <json>}``
* failure  ``{"id": <int>, "ok": false, "error": {"code", "message", ...},
  "kind": "<AotxError subclass name>"}``

Binary values travel as base64 strings inside ``params``/``result``.  This
module is a leaf: it knows frames and the error round trip, nothing of the
methods themselves.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import trio

from aotx_trio import errors

MAX_FRAME = 4 * 1024 * 1024
_LEN = struct.Struct("<I")


class FrameError(errors.AotxError):
    """A frame that breaks the framing rules; the connection is closed after it."""

    default_code = "frame_invalid"


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
        if not await self._fill(4):
            return None
        (n,) = _LEN.unpack_from(self._buf, 0)
        if n == 0 or n > self._max:
            raise FrameError(f"frame length {n} is outside 1..{self._max}", offset=0, length=n)
        if not await self._fill(4 + n):
            raise FrameError("connection closed inside a frame", offset=len(self._buf))
        body = bytes(self._buf[4:4 + n])
        del self._buf[:4 + n]
        return decode_body(body)


def request(req_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"id": req_id, "method": method, "params": params}


def success(req_id: int, result: Any) -> dict[str, Any]:
    return {"id": req_id, "ok": True, "result": result}


def failure(req_id: int, exc: errors.AotxError) -> dict[str, Any]:
    return {"id": req_id, "ok": False, "error": exc.envelope()["error"],
            "kind": type(exc).__name__}


# Error classes defined outside aotx_trio.errors that may cross the socket.
_EXTRA_KINDS: dict[str, type[errors.AotxError]] = {}


def register_error_kind(cls: type[errors.AotxError]) -> type[errors.AotxError]:
    """Let :func:`error_from_frame` rebuild ``cls`` (a class outside aotx_trio.errors)."""
    _EXTRA_KINDS[cls.__name__] = cls
    return cls


def error_from_frame(frame: dict[str, Any]) -> errors.AotxError:
    """Rebuild the exception a failure frame carries (same class, code and fields)."""
    body = frame.get("error")
    if not isinstance(body, dict):
        return FrameError("failure frame without an error object")
    fields = {k: v for k, v in body.items() if k not in ("code", "message")}
    kind = str(frame.get("kind", ""))
    cls = _EXTRA_KINDS.get(kind) or getattr(errors, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.AotxError)):
        cls = errors.AotxError
    return cls(str(body.get("message", "")), code=str(body.get("code", "error")), **fields)
