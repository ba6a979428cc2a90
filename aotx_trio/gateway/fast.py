"""The ASGI fast path for the mutation routes (the hot routes of the benchmark).

A mutation through Quart costs a request context, the before/after-request
hooks, URL routing, a ``Request`` and a ``Response`` object; together more CPU
than the device and the journal spend on it.  :class:`FastMutations` wraps
the app's ``asgi_app`` and answers ``POST`` on exactly the mutation rows of
:data:`aotx_trio.gateway.routes_table.ROUTES` itself, running the same
functions as the Quart views generated from that table (the app's
:class:`~aotx_trio.gateway.routes_table.Admission`,
:func:`~aotx_trio.gateway.routes_table.submit`,
:func:`~aotx_trio.gateway.routes_table.encode`), so the checks, their order
and the bytes out are the same: 401, 429, 413, 403, 400, 422, then submit and
wait for the save (202 or 200), errors rendered by
:func:`aotx_trio.gateway.errors.render` in the row's dialect.

What is the fast path's own is the ASGI transport: the headers read from the
scope, the body read from ``receive``.  A body without ``Content-Length``
(chunked) is limited while it is read, as Quart does (413 ``body_too_large``);
a body that does not arrive within the body timeout is 408, as in Quart.
Everything else (other methods and routes, a malformed or repeated
``Content-Length``, both framings at once, a non-empty root path) goes to
Quart unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
from werkzeug.exceptions import RequestEntityTooLarge, RequestTimeout

from aotx_trio.errors import ClientGone
from aotx_trio.gateway.errors import render
from aotx_trio.gateway.routes_table import Admission, Route, encode, match, submit
from aotx_trio.service.client import DeviceClient

# ASGI (Quart's own asgi_app has its typed-dict signature; these are the loose forms)
Scope = Any
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


class FastMutations:
    """ASGI middleware: the mutation routes without Quart (see the module doc)."""

    def __init__(self, app: ASGIApp, client: DeviceClient, admission: Admission, *,
                 body_timeout: float = 30.0, retry_after_s: int = 1) -> None:
        self.app = app
        self.client = client
        self.admission = admission
        self.retry_after_s = retry_after_s
        self.body_timeout = body_timeout
        self.answered = 0   # requests this path answered itself (tests, diagnostics)
        self.queued_bodies = 0   # of them, bodies taken whole from the server's queue

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope.get("root_path"):
            await self.app(scope, receive, send)
            return
        found = match(scope["path"])
        if found is None:
            await self.app(scope, receive, send)
            return
        authorization: str | None = None
        content_type: str | None = None
        length: int | None = None
        chunked = False
        for name, value in scope["headers"]:
            name = name.lower()
            if name == b"authorization":
                if authorization is None:
                    authorization = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                length = -1 if length is not None or not value.isdigit() else int(value)
            elif name == b"transfer-encoding":
                chunked = True
        if chunked and length is not None:
            length = -1                            # both framings: let Quart decide
        if length is not None and length < 0:
            await self.app(scope, receive, send)   # odd Content-Length: Quart decides
            return
        limit = self.admission.limits[found[0].body]
        body_in = _Body(receive, limit, self.body_timeout, length)
        try:
            status, body, headers = await self._mutate(found, authorization, length,
                                                       content_type, scope, body_in.read)
        except ClientGone:
            return
        except Exception as exc:   # ours, or what Quart raises while reading a body
            status, body, headers = render(exc, found[0].dialect, self.retry_after_s, limit)
        if (length or chunked) and not body_in.complete:
            # answered before the body was read: close after this response (as the
            # Quart path does), the unread bytes cannot carry another request
            headers = {**headers, "Connection": "close"}
        self.answered += 1
        self.queued_bodies += body_in.queued
        await respond(send, status, body, headers)

    async def _mutate(self, found: tuple[Route, dict[str, str]],
                      authorization: str | None, length: int | None,
                      content_type: str | None, scope: Scope,
                      read_body: Callable[[], Awaitable[bytes]],
                      ) -> tuple[int, dict[str, Any] | bytes, dict[str, str]]:
        route, params = found
        principal = self.admission(route, authorization, length, content_type, scope)
        return await submit(self.client, principal, route, params, read_body)


class _Body:
    """One request's body from ASGI ``receive``, limited to ``max_bytes`` as it is read
    (413 without a ``Content-Length`` that said so), 408 after ``timeout`` seconds;
    ``complete`` once the whole body has arrived.  Messages the server has queued
    already are taken without a timer: hypercorn's ``receive`` is a trio memory
    channel's, so its ``receive_nowait`` is used while it has messages (any other
    ``receive`` is awaited, as the first message that is not queued yet)."""

    def __init__(self, receive: Receive, max_bytes: int, timeout: float,
                 length: int | None = None) -> None:
        self.receive = receive
        self.length = length
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.complete = False
        self.queued = False   # complete from messages already queued (no timer)
        self._size = 0
        self._nowait: Callable[[], Any] | None = getattr(
            getattr(receive, "__self__", None), "receive_nowait", None)

    async def read(self) -> bytes:
        chunks: list[bytes] = []
        if self._nowait is not None and self._queued(chunks):
            self.queued = True
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        with trio.move_on_after(self.timeout) as scope:
            while not self.complete:
                self._take(await self.receive(), chunks)
        if scope.cancelled_caught:
            raise RequestTimeout()
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _queued(self, chunks: list[bytes]) -> bool:
        """Take the messages already queued; True once the body is complete."""
        assert self._nowait is not None
        while not self.complete:
            try:
                message = self._nowait()
            except trio.WouldBlock:
                return False
            self._take(message, chunks)
        return True

    def _take(self, message: Any, chunks: list[bytes]) -> None:
        if message["type"] != "http.request":
            raise ClientGone
        chunk = message.get("body", b"")
        self._size += len(chunk)
        if self._size > self.max_bytes:   # no Content-Length said so up front
            raise RequestEntityTooLarge()
        chunks.append(chunk)
        # the declared length has arrived: the server (h11 keeps the framing) has
        # nothing after it but the end of the body
        self.complete = not message.get("more_body", False) or self._size == self.length


async def respond(send: Send, status: int, body: Any, headers: dict[str, str]) -> None:
    """One JSON response: :func:`aotx_trio.gateway.routes_table.encode` as ASGI messages."""
    data, pairs = encode(body, headers)
    raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs.items()]
    raw.append((b"content-length", str(len(data)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data, "more_body": False})
