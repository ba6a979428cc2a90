"""Requests whose length is ambiguous are refused before anything reads them.

A request carrying both ``Content-Length`` and ``Transfer-Encoding`` (or either
twice) is the shape of request smuggling: two hops can disagree on where its
body ends.  h11 accepts it (``Transfer-Encoding`` wins); this outermost ASGI
wrapper answers it 400 ``ambiguous_framing`` in the error envelope instead,
on every route, the fast path included, and closes the connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aotx_trio import errors
from aotx_trio.gateway.errors import render
from aotx_trio.gateway.fast import respond

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def ambiguous(headers: list[tuple[bytes, bytes]]) -> bool:
    names = [k.lower() for k, _ in headers]
    cl, te = names.count(b"content-length"), names.count(b"transfer-encoding")
    return bool(cl and te) or cl > 1 or te > 1


def guard(app: ASGIApp) -> Callable[[Any, Any, Any], Coroutine[Any, Any, None]]:
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http" and ambiguous(list(scope.get("headers", []))):
            exc = errors.BadRequest("a request may carry Content-Length or "
                                    "Transfer-Encoding, once, not both",
                                    code="ambiguous_framing")
            status, body, headers = render(exc)
            await respond(send, status, body, {**headers, "Connection": "close"})
            return
        await app(scope, receive, send)

    return guarded
