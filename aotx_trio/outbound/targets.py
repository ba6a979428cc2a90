"""Upload delivery's output targets, checked before any work: :func:`check_targets`
(the envelope and each URL, no I/O) and :func:`vet_targets` (each host resolved, every
address allowed by the policy, the addresses pinned on the target). Every refusal is
422 ``invalid_params`` naming ``output_targets[i]...`` and never holds the URL."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from aotx_trio.errors import InvalidParams
from aotx_trio.outbound.policy import UploadPolicy
from aotx_trio.outbound.urls import check_url

MAX_OUTPUT_ID_CHARS = 256


@dataclass(frozen=True)
class Target:
    """One checked output target. ``request_target`` (path and query: the presigned
    signature) is kept out of ``repr``."""

    index: int
    output_id: str
    host: str
    port: int
    request_target: str = field(repr=False)
    #: the vetted addresses (:func:`vet_targets`); empty until then
    addresses: tuple[str, ...] = ()

    @property
    def param(self) -> str:
        return f"output_targets[{self.index}]"

    @property
    def host_header(self) -> str:
        return self.host if self.port == 443 else f"{self.host}:{self.port}"


def check_targets(targets: Any, expected_count: int, policy: UploadPolicy) -> list[Target]:
    """The envelope's ``output_targets``, checked without I/O (422 ``invalid_params``)."""
    if not isinstance(targets, list):
        raise InvalidParams("output_targets", "type", "output_targets must be a list")
    if len(targets) != expected_count:
        raise InvalidParams("output_targets", "count", f"output_targets must hold one target per "
                   f"requested item: {expected_count}, not {len(targets)}")
    seen: set[str] = set()
    out: list[Target] = []
    for i, raw in enumerate(targets):
        where = f"output_targets[{i}]"
        if not isinstance(raw, dict):
            raise InvalidParams(where, "type", f"{where} must be an object")
        for key in raw:
            if key not in ("output_id", "put_url"):
                raise InvalidParams(f"{where}.{str(key)[:80]}", "unknown",
                           f"{where} may hold only output_id and put_url")
        oid = raw.get("output_id")
        if not isinstance(oid, str) or not oid:
            raise InvalidParams(f"{where}.output_id", "required", f"{where}.output_id must be a "
                       "non-empty string")
        if len(oid) > MAX_OUTPUT_ID_CHARS or not oid.isprintable():
            raise InvalidParams(f"{where}.output_id", "output_id",
                                f"{where}.output_id must be at most "
                                f"{MAX_OUTPUT_ID_CHARS} printable characters")
        if oid in seen:
            raise InvalidParams(f"{where}.output_id", "duplicate", f"{where}.output_id repeats an "
                       "earlier target's id")
        seen.add(oid)
        out.append(_check_url(raw.get("put_url"), i, oid, policy))
    return out


def _check_url(url: Any, index: int, oid: str, policy: UploadPolicy) -> Target:
    where = f"output_targets[{index}].put_url"
    u = check_url(url, where)
    if u.port not in policy.allowed_ports:
        raise InvalidParams(where, "port", f"{where} must use port "
                            f"{' or '.join(str(p) for p in policy.allowed_ports)}")
    if not policy.host_allowed(u.host):
        raise InvalidParams(where, "host", f"{where} must be on a host under "
                            f"{', '.join(policy.allowed_host_suffixes)}")
    return Target(index, oid, u.host, u.port, u.request_target)


async def vet_targets(targets: Sequence[Target], policy: UploadPolicy) -> list[Target]:
    """``targets`` with their vetted addresses pinned (422 ``invalid_params``, rule
    ``unresolvable`` or ``address``): run before dispatch."""
    out = []
    for t in targets:
        addresses, reason = await resolve(t, policy)
        if reason is not None:
            rule = "address" if reason == "address" else "unresolvable"
            raise InvalidParams(f"{t.param}.put_url", rule,
                       f"{t.param}.put_url: its host "
                       + ("resolves to a private, loopback, link-local or reserved address"
                          if rule == "address" else "does not resolve"))
        out.append(replace(t, addresses=addresses))
    return out


async def resolve(t: Target, policy: UploadPolicy) -> tuple[tuple[str, ...], str | None]:
    with trio.move_on_after(policy.timeout_s):
        try:
            found = await policy.resolver(t.host, t.port)
        except OSError:
            return (), "unresolvable"
        addresses = tuple(dict.fromkeys(found))
        if not addresses:
            return (), "unresolvable"
        if not all(policy.address_allowed(a) for a in addresses):
            return (), "address"
        return addresses, None
    return (), "unresolvable"
