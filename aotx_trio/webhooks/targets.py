"""A subscription's URL: the rules (no I/O) and the address vetting.

``https`` only (``http`` too when ``webhooks.allow_insecure_targets``), any port, no
userinfo, no fragment; a host name or an exact IP literal: the one URL check of
:mod:`aotx_trio.outbound.urls`.  Vetting resolves the
host and refuses it unless every address is global (private, loopback, link-local
and reserved ones are allowed only with ``allow_insecure_targets``): the upload
delivery's resolver and address policy (``aotx_trio.outbound.targets``), run
at registration and again before every post, whose connection goes to a vetted
address only.  A URL's path and query (which may hold a token) are never logged:
:meth:`Url.shown` is what messages hold.
"""

from __future__ import annotations

from aotx_trio.errors import InvalidParams
from aotx_trio.outbound import urls
from aotx_trio.outbound.policy import UploadPolicy
from aotx_trio.outbound.targets import Target, resolve
from aotx_trio.outbound.urls import Url


def check_url(url: object, allow_insecure: bool) -> Url:
    """The URL's target (422 ``invalid_params``, ``param: "url"``), without I/O."""
    return urls.check_url(url, "url", allow_http=allow_insecure, allow_ip=True)


def policy(allow_insecure: bool, timeout_s: float, ca_file: str | None) -> UploadPolicy:
    """The address policy of webhook posts: the upload delivery's (its host and port
    lists are not used here: any public host and port may receive posts)."""
    return UploadPolicy(allow_private_addresses=allow_insecure, timeout_s=timeout_s,
                        ca_file=ca_file)


async def vet(t: Url, pol: UploadPolicy) -> tuple[str, ...]:
    """The addresses a post may connect to (422 ``invalid_params`` on ``url``, rule
    ``unresolvable`` or ``address``)."""
    addresses, reason = await resolve(Target(0, "webhook", t.host, t.port, ""), pol)
    if reason == "address":
        raise InvalidParams("url", "address", "url: its host resolves to a private, "
                            "loopback, link-local or reserved address")
    if reason is not None:
        raise InvalidParams("url", "unresolvable", "url: its host does not resolve")
    return addresses
