"""One webhook POST: to a vetted address only (SNI, ``Host`` and the certificate are
the URL's name), a bounded time and a bounded answer; redirects are never followed
(a 3xx is a failure like any non-2xx).  The answer's status, or :class:`PostFailed`."""

from __future__ import annotations

import functools
import ssl
from collections.abc import Mapping

import h11
import trio

from aotx_trio.router.upload_policy import UploadPolicy
from aotx_trio.webhooks.targets import HookTarget

MAX_RESPONSE_BYTES = 64 * 1024
_CHUNK = 64 * 1024


class PostFailed(Exception):
    """A post that got no status (the reason is safe to log: it never holds the URL)."""


@functools.lru_cache(maxsize=16)
def ssl_context(ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def post(t: HookTarget, addresses: tuple[str, ...], body: bytes,
               headers: Mapping[str, str], pol: UploadPolicy) -> int:
    """POST ``body``; the status code (PostFailed: no answer within the policy's time)."""
    try:
        with trio.fail_after(pol.timeout_s):
            return await _post(t, addresses, body, headers, pol)
    except trio.TooSlowError:
        raise PostFailed("timeout") from None
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
            h11.ProtocolError) as exc:
        cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(cause, ssl.SSLError):
            raise PostFailed(f"tls:{type(cause).__name__}") from None
        raise PostFailed(f"connection:{type(exc).__name__}") from None


async def _connect(addresses: tuple[str, ...], port: int) -> trio.SocketStream:
    last: OSError | None = None
    for address in addresses:
        try:
            return await trio.open_tcp_stream(address, port)
        except OSError as exc:
            last = exc
    raise last if last is not None else PostFailed("address")


async def _post(t: HookTarget, addresses: tuple[str, ...], body: bytes,
                headers: Mapping[str, str], pol: UploadPolicy) -> int:
    stream: trio.abc.Stream = await _connect(addresses, t.port)
    if t.tls:
        tls = trio.SSLStream(stream, ssl_context(pol.ca_file), server_hostname=t.host,
                             https_compatible=True)
        stream = tls
    try:
        if t.tls:
            await tls.do_handshake()
        conn = h11.Connection(h11.CLIENT)
        head = h11.Request(method="POST", target=t.request_target, headers=[
            ("Host", t.host_header), ("Content-Length", str(len(body))),
            ("Content-Type", "application/json"), ("User-Agent", "aotx-router-webhooks"),
            ("Connection", "close"), *headers.items()])
        await stream.send_all(conn.send(head) + conn.send(h11.Data(data=body))
                              + conn.send(h11.EndOfMessage()))
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
                raise PostFailed("connection:no_response")
            return status
