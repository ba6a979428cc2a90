"""Upload delivery (serving-router.txt "Upload delivery"): output targets checked
before any work, then one HTTPS PUT per result to a vetted, pinned address.

- :func:`check_targets` (no I/O, before dispatch): one ``{output_id, put_url}`` per
  requested list item, unique non-empty ids, ``https``, an allowed port (443),
  a host under an allowed suffix, no IP literal, no userinfo, no fragment.
- :func:`vet_targets` (before dispatch, resolves): every address a host resolves to
  must be global (not private, loopback, link-local, reserved, multicast...) unless
  the policy allows private addresses; the vetted addresses are pinned on the target.
- :func:`put_all` connects to a pinned address only (no second resolution: no
  time-of-check/time-of-use gap), with SNI and ``Host`` the URL's name and the
  certificate verified for it; never follows a redirect (a 3xx fails); any failure
  of the batch is 502 ``upload_failed`` and the batch reports no results.

A presigned URL is a bearer capability: no message, error field, log line or
``repr`` here ever holds it (only ``output_targets[i]`` and the output id).
"""

from __future__ import annotations

import functools
import logging
import ssl
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import h11
import trio

from aotx_trio.errors import UpstreamFailure
from aotx_trio.router.upload_policy import DEFAULT_SUFFIXES, UploadPolicy, system_resolver
from aotx_trio.router.upload_targets import Target, check_targets, resolve, vet_targets

__all__ = ["DEFAULT_SUFFIXES", "Target", "UploadPolicy", "check_targets", "put_all",
           "system_resolver", "vet_targets"]

log = logging.getLogger("aotx.router.upload")
_CHUNK = 64 * 1024
_MAX_RESPONSE_BYTES = 64 * 1024


class _Failed(Exception):
    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@functools.lru_cache(maxsize=16)
def _ssl_context(policy: UploadPolicy) -> ssl.SSLContext:
    """The client TLS context of a policy (built once: loading a trust store is slow)."""
    ctx = ssl.create_default_context(cafile=policy.ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


async def put_all(targets: Sequence[Target], bodies: Sequence[bytes], policy: UploadPolicy,
                  *, content_type: str = "application/octet-stream") -> list[str]:
    """PUT ``bodies[i]`` to ``targets[i]``; the output ids, in order, once every PUT got a
    2xx. Any failure (resolution, address, connect, TLS, timeout, a non-2xx status, a
    redirect) ends the batch: 502 ``upload_failed`` naming the first target that failed."""
    if len(targets) != len(bodies):
        raise ValueError(f"{len(targets)} targets for {len(bodies)} bodies")
    failures: list[tuple[Target, _Failed]] = []
    ctx = _ssl_context(policy)
    work = iter(zip(targets, bodies, strict=True))   # shared: PUTs start in target order

    async def worker(cancel: trio.CancelScope) -> None:
        for t, body in work:
            failure = await _one(t, body, policy, ctx, content_type)
            if failure is not None:
                failures.append(failure)
                cancel.cancel()
                return

    async with trio.open_nursery() as nursery:
        for _ in range(min(policy.max_concurrency, len(targets))):
            nursery.start_soon(worker, nursery.cancel_scope)
    if failures:
        failures.sort(key=lambda f: f[0].index)
        t, exc = failures[0]
        log.warning("upload to %s (output_id %.80r) failed: %s%s; batch of %d reports "
                    "no results", t.param, t.output_id, exc.reason,
                    f" {exc.status}" if exc.status else "", len(targets))
        fields: dict[str, Any] = {"param": t.param, "output_id": t.output_id[:80],
                                  "reason": exc.reason.split(":")[0]}
        if exc.status is not None:
            fields["status"] = exc.status
        raise UpstreamFailure(f"the upload to {t.param} failed ({exc.reason}"
                              f"{' ' + str(exc.status) if exc.status else ''}); the batch "
                              "reports no results", code="upload_failed", **fields)
    return [t.output_id for t in targets]


async def _one(t: Target, body: bytes, policy: UploadPolicy, ctx: ssl.SSLContext,
               content_type: str) -> tuple[Target, _Failed] | None:
    """One PUT; its failure (None: a 2xx)."""
    try:
        if not t.addresses:
            addresses, reason = await resolve(t, policy)
            if reason is not None:
                raise _Failed(reason)
            t = replace(t, addresses=addresses)
        with trio.fail_after(policy.timeout_s):
            await _put(t, body, ctx, content_type)
    except _Failed as exc:
        return t, exc
    except trio.TooSlowError:
        return t, _Failed("timeout")
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
            h11.ProtocolError) as exc:
        cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
        if isinstance(cause, ssl.SSLError):   # trio wraps TLS failures
            return t, _Failed(f"tls:{type(cause).__name__}")
        return t, _Failed(f"connection:{type(exc).__name__}")
    return None


async def _connect(t: Target) -> trio.SocketStream:
    last: OSError | None = None
    for address in t.addresses:
        try:
            return await trio.open_tcp_stream(address, t.port)
        except OSError as exc:
            last = exc
    raise last if last is not None else _Failed("address")


async def _put(t: Target, body: bytes, ctx: ssl.SSLContext, content_type: str) -> None:
    stream = await _connect(t)
    tls = trio.SSLStream(stream, ctx, server_hostname=t.host, https_compatible=True)
    try:
        await tls.do_handshake()
        conn = h11.Connection(h11.CLIENT)
        head = h11.Request(method="PUT", target=t.request_target, headers=[
            ("Host", t.host_header), ("Content-Length", str(len(body))),
            ("Content-Type", content_type), ("User-Agent", "aotx-router"),
            ("Connection", "close")])
        await tls.send_all(conn.send(head))
        view = memoryview(body)
        for start in range(0, len(body), _CHUNK):
            await tls.send_all(conn.send(h11.Data(data=bytes(view[start:start + _CHUNK]))))
        await tls.send_all(conn.send(h11.EndOfMessage()))
        status = await _read_status(conn, tls)
    finally:
        await trio.aclose_forcefully(tls)
    if 300 <= status < 400:
        raise _Failed("redirect", status)
    if not 200 <= status < 300:
        raise _Failed("status", status)


async def _read_status(conn: h11.Connection, tls: trio.SSLStream[trio.SocketStream]) -> int:
    status: int | None = None
    read = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = bytes(await tls.receive_some(_CHUNK))
            if not data and status is not None:
                return status
            conn.receive_data(data)
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            read += len(event.data)
            if read > _MAX_RESPONSE_BYTES:
                assert status is not None
                return status
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            if status is None:
                raise _Failed("connection:no_response")
            return status
