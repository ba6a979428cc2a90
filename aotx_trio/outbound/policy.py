"""Upload delivery's policy (``router.upload``): which hosts, ports and addresses an
output target may point at, and how long an upload may take (docs/configuration.md)."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from aotx_trio.errors import ConfigError

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
DEFAULT_SUFFIXES = (".storage.dev", ".storage.tigris.dev")
LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\Z")


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
    return bool(name) and len(name) <= 253 and all(LABEL.match(x) for x in labels)


def _config(key: str, what: str) -> ConfigError:
    return ConfigError(f"{key} must be {what}", key=key)
