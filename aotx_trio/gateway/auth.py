"""Bearer tokens -> principals, and the action check.

The gateway never stores a token: ``gateway.json`` holds ``token_sha256`` per
principal.  A request's token is hashed once and compared with every
principal's digest using :func:`hmac.compare_digest` (all of them, always, so
timing tells nothing about which one matched).  A digest that matched is then
remembered (digest -> principal, at most one entry per principal), so later
requests with the same token cost one SHA-256 and one dict lookup; the lookup
is keyed by the digest, which an attacker cannot steer, so its timing tells
nothing about the stored digests either.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from aotx_trio import errors
from aotx_trio.config import token_sha256
from aotx_trio.errors import Unauthorized
from aotx_trio.vocab import SHARED_ACTIONS  # noqa: F401  (re-exported)


class PrincipalEntry(Protocol):
    """What auth needs of a ``gateway.json`` principal (aotx_trio.config)."""

    @property
    def name(self) -> str: ...
    @property
    def token_sha256(self) -> str: ...
    @property
    def actions(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class Principal:
    name: str
    actions: tuple[str, ...]

    def require(self, action: str) -> None:
        if action not in self.actions:
            raise errors.Forbidden(f"principal {self.name!r} lacks the {action} action",
                                   action=action)


hash_token = token_sha256
"""The hex SHA-256 of a bearer token (:func:`aotx_trio.config.token_sha256`)."""


def new_token() -> str:
    """A fresh admin/bearer token (256 bits, URL-safe)."""
    return "aotx_" + secrets.token_urlsafe(32)


class Authenticator:
    def __init__(self, principals: Iterable[PrincipalEntry]) -> None:
        self._table: list[tuple[bytes, Principal]] = []
        self._known: dict[bytes, Principal] = {}
        self.reload(principals)

    def reload(self, principals: Iterable[PrincipalEntry]) -> None:
        """Replace the principals (SIGHUP): a removed or changed token stops working
        at once; every holder of this authenticator sees the new table."""
        table: list[tuple[bytes, Principal]] = []
        for p in principals:
            digest = bytes.fromhex(p.token_sha256)
            if len(digest) != 32:
                raise errors.ConfigError(f"principal {p.name!r}: token_sha256 must be 64 hex "
                                         "digits", field="token_sha256")
            table.append((digest, Principal(p.name, tuple(p.actions))))
        self._table, self._known = table, {}

    def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise Unauthorized("missing Authorization header (use: Bearer <token>)")
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or len(token.split()) != 1:
            raise Unauthorized("malformed Authorization header (use: Bearer <token>)")
        digest = hashlib.sha256(token.encode("utf-8")).digest()
        found = self._known.get(digest)
        if found is not None:
            return found
        for stored, principal in self._table:
            if hmac.compare_digest(stored, digest) and found is None:
                found = principal
        if found is None:
            raise Unauthorized("unknown bearer token")
        self._known[digest] = found
        return found
