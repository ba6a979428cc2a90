"""One budget of request-body bytes buffered across every connection.

Each request may carry up to ``limits.max_body_bytes``, and a body may take up
to the body timeout (30 s) to arrive; without a global bound, many slow
uploads together could hold that much memory each.  :class:`BodyBudget` is an
ASGI wrapper in front of both the fast path and Quart: before the app sees a
request with a body it reserves the body's declared ``Content-Length`` (or
the largest body limit for a chunked body, whose length is unknown: the
larger of ``max_body_bytes`` and ``max_media_bytes``) out of
``limits.max_buffered_body_bytes``, and gives it back when the app has
answered.  A request that does not fit is answered at once, before any body
byte is read, 503 ``body_budget_exhausted`` with ``Retry-After`` and
``Connection: close``.  A declared length over that largest limit reserves
nothing: the app answers it 413 without reading it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aotx_trio import errors
from aotx_trio.gateway.errors import render
from aotx_trio.gateway.fast import respond
from aotx_trio.gateway.routes_table import dialect_of

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class BodyBudget:
    def __init__(self, app: ASGIApp, *, budget: int, max_body_bytes: int,
                 retry_after_s: int = 1) -> None:
        self.app = app
        self.budget = budget
        self.max_body_bytes = max_body_bytes
        self.retry_after_s = retry_after_s
        self.reserved = 0
        self.refused = 0

    def need(self, headers: list[tuple[bytes, bytes]]) -> int:
        for name, value in headers:
            name = name.lower()
            if name == b"content-length":
                if not value.isdigit():
                    return 0                     # the app refuses it without reading
                n = int(value)
                return n if n <= self.max_body_bytes else 0
            if name == b"transfer-encoding":
                return self.max_body_bytes
        return 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        need = self.need(list(scope.get("headers", []))) if scope.get("type") == "http" else 0
        if need == 0:
            await self.app(scope, receive, send)
            return
        if self.reserved + need > self.budget:
            self.refused += 1
            exc = errors.NotReady(
                "the gateway is buffering its limit of request bodies; try again shortly",
                code="body_budget_exhausted", limit=self.budget)
            status, body, headers = render(exc, dialect_of(str(scope.get("path", ""))),
                                           self.retry_after_s)
            await respond(send, status, body, {**headers, "Connection": "close"})
            return
        self.reserved += need
        try:
            await self.app(scope, receive, send)
        finally:
            self.reserved -= need
