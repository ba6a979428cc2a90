"""One webhook POST: to a vetted address only (SNI, ``Host`` and the certificate are
the URL's name), a bounded time and a bounded answer; redirects are never followed
(a 3xx is a failure like any non-2xx).  The answer's status, or
:class:`aotx_trio.errors.OutboundFailed`.  The transport is the router's one pinned-address client
(:mod:`aotx_trio.outbound.pinned_http`, shared with upload delivery)."""

from __future__ import annotations

from collections.abc import Mapping

from aotx_trio.outbound.pinned_http import request
from aotx_trio.outbound.policy import UploadPolicy
from aotx_trio.outbound.urls import Url


async def post(t: Url, addresses: tuple[str, ...], body: bytes,
               headers: Mapping[str, str], pol: UploadPolicy) -> int:
    """POST ``body``; the status code (OutboundFailed: no answer within the policy's time)."""
    return await request(
        "POST", host=t.host, port=t.port, addresses=addresses, target=t.request_target,
        host_header=t.host_header, body=body, timeout_s=pol.timeout_s,
        ca_file=pol.ca_file, tls=t.tls,
        headers=[("Content-Type", "application/json"),
                 ("User-Agent", "aotx-router-webhooks"), *headers.items()])
