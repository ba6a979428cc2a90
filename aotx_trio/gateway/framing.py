"""Requests that two readers could take two ways are refused before anything reads them.

* **Framing.**  A request carrying both ``Content-Length`` and
  ``Transfer-Encoding``, either twice, or a ``Content-Length`` list (``5, 5``) is
  the shape of request smuggling: two hops can disagree on where its body ends.
  h11 merges equal lengths, lets ``Transfer-Encoding`` win over a length and
  answers a doubled ``Transfer-Encoding`` 501; every such request is 400
  ``ambiguous_framing`` in the error envelope instead, with ``Connection:
  close``: on the raw header lines before h11 reads them
  (:mod:`aotx_trio.gateway.listen`), and here again on the ASGI headers (another
  server in front of the app).
* **Credentials and parameters.**  A request with two ``Authorization`` headers
  is 400 ``ambiguous_request`` (``header``), and so is a request of the shared API
  naming a query parameter twice (``parameter``; the router's routes refuse that
  themselves, 422 ``invalid_params``): which one counts would be a reader's
  choice.  (A JSON body naming a key twice in one object is 400
  ``malformed_json``, :func:`aotx_trio.gateway.routes_table.decode_json`.)
* **Paths.**  ``%2F`` in a request path is never a path separator: hypercorn
  decodes it to ``/`` before the app routes the path, so here the path is decoded
  again from the raw bytes with every ``%2F`` kept as it is (it then matches no
  row: 404, or a router target that names nothing).  ``//`` is not merged either
  (:func:`aotx_trio.gateway.app.create_app` turns werkzeug's merging off).

The outermost ASGI wrapper :func:`guard` applies these on every route, the fast
path included, in the dialect of the path's row (the router's invokes: ``"ok":
false``).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any
from urllib.parse import parse_qsl, unquote

from aotx_trio import errors
from aotx_trio.gateway.errors import render
from aotx_trio.gateway.fast import respond
from aotx_trio.gateway.routes_table import dialect_of
from aotx_trio.vocab import BASE_PATH

ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]
_SLASH = re.compile(rb"%2f", re.IGNORECASE)


def ambiguous(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether these headers frame a body ambiguously (see the module doc)."""
    lengths = codings = 0
    for name, value in headers:
        name = name.strip().lower()
        if name == b"content-length":
            lengths += len(value.split(b","))
        elif name == b"transfer-encoding":
            codings += 1
    return bool(lengths and codings) or lengths > 1 or codings > 1


def head_fields(head: bytes) -> list[tuple[bytes, bytes]]:
    """The header fields of a raw request head (request line first, no blank line)."""
    fields = []
    for line in re.split(rb"\r?\n", head)[1:]:
        if line[:1] not in (b" ", b"\t"):     # not an obs-fold continuation
            name, _, value = line.partition(b":")
            fields.append((name, value.strip()))
    return fields


def ambiguous_framing() -> errors.BadRequest:
    return errors.BadRequest("a request may carry Content-Length (one value) or "
                             "Transfer-Encoding, once, not both", code="ambiguous_framing")


def _refusal(scope: Any) -> errors.BadRequest | None:
    headers = list(scope.get("headers", []))
    if ambiguous(headers):
        return ambiguous_framing()
    if sum(1 for name, _ in headers if name.lower() == b"authorization") > 1:
        return errors.BadRequest("a request may carry one Authorization header",
                                 code="ambiguous_request", header="Authorization")
    path = str(scope.get("path", ""))
    if path == BASE_PATH or path.startswith(BASE_PATH + "/"):
        seen: set[str] = set()
        query = bytes(scope.get("query_string", b"")).decode("latin-1")
        for name, _ in parse_qsl(query, keep_blank_values=True):
            if name in seen:
                return errors.BadRequest(f"query parameter {name[:80]!r} is given twice",
                                         code="ambiguous_request", parameter=name[:80])
            seen.add(name)
    return None


def guard(app: ASGIApp) -> Callable[[Any, Any, Any], Coroutine[Any, Any, None]]:
    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            exc = _refusal(scope)
            if exc is not None:
                status, body, headers = render(exc, dialect_of(
                    str(scope.get("path", "")), scope.get("method")))
                await respond(send, status, body, {**headers, "Connection": "close"})
                return
            raw = scope.get("raw_path") or b""
            if _SLASH.search(raw):    # decoded again, each %2F kept as it is
                scope = {**scope, "path": "%2F".join(
                    unquote(part.decode("ascii", "replace")) for part in _SLASH.split(raw))}
        await app(scope, receive, send)

    return guarded
