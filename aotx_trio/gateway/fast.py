"""The ASGI fast path for the five mutation routes (the hot routes of the benchmark).

A mutation through Quart costs a request context, the before/after-request
hooks, URL routing, a ``Request`` and a ``Response`` object; together more CPU
than the device and the journal spend on it.  :class:`FastMutations` wraps
the app's ``asgi_app`` and answers ``POST`` on exactly these routes itself::

    POST /aotx/v1/shared/participant                      participant.register
    POST /aotx/v1/shared/spaces                           space.create
    POST /aotx/v1/shared/spaces/<space>/members           member.set
    POST /aotx/v1/shared/spaces/<space>/conversations     conversation.create
    POST /aotx/v1/shared/participant/retirements          participant.retire

with the same steps in the same order as the Quart route (authenticate: 401;
body length over the limit: 413; the route's action: 403; strict UTF-8 and
JSON: 400; the model: 400/422; submit and wait for the save: 202 or 200) and
the same bytes out: ``application/json``, ``Cache-Control: no-store``,
``Location`` of the operation, the error envelope of
:mod:`aotx_trio.gateway.errors`.  A body without ``Content-Length`` (chunked)
is limited while it is read, as Quart does (413 ``body_too_large``); a body
that does not arrive within the body timeout is 408, as in Quart.  Everything
else (other methods and routes, a malformed or repeated ``Content-Length``, a
non-empty root path) goes to Quart unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge, RequestTimeout

from aotx_trio import errors
from aotx_trio.client import DeviceClient
from aotx_trio.gateway.auth import Authenticator
from aotx_trio.gateway.errors import (
    INTERNAL_ERROR,
    BodyTooLarge,
    dumps,
    error_parts,
    http_error_parts,
)
from aotx_trio.gateway.models import (
    CreateConversation,
    CreateSpace,
    Mutation,
    RegisterParticipant,
    Retirement,
    SetMember,
)
from aotx_trio.gateway.shared_routes import BASE, submit_mutation

log = logging.getLogger("aotx.gateway")

# ASGI (Quart's own asgi_app has its typed-dict signature; these are the loose forms)
Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]

Route = tuple[str, type[Mutation], str]   # (kind, body model, gateway action)

_FIXED: dict[str, Route] = {
    BASE + "/participant": ("participant.register", RegisterParticipant, "shared_write"),
    BASE + "/spaces": ("space.create", CreateSpace, "shared_write"),
    BASE + "/participant/retirements": ("participant.retire", Retirement, "shared_write"),
}
_IN_SPACE: dict[str, Route] = {
    "members": ("member.set", SetMember, "shared_manage"),
    "conversations": ("conversation.create", CreateConversation, "shared_write"),
}
_SPACES = BASE + "/spaces/"
_JSON = b"application/json"


def match(path: str) -> tuple[Route, dict[str, str]] | None:
    """The mutation route of ``path`` and its path parameters, or None."""
    route = _FIXED.get(path)
    if route is not None:
        return route, {}
    if path.startswith(_SPACES):
        space, slash, tail = path[len(_SPACES):].partition("/")
        if space and slash and tail in _IN_SPACE:
            return _IN_SPACE[tail], {"space": space}
    return None


class FastMutations:
    """ASGI middleware: the mutation routes without Quart (see the module doc)."""

    def __init__(self, app: ASGIApp, client: DeviceClient, auth: Authenticator, *,
                 max_body_bytes: int, body_timeout: float = 30.0) -> None:
        self.app = app
        self.client = client
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.answered = 0   # requests this path answered itself (tests, diagnostics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        found = match(scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        authorization: str | None = None
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"authorization":
                if authorization is None:
                    authorization = value.decode("latin-1")
            elif name == b"content-length":
                length = -1 if length is not None or not value.isdigit() else int(value)
            elif name == b"transfer-encoding":
                chunked = True
        if chunked and length is not None:
            length = -1                            # both framings: let Quart decide
        if length is not None and length < 0:
            await self.app(scope, receive, send)   # odd Content-Length: Quart decides
            return
        try:
            status, body, headers = await self._mutate(found, authorization, length, receive)
        except _Disconnected:
            return
        except errors.AotxError as exc:
            status, body, headers = error_parts(exc)
        except HTTPException as exc:   # what Quart raises while reading a body
            status, body, headers = http_error_parts(exc, (self.max_body_bytes,))
        except Exception as exc:
            log.error("unhandled error", exc_info=exc)
            status, body, headers = 500, INTERNAL_ERROR, {}
        self.answered += 1
        await respond(send, status, body, headers)

    async def _mutate(self, found: tuple[Route, dict[str, str]], authorization: str | None,
                      length: int | None, receive: Receive,
                      ) -> tuple[int, dict[str, Any], dict[str, str]]:
        (kind, model, action), path = found
        principal = self.auth.authenticate(authorization)
        if length is not None and length > self.max_body_bytes:
            raise BodyTooLarge(f"request body of {length} bytes is over the limit of "
                               f"{self.max_body_bytes}", limit=self.max_body_bytes)
        principal.require(action)
        raw = await self._read_body(receive)
        return await submit_mutation(self.client, principal, kind, model, raw, path)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self.body_timeout) as scope:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    raise _Disconnected
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self.max_body_bytes:   # no Content-Length said so up front
                    raise RequestEntityTooLarge()
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if scope.cancelled_caught:
            raise RequestTimeout()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class _Disconnected(Exception):
    """The client went away before its body arrived: nothing to answer."""


async def respond(send: Send, status: int, body: Any, headers: dict[str, str]) -> None:
    """One JSON response with the gateway's headers (as ``json_response`` makes them)."""
    data = dumps(body).encode("utf-8")
    raw = [(b"content-type", _JSON), (b"content-length", str(len(data)).encode()),
           (b"cache-control", b"no-store")]
    for k, v in headers.items():
        raw.append((k.lower().encode("latin-1"), v.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})
