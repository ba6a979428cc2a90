"""One HTTP/1.1 request to an address vetted beforehand (no second resolution), over
TLS whose SNI, ``Host`` and certificate are the URL's name: the transport of upload
delivery (``upload.py``, PUT) and webhook posts (``webhooks/post.py``, POST).

A redirect is never followed (the caller sees its 3xx status); the answer's body is
read only up to ``MAX_RESPONSE_BYTES`` (the status is all that counts); any failure
is :class:`aotx_trio.errors.OutboundFailed` with a short reason that is safe to log (``timeout``,
``tls:<error>``, ``connection:<error>``, ``address``): it never holds the URL.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Sequence

import h11
import trio

from aotx_trio.errors import OutboundFailed

MAX_RESPONSE_BYTES = 64 * 1024
_CHUNK = 64 * 1024


@functools.lru_cache(maxsize=16)
def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    """The client TLS context for a trust store (built once: loading one is slow)."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def request(method: str, *, host: str, port: int, addresses: Sequence[str],
                  target: str, host_header: str, headers: Sequence[tuple[str, str]],
                  body: bytes, timeout_s: float, ca_file: str | None,
                  tls: bool = True) -> int:
    """Send one request with ``body`` to the first of ``addresses`` that connects; the
    answer's status code, or :class:`~aotx_trio.errors.OutboundFailed`."""
    try:
        with trio.fail_after(timeout_s):
            return await _request(method, host, port, addresses, target, host_header,
                                  headers, body, ca_file, tls)
    except trio.TooSlowError:
        raise OutboundFailed("timeout") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
            h11.ProtocolError) as exc:
        cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(cause, ssl.SSLError):   # trio wraps TLS failures
            raise OutboundFailed(f"tls:{type(cause).__name__}") from None
        raise OutboundFailed(f"connection:{type(exc).__name__}") from None


async def _connect(addresses: Sequence[str], port: int) -> trio.SocketStream:
    last: OSError | None = None
    for address in addresses:
        try:
            return await trio.open_tcp_stream(address, port)
        except OSError as exc:
            last = exc
    if last is not None:
        raise last
    raise OutboundFailed("address")


async def _request(method: str, host: str, port: int, addresses: Sequence[str],
                   target: str, host_header: str, headers: Sequence[tuple[str, str]],
                   body: bytes, ca_file: str | None, tls: bool) -> int:
    stream: trio.abc.Stream = await _connect(addresses, port)
    try:
        if tls:
            secure = trio.SSLStream(stream, ssl_context(ca_file), server_hostname=host,
                                    https_compatible=True)
            stream = secure
            await secure.do_handshake()
        conn = h11.Connection(h11.CLIENT)
        head = h11.Request(method=method, target=target, headers=[
            ("Host", host_header), ("Content-Length", str(len(body))), *headers,
            ("Connection", "close")])
        await stream.send_all(conn.send(head))
        view = memoryview(body)
        for start in range(0, len(body), _CHUNK):
            await stream.send_all(conn.send(h11.Data(data=bytes(view[start:start + _CHUNK]))))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        return await _status(conn, stream)
    finally:
        await trio.aclose_forcefully(stream)


async def _status(conn: h11.Connection, stream: trio.abc.Stream) -> int:
    status: int | None = None
    read = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = bytes(await stream.receive_some(_CHUNK))
            if not data and status is not None:
                return status
            conn.receive_data(data)
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            read += len(event.data)
            if read > MAX_RESPONSE_BYTES:   # enough: the status is all that counts
                assert status is not None
                return status
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            if status is None:
                raise OutboundFailed("connection:no_response")
            return status
