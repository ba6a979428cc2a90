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

import ipaddress
import logging
import re
import ssl
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import h11
import trio

from aotx_trio.errors import ConfigError, InvalidInput, UpstreamFailure

log = logging.getLogger("aotx.router.upload")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
DEFAULT_SUFFIXES = (".storage.dev", ".storage.tigris.dev")
MAX_URL_CHARS = 8192
MAX_OUTPUT_ID_CHARS = 256
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)\Z")
_CHUNK = 64 * 1024
_MAX_RESPONSE_BYTES = 64 * 1024


async def system_resolver(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (the system resolver, through trio)."""
    infos = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class UploadPolicy:
    """Where output targets may point. ``from_config`` reads ``router.upload``."""

    allowed_host_suffixes: tuple[str, ...] = DEFAULT_SUFFIXES
    allow_private_addresses: bool = False
    allowed_ports: tuple[int, ...] = (443,)
    timeout_s: float = 60.0
    ca_file: str | None = None
    max_concurrency: int = 4
    #: host, port -> addresses; the system resolver unless a test stands in for DNS
    resolver: Resolver = field(default=system_resolver, compare=False, repr=False)

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> UploadPolicy:
        """The policy of the ``router.upload`` configuration object (absent keys default)."""
        section = dict(section or {})
        where = "router.upload"
        known = {"allowed_host_suffixes", "allow_private_addresses", "allowed_ports",
                 "timeout_s", "ca_file", "max_concurrency"}
        for key in section:
            if key not in known:
                raise ConfigError(f"{where}.{key} is not a configuration key", key=f"{where}.{key}")
        kw: dict[str, Any] = {}
        if "allowed_host_suffixes" in section:
            v = section["allowed_host_suffixes"]
            if (not isinstance(v, list | tuple) or not v
                    or not all(isinstance(s, str) and _suffix_ok(s) for s in v)):
                raise _config(f"{where}.allowed_host_suffixes",
                              "a non-empty list of host names or .suffixes (lowercase ASCII)")
            kw["allowed_host_suffixes"] = tuple(v)
        if "allow_private_addresses" in section:
            if not isinstance(section["allow_private_addresses"], bool):
                raise _config(f"{where}.allow_private_addresses", "a boolean")
            kw["allow_private_addresses"] = section["allow_private_addresses"]
        if "allowed_ports" in section:
            v = section["allowed_ports"]
            if (not isinstance(v, list | tuple) or not v or not all(
                    isinstance(p, int) and not isinstance(p, bool) and 0 < p < 65536 for p in v)):
                raise _config(f"{where}.allowed_ports", "a non-empty list of ports")
            kw["allowed_ports"] = tuple(v)
        if "timeout_s" in section:
            v = section["timeout_s"]
            if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= 3600:
                raise _config(f"{where}.timeout_s", "a number of seconds in (0, 3600]")
            kw["timeout_s"] = float(v)
        if "ca_file" in section:
            v = section["ca_file"]
            if v is not None and not (isinstance(v, str) and v):
                raise _config(f"{where}.ca_file", "a file path or null")
            kw["ca_file"] = v
        if "max_concurrency" in section:
            v = section["max_concurrency"]
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 64:
                raise _config(f"{where}.max_concurrency", "an integer from 1 to 64")
            kw["max_concurrency"] = v
        return cls(**kw)

    def host_allowed(self, host: str) -> bool:
        return any(host.endswith(s) and len(host) > len(s) if s.startswith(".") else host == s
                   for s in self.allowed_host_suffixes)

    def address_allowed(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address):
            embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
            if embedded is not None and not self.address_allowed(str(embedded)):
                return False
        if ip.is_unspecified or ip.is_multicast:
            return False
        return self.allow_private_addresses or (ip.is_global and not ip.is_reserved)


def _suffix_ok(suffix: str) -> bool:
    name = suffix[1:] if suffix.startswith(".") else suffix
    labels = name.split(".")
    return bool(name) and len(name) <= 253 and all(_LABEL.match(x) for x in labels)


def _config(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key} must be {what}", key=key)


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
    if not host or len(host) > 253 or not all(_LABEL.match(x) for x in host.split(".")):
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
        addresses, reason = await _resolve(t, policy)
        if reason is not None:
            rule = "address" if reason == "address" else "unresolvable"
            raise _bad(f"{t.param}.put_url", rule,
                       f"{t.param}.put_url: its host "
                       + ("resolves to a private, loopback, link-local or reserved address"
                          if rule == "address" else "does not resolve"))
        out.append(replace(t, addresses=addresses))
    return out


async def _resolve(t: Target, policy: UploadPolicy) -> tuple[tuple[str, ...], str | None]:
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


class _Failed(Exception):
    def __init__(self, reason: str, status: int | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


def _ssl_context(policy: UploadPolicy) -> ssl.SSLContext:
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
    limiter = trio.CapacityLimiter(policy.max_concurrency)

    async def one(t: Target, body: bytes, cancel: trio.CancelScope) -> None:
        async with limiter:
            try:
                if not t.addresses:
                    addresses, reason = await _resolve(t, policy)
                    if reason is not None:
                        raise _Failed(reason)
                    t = replace(t, addresses=addresses)
                with trio.fail_after(policy.timeout_s):
                    await _put(t, body, ctx, content_type)
            except _Failed as exc:
                failures.append((t, exc))
            except trio.TooSlowError:
                failures.append((t, _Failed("timeout")))
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError,
                    h11.ProtocolError) as exc:
                cause = exc if isinstance(exc, ssl.SSLError) else exc.__cause__
                if isinstance(cause, ssl.SSLError):   # trio wraps TLS failures
                    failures.append((t, _Failed(f"tls:{type(cause).__name__}")))
                else:
                    failures.append((t, _Failed(f"connection:{type(exc).__name__}")))
            else:
                return
            cancel.cancel()

    async with trio.open_nursery() as nursery:
        for t, body in zip(targets, bodies, strict=True):
            nursery.start_soon(one, t, body, nursery.cancel_scope)
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
