"""The one check of a URL the service will send a request to (upload targets, webhook
targets), without I/O: every refusal is :class:`~aotx_trio.errors.InvalidParams`
naming the caller's field and the rule, and never holds the URL.

Both callers share the rules below; each adds its own (the upload policy's ports and
host suffixes, the webhooks' ``http`` for test targets):

* a non-empty string of at most :data:`MAX_URL_CHARS` printable ASCII characters;
* ``https`` (or a scheme the caller also allows), no userinfo, no fragment;
* a host name of ``[A-Za-z0-9-]`` labels (at most 253 characters) whose last label is
  not numeric (``127.1`` and ``0x7f.1`` read as IP addresses to resolvers), or, where
  the caller allows them, an exact IP literal.
"""

from __future__ import annotations

import ipaddress
import re
import urllib.parse
from dataclasses import dataclass, field

from aotx_trio.errors import InvalidParams
from aotx_trio.outbound.policy import LABEL

MAX_URL_CHARS = 8192
_NUMERIC_LABEL = re.compile(r"(?:[0-9]+|0x[0-9a-f]*)\Z")


@dataclass(frozen=True)
class Url:
    """A checked URL: where to connect, and what to send as the request target (path
    and query, which may hold a token or a presigned signature: kept out of ``repr``)."""

    tls: bool
    host: str            # lowercase; an IPv6 literal without brackets
    port: int
    request_target: str = field(repr=False)

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == (443 if self.tls else 80) else f"{name}:{self.port}"

    def shown(self) -> str:
        """The URL without its path and query: what log lines and messages hold."""
        return f"{'https' if self.tls else 'http'}://{self.host_header}/..."


def is_ip_literal(host: str) -> bool:
    """Whether a resolver would read ``host`` as an IP address."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    last = host.rstrip(".").rsplit(".", 1)[-1]
    return bool(_NUMERIC_LABEL.match(last))


def check_url(url: object, param: str, *, allow_http: bool = False,
              allow_ip: bool = False) -> Url:
    """``url`` checked by the shared rules; ``param`` names it in every refusal."""
    if not isinstance(url, str) or not url:
        raise InvalidParams(param, "required", f"{param} must be a non-empty string")
    if len(url) > MAX_URL_CHARS or not all("!" <= c <= "~" for c in url):
        raise InvalidParams(param, "url", f"{param} must be at most {MAX_URL_CHARS} "
                            "characters of printable ASCII without spaces")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise InvalidParams(param, "url", f"{param} is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme != "https" and not (allow_http and scheme == "http"):
        raise InvalidParams(param, "scheme", f"{param} must be an https URL")
    if "@" in parts.netloc:
        raise InvalidParams(param, "userinfo", f"{param} must not embed credentials")
    if "#" in url:
        raise InvalidParams(param, "fragment", f"{param} must not have a fragment")
    host = (parts.hostname or "").lower()
    if parts.netloc.startswith("[") or is_ip_literal(host):
        if not allow_ip:
            raise InvalidParams(param, "ip_literal",
                                f"{param} must name a host, not an IP address")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise InvalidParams(param, "host", f"{param} has an invalid host name") from None
    elif not host or len(host) > 253 or not all(LABEL.match(x) for x in host.split(".")):
        raise InvalidParams(param, "host", f"{param} has an invalid host name")
    tls = scheme == "https"
    request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Url(tls, host, port if port is not None else (443 if tls else 80), request_target)
