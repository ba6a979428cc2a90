"""What the gateway asks of hypercorn below the app: a connection limit, no h2c unless
configured, and hypercorn's own error answers in the error envelope.

hypercorn (0.18; pinned to that minor version in pyproject.toml, since
nothing below is public API: tests/test_gateway_connections.py checks the swap
takes effect) has no connection limit, accepts cleartext HTTP/2 (the
``PRI * HTTP/2.0`` preface and ``Upgrade: h2c``), and answers a request h11
cannot parse with an empty 400.  Its trio worker builds one ``TCPServer`` per
accepted connection and one ``H11Protocol`` per HTTP/1 connection, looked up
by name in their modules; :func:`install` puts subclasses there that do
exactly what the hypercorn :class:`~hypercorn.config.Config` they run under
asks through the attributes :func:`configure` sets, and otherwise behave as
hypercorn's own (a Config without them, e.g. another server in the same
process, sees no change):

* ``aotx_gate`` (:class:`ConnectionGate`): at most ``limit`` connections are
  served at once; a connection accepted beyond it is answered at once with
  503 ``too_many_connections`` (the envelope, ``Retry-After``,
  ``Connection: close``) and closed, so an excess connection costs one
  accept and one write, never a held slot.
* ``aotx_h2c`` False: the HTTP/2 preface is answered 505
  ``http2_not_enabled`` and the connection closed; an ``Upgrade: h2c`` header is
  ignored (the request is served as HTTP/1.1, as RFC 9110 allows).
* ``aotx_envelope`` True: h11's own 4xx (malformed request line or headers,
  headers over ``h11_max_incomplete_size``) carry the error envelope; a request
  head that frames its body ambiguously
  (:func:`aotx_trio.gateway.framing.ambiguous`: a doubled or listed
  ``Content-Length``, a doubled ``Transfer-Encoding``, both) is refused on its raw
  header lines, before h11 merges or rejects them, 400 ``ambiguous_framing``.
* ``aotx_body_limit`` (``(method, path) -> bytes``, the route's body limit): a
  request with ``Expect: 100-continue`` whose declared ``Content-Length`` is over
  it is not sent ``100 Continue``; the app's admit step answers it 413 without
  the body ever being invited.
* with ``aotx_gate`` set, the end of a response always reaches the connection:
  hypercorn ends a request's stream (restarting the keep-alive timer, or closing
  the connection after ``Connection: close``) from the app's own task, right
  after it has told the app ``http.disconnect``; quart-trio cancels that task's
  nursery on that message, so the timer start and the close were cancelled and
  a connection answered by Quart stayed open for ever.  That step runs shielded
  here (it only sends bytes and starts the timer), so ``keep_alive_timeout_s``
  and ``Connection: close`` hold on every route.  Its close takes the send lock
  its writes take (hypercorn's sends the EOF outside it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

import h11
import hypercorn.protocol as hyper_protocol
import hypercorn.trio.run as hyper_run
import trio
from h11._readers import READERS
from hypercorn.config import Config as HyperConfig
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.utils import parse_socket_addr

from aotx_trio.errors import AotxError, H2cRefused
from aotx_trio.gateway import framing
from aotx_trio.gateway.errors import dumps

log = logging.getLogger("aotx.gateway")

_CODES = {400: "bad_request", 405: "method_not_allowed", 413: "body_too_large",
          414: "uri_too_long", 431: "headers_too_large", 501: "not_implemented",
          503: "too_many_connections", 505: "http2_not_enabled"}
_MESSAGES = {400: "malformed HTTP request", 431: "request headers are too large",
             414: "request target is too long",
             503: "too many connections; try again shortly",
             505: "HTTP/2 without TLS (h2c) is not enabled on this gateway"}


def envelope(status: int, refusal: AotxError | None = None) -> bytes:
    code = _CODES.get(status, f"http_{status}")
    body: dict[str, Any] = {"code": code, "message": _MESSAGES.get(status, code)}
    if refusal is not None:
        body = refusal.envelope()["error"]
    if status == 503:
        body["retry_after"] = 1
    return dumps({"error": body}).encode("utf-8")


def raw_response(status: int, reason: bytes) -> bytes:
    """A whole HTTP/1.1 error response with the envelope, closing the connection."""
    body = envelope(status)
    head = [b"HTTP/1.1 %d %s" % (status, reason), b"content-type: application/json",
            b"cache-control: no-store", b"connection: close",
            b"content-length: %d" % len(body)]
    if status == 503:
        head.append(b"retry-after: 1")
    return b"\r\n".join(head) + b"\r\n\r\n" + body


class ConnectionGate:
    """At most ``limit`` connections at once (``limits.max_connections``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0

    def enter(self) -> bool:
        if self.open >= self.limit:
            self.refused += 1
            return False
        self.open += 1
        return True

    def leave(self) -> None:
        self.open -= 1


class _TCPServer(TCPServer):
    async def run(self) -> None:
        gate: ConnectionGate | None = getattr(self.config, "aotx_gate", None)
        if gate is None:
            await super().run()
            return
        if not gate.enter():
            await _refuse(self.stream)
            return
        closed: Callable[[Any], None] | None = getattr(self.config, "aotx_closed", None)
        peer = _peer(self.stream) if closed is not None else None
        try:
            await super().run()
        finally:
            gate.leave()
            if closed is not None and peer is not None:
                closed(peer)

    async def _close(self) -> None:
        # hypercorn sends the EOF outside its send lock: a close (the client left
        # mid-request) racing the app's last write raised BusyResourceError there
        if getattr(self.config, "aotx_gate", None) is None or \
                self.send_lock.statistics().owner is trio.lowlevel.current_task():
            await super()._close()
            return
        with trio.move_on_after(2.0, shield=True):
            async with self.send_lock:
                await super()._close()
                return
        await super()._close()   # the lock was not free in time: close all the same

    async def _read_data(self) -> None:
        await super()._read_data()
        if getattr(self.config, "aotx_gate", None) is not None:
            # the client closed: hypercorn would keep the connection (and its slot)
            # until the keep-alive timer ends; nothing can arrive any more
            await self.idle_task.stop()


def _peer(stream: Any) -> Any:
    """The peer of a connection as hypercorn puts it in the ASGI scope (``client``)."""
    sock = getattr(getattr(stream, "transport_stream", stream), "socket", None)
    try:
        return None if sock is None else parse_socket_addr(sock.family, sock.getpeername())
    except OSError:
        return None


async def _refuse(stream: Any) -> None:
    with trio.move_on_after(2.0):
        try:
            await stream.send_all(raw_response(503, b"Service Unavailable"))
            await stream.send_eof()
            # read what the client already sent, briefly, so the close is not a reset
            with trio.move_on_after(0.2):
                while await stream.receive_some(65536):
                    pass
        except (trio.BrokenResourceError, trio.ClosedResourceError, AttributeError,
                OSError):
            pass
    with trio.CancelScope(shield=True):
        await stream.aclose()


_READ_REQUEST: Callable[[Any], Any] = READERS[(h11.CLIENT, h11.IDLE)]  # type: ignore[assignment]


class _Connection(h11.Connection):
    """h11's server connection with the request head's framing checked on its raw
    lines first (h11 would merge or reject what :func:`framing.ambiguous` refuses)."""

    refusal: AotxError | None = None

    def _get_io_object(self, role: Any, event: Any, io_dict: Any) -> Any:
        io = super()._get_io_object(role, event, io_dict)
        return self._read_request if io is _READ_REQUEST else io

    def _read_request(self, buf: Any) -> Any:
        data = bytes(buf)
        found = _BLANK_LINE.search(data)
        if found is not None and framing.ambiguous(framing.head_fields(data[:found.start()])):
            self.refusal = framing.ambiguous_framing()
            raise h11.RemoteProtocolError(self.refusal.message, error_status_hint=400)
        return _READ_REQUEST(buf)


_BLANK_LINE = re.compile(rb"\n\r?\n")   # the end of a head, as h11 finds it


class _H11Protocol(H11Protocol):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.request: h11.Request | None = None
        if getattr(self.config, "aotx_envelope", False):
            self.connection = _Connection(
                h11.SERVER, max_incomplete_event_size=self.config.h11_max_incomplete_size)

    async def _check_protocol(self, event: h11.Request) -> None:
        self.request = event
        if getattr(self.config, "aotx_h2c", True):
            await super()._check_protocol(event)
            return
        # h2c off: the preface is refused below (the app never sees it: its method
        # PRI reaches no route); an Upgrade: h2c header is simply not acted on
        if event.method == b"PRI" and event.target == b"*":
            await self._send_error_response(505)
            raise H2cRefused

    async def stream_send(self, event: Any) -> None:
        if isinstance(event, StreamClosed) and getattr(self.config, "aotx_gate", None):
            # see the module doc: the app's task may be cancelled already
            with trio.CancelScope(shield=True):
                await super().stream_send(event)
            return
        await super().stream_send(event)

    async def handle(self, event: Any) -> None:
        try:
            await super().handle(event)
        except H2cRefused:
            from hypercorn.events import Closed
            await self.send(Closed())

    async def _send_h11_event(self, event: Any) -> None:
        if isinstance(event, h11.InformationalResponse) and event.status_code == 100 \
                and self._over_limit():
            return   # the admit step answers 413; the body is not invited
        await super()._send_h11_event(event)

    def _over_limit(self) -> bool:
        limit_of: Callable[[str, str], int] | None = getattr(self.config, "aotx_body_limit",
                                                             None)
        if limit_of is None or self.request is None:
            return False
        length = next((v for k, v in self.request.headers if k == b"content-length"), None)
        path = unquote(self.request.target.partition(b"?")[0].decode("ascii", "replace"))
        return length is not None and int(length) > limit_of(
            self.request.method.decode("ascii"), path)

    async def _send_error_response(self, status_code: int) -> None:
        if not getattr(self.config, "aotx_envelope", False):
            await super()._send_error_response(status_code)
            return
        body = envelope(status_code, getattr(self.connection, "refusal", None))
        headers = [(b"content-type", b"application/json"), (b"cache-control", b"no-store"),
                   (b"content-length", str(len(body)).encode("ascii")),
                   (b"connection", b"close"), *self.config.response_headers("h11")]
        await self._send_h11_event(h11.Response(status_code=status_code, headers=headers))
        await self._send_h11_event(h11.Data(data=body))
        await self._send_h11_event(h11.EndOfMessage())


def install() -> None:
    """Put the subclasses where hypercorn's trio worker looks them up (idempotent)."""
    vars(hyper_run)["TCPServer"] = _TCPServer
    vars(hyper_protocol)["H11Protocol"] = _H11Protocol


def configure(hc: HyperConfig, *, max_connections: int, h2c: bool,
              body_limit: Callable[[str, str], int] | None = None,
              closed: Callable[[Any], None] | None = None) -> ConnectionGate:
    """Ask the servers of ``hc`` for the limit, the h2c choice, the envelope, (with
    ``body_limit``) no ``100 Continue`` for a body over its route's limit, and (with
    ``closed``) a call with the peer (the ASGI scope's ``client``) of every
    connection that closes (:class:`aotx_trio.gateway.quota.Holdings`)."""
    install()
    gate = ConnectionGate(max_connections)
    hc.aotx_closed = closed   # type: ignore[attr-defined]
    hc.aotx_body_limit = body_limit   # type: ignore[attr-defined]
    hc.aotx_gate = gate        # type: ignore[attr-defined]
    hc.aotx_h2c = h2c          # type: ignore[attr-defined]
    hc.aotx_envelope = True    # type: ignore[attr-defined]
    return gate
