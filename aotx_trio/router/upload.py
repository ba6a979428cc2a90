"""Upload delivery (docs/router.md, "Upload delivery"): output targets checked
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

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import trio

from aotx_trio.errors import OutboundFailed, UpstreamFailure
from aotx_trio.outbound.pinned_http import request
from aotx_trio.outbound.policy import DEFAULT_SUFFIXES, UploadPolicy, system_resolver
from aotx_trio.outbound.targets import Target, check_targets, resolve, vet_targets

__all__ = ["DEFAULT_SUFFIXES", "Target", "UploadPolicy", "check_targets", "put_all",
           "system_resolver", "vet_targets"]

log = logging.getLogger("aotx.router.upload")


#: a failed PUT: (its target, the reason safe to log, the status when one came)
_Failure = tuple[Target, str, int | None]


async def put_all(targets: Sequence[Target], bodies: Sequence[bytes], policy: UploadPolicy,
                  *, content_type: str = "application/octet-stream") -> list[str]:
    """PUT ``bodies[i]`` to ``targets[i]``; the output ids, in order, once every PUT got a
    2xx. Any failure (resolution, address, connect, TLS, timeout, a non-2xx status, a
    redirect) ends the batch: 502 ``upload_failed`` naming the first target that failed."""
    if len(targets) != len(bodies):
        raise ValueError(f"{len(targets)} targets for {len(bodies)} bodies")
    failures: list[_Failure] = []
    work = iter(zip(targets, bodies, strict=True))   # shared: PUTs start in target order

    async def worker(cancel: trio.CancelScope) -> None:
        for t, body in work:
            failure = await _one(t, body, policy, content_type)
            if failure is not None:
                failures.append(failure)
                cancel.cancel()
                return

    async with trio.open_nursery() as nursery:
        for _ in range(min(policy.max_concurrency, len(targets))):
            nursery.start_soon(worker, nursery.cancel_scope)
    if failures:
        failures.sort(key=lambda f: f[0].index)
        t, reason, status = failures[0]
        log.warning("upload to %s (output_id %.80r) failed: %s%s; batch of %d reports "
                    "no results", t.param, t.output_id, reason,
                    f" {status}" if status else "", len(targets))
        fields: dict[str, Any] = {"param": t.param, "output_id": t.output_id[:80],
                                  "reason": reason.split(":")[0]}
        if status is not None:
            fields["status"] = status
        raise UpstreamFailure(f"the upload to {t.param} failed ({reason}"
                              f"{' ' + str(status) if status else ''}); the batch "
                              "reports no results", code="upload_failed", **fields)
    return [t.output_id for t in targets]


async def _one(t: Target, body: bytes, policy: UploadPolicy, content_type: str,
               ) -> _Failure | None:
    """One PUT; its failure (None: a 2xx)."""
    if not t.addresses:
        addresses, reason = await resolve(t, policy)
        if reason is not None:
            return t, reason, None
        t = replace(t, addresses=addresses)
    try:
        status = await request(
            "PUT", host=t.host, port=t.port, addresses=t.addresses, target=t.request_target,
            host_header=t.host_header, body=body, timeout_s=policy.timeout_s,
            ca_file=policy.ca_file,
            headers=[("Content-Type", content_type), ("User-Agent", "aotx-router")])
    except OutboundFailed as exc:
        return t, exc.reason, None
    if 300 <= status < 400:
        return t, "redirect", status
    if not 200 <= status < 300:
        return t, "status", status
    return None
