"""Upload delivery's output targets, checked before any work: :func:`check_targets`
(the envelope and each URL, no I/O) and :func:`vet_targets` (each host resolved, every
address allowed by the policy, the addresses pinned on the target). Every refusal is
422 ``invalid_params`` naming ``output_targets[i]...`` and never holds the URL."""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from aotx_trio.errors import InvalidInput
from aotx_trio.router.upload_policy import LABEL, UploadPolicy

MAX_URL_CHARS = 8192
MAX_OUTPUT_ID_CHARS = 256
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)\Z")


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


def _bad(param: str, rule: str, message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_params", param=param, rule=rule)


def check_targets(targets: Any, expected_count: int, policy: UploadPolicy) -> list[Target]:
    """The envelope's ``output_targets``, checked without I/O (422 ``invalid_params``)."""
    if not isinstance(targets, list):
        raise _bad("output_targets", "type", "output_targets must be a list")
    if len(targets) != expected_count:
        raise _bad("output_targets", "count", f"output_targets must hold one target per "
                   f"requested item: {expected_count}, not {len(targets)}")
    seen: set[str] = set()
    out: list[Target] = []
    for i, raw in enumerate(targets):
        where = f"output_targets[{i}]"
        if not isinstance(raw, dict):
            raise _bad(where, "type", f"{where} must be an object")
        for key in raw:
            if key not in ("output_id", "put_url"):
                raise _bad(f"{where}.{str(key)[:80]}", "unknown",
                           f"{where} may hold only output_id and put_url")
        oid = raw.get("output_id")
        if not isinstance(oid, str) or not oid:
            raise _bad(f"{where}.output_id", "required", f"{where}.output_id must be a "
                       "non-empty string")
        if len(oid) > MAX_OUTPUT_ID_CHARS or not oid.isprintable():
            raise _bad(f"{where}.output_id", "output_id", f"{where}.output_id must be at most "
                       f"{MAX_OUTPUT_ID_CHARS} printable characters")
        if oid in seen:
            raise _bad(f"{where}.output_id", "duplicate", f"{where}.output_id repeats an "
                       "earlier target's id")
        seen.add(oid)
        out.append(_check_url(raw.get("put_url"), i, oid, policy))
    return out


def _check_url(url: Any, index: int, oid: str, policy: UploadPolicy) -> Target:
    where = f"output_targets[{index}].put_url"
    if not isinstance(url, str) or not url:
        raise _bad(where, "required", f"{where} must be a non-empty string")
    if len(url) > MAX_URL_CHARS or not all("!" <= c <= "~" for c in url):
        raise _bad(where, "url", f"{where} must be at most {MAX_URL_CHARS} characters of "
                   "printable ASCII without spaces")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise _bad(where, "url", f"{where} is not a valid URL") from None
    if parts.scheme.lower() != "https":
        raise _bad(where, "scheme", f"{where} must be an https URL")
    if "@" in parts.netloc:
        raise _bad(where, "userinfo", f"{where} must not embed credentials")
    if "#" in url:
        raise _bad(where, "fragment", f"{where} must not have a fragment")
    port = 443 if port is None else port
    if port not in policy.allowed_ports:
        raise _bad(where, "port", f"{where} must use port "
                   f"{' or '.join(str(p) for p in policy.allowed_ports)}")
    host = (parts.hostname or "").lower()
    if parts.netloc.startswith("[") or _is_ip_literal(host):
        raise _bad(where, "ip_literal", f"{where} must name a host, not an IP address")
    if not host or len(host) > 253 or not all(LABEL.match(x) for x in host.split(".")):
        raise _bad(where, "host", f"{where} has an invalid host name")
    if not policy.host_allowed(host):
        raise _bad(where, "host", f"{where} must be on a host under "
                   f"{', '.join(policy.allowed_host_suffixes)}")
    request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(index, oid, host, port, request_target)


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return bool(_NUMERIC_LABEL.match(last))   # 127.1, 0x7f.1: resolvers read these as IPs


async def vet_targets(targets: Sequence[Target], policy: UploadPolicy) -> list[Target]:
    """``targets`` with their vetted addresses pinned (422 ``invalid_params``, rule
    ``unresolvable`` or ``address``): run before dispatch."""
    out = []
    for t in targets:
        addresses, reason = await resolve(t, policy)
        if reason is not None:
            rule = "address" if reason == "address" else "unresolvable"
            raise _bad(f"{t.param}.put_url", rule,
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
