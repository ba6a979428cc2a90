"""A subscription's URL: the rules (no I/O) and the address vetting.

``https`` only (``http`` too when ``webhooks.allow_insecure_targets``), any port, no
userinfo, no fragment; a host name or an exact IP literal.  Vetting resolves the
host and refuses it unless every address is global (private, loopback, link-local
and reserved ones are allowed only with ``allow_insecure_targets``): the upload
delivery's resolver and address policy (``aotx_trio.router.upload_targets``), run
at registration and again before every post, whose connection goes to a vetted
address only.  A URL's path and query (which may hold a token) are never logged:
:func:`shown` is what messages hold.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from dataclasses import dataclass, field

from aotx_trio.errors import InvalidInput
from aotx_trio.router.upload_policy import LABEL, UploadPolicy
from aotx_trio.router.upload_targets import MAX_URL_CHARS, Target, resolve


@dataclass(frozen=True)
class HookTarget:
    tls: bool
    host: str            # lowercase; an IPv6 literal without brackets
    port: int
    request_target: str = field(repr=False)

    @property
    def host_header(self) -> str:
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == (443 if self.tls else 80) else f"{name}:{self.port}"

    def shown(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host_header}/..."


def _bad(rule: str, message: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_params", param="url", rule=rule)


def check_url(url: object, allow_insecure: bool) -> HookTarget:
    """The URL's target (422 ``invalid_params``, ``param: "url"``), without I/O."""
    if not isinstance(url, str) or not url:
        raise _bad("required", "url must be a non-empty string")
    if len(url) > MAX_URL_CHARS or not all("!" <= c <= "~" for c in url):
        raise _bad("url", f"url must be at most {MAX_URL_CHARS} characters of printable "
                   "ASCII without spaces")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        raise _bad("url", "url is not a valid URL") from None
    scheme = parts.scheme.lower()
    if scheme != "https" and not (allow_insecure and scheme == "http"):
        raise _bad("scheme", "url must be an https URL")
    if "@" in parts.netloc:
        raise _bad("userinfo", "url must not embed credentials")
    if "#" in url:
        raise _bad("fragment", "url must not have a fragment")
    host = (parts.hostname or "").lower()
    if not _is_ip(host) and (not host or len(host) > 253
                             or not all(LABEL.match(x) for x in host.split("."))
                             or host.rsplit(".", 1)[-1].isdigit()):
        raise _bad("host", "url has an invalid host name")
    tls = scheme == "https"
    request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return HookTarget(tls, host, port if port is not None else (443 if tls else 80),
                      request_target)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def policy(allow_insecure: bool, timeout_s: float, ca_file: str | None) -> UploadPolicy:
    """The address policy of webhook posts: the upload delivery's (its host and port
    lists are not used here: any public host and port may receive posts)."""
    return UploadPolicy(allow_private_addresses=allow_insecure, timeout_s=timeout_s,
                        ca_file=ca_file)


async def vet(t: HookTarget, pol: UploadPolicy) -> tuple[str, ...]:
    """The addresses a post may connect to (422 ``invalid_params`` on ``url``, rule
    ``unresolvable`` or ``address``)."""
    addresses, reason = await resolve(Target(0, "webhook", t.host, t.port, ""), pol)
    if reason == "address":
        raise _bad("address", "url: its host resolves to a private, loopback, link-local "
                   "or reserved address")
    if reason is not None:
        raise _bad("unresolvable", "url: its host does not resolve")
    return addresses
