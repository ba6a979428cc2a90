"""Server-sent events of the shared-conversations API.

``GET /operations/{op}/events`` always streams (``text/event-stream``): the
operation's output bytes by byte cursor as the runtime produces them, then
one ``end`` event with the terminal receipt.  Each event's ``id`` is
``{op}/{next byte offset}``; a reconnect with ``Last-Event-ID`` (and no
explicit ``?offset=``) resumes exactly after the last byte it got, so every
byte arrives exactly once across reconnects.  Idle streams get a comment
line every ``limits.sse_keepalive_s`` seconds (proxies keep them open).

The runtime side is the ``operation.watch`` stream of the device client (in
process or over the service socket's push frames); the response body reads the
subscription's own bounded buffer of ``limits.sse_queue_depth`` events
directly (:func:`aotx_trio.gateway.streams.open_feed`: no pump task between
them); a subscriber that falls further behind is dropped with a final
``dropped`` event naming why (``slow_consumer``).  When the body wakes it
sends every event already buffered as one chunk, and each event the runtime
pushed to many subscribers is rendered to SSE bytes once for all of them.  The
visibility check runs when the stream opens, before the response starts (an
unknown or invisible operation is the plain 404 envelope), and again on every
push; a failure after the start ends the stream with an ``error`` event
carrying the error envelope's object.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio
from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import dumps
from aotx_trio.gateway.streams import Feed, open_feed, sse_response
from aotx_trio.service.client import DeviceClient
from aotx_trio.service.pushed import Pushed
from aotx_trio.service.wire import SLOW_CONSUMER
from aotx_trio.vocab import is_decimal

log = logging.getLogger("aotx.gateway")

DEFAULT_KEEPALIVE_S = 15.0
DEFAULT_QUEUE_DEPTH = 256


def _json(data: Any) -> bytes:
    return dumps(data).encode("utf-8")


def _event(kind: str, data: Any, event_id: str | None = None) -> bytes:
    """One SSE event; an item the runtime pushed to many subscribers (``Pushed``) is
    JSON-encoded once for all of them."""
    body = data.encoded("sse", _json) if isinstance(data, Pushed) else _json(data)
    head = f"event: {kind}\ndata: " if event_id is None else \
        f"id: {event_id}\nevent: {kind}\ndata: "
    return head.encode("utf-8") + body + b"\n\n"


def _shared(data: Any, kind: str, event_id: str) -> bytes:
    """The whole SSE event of ``data``; an item the runtime pushed to many subscribers
    (``Pushed``: one conversation's or operation's, so one ``event_id`` for all of them)
    is rendered once and its bytes are shared by every subscriber."""
    if not isinstance(data, Pushed):
        return _event(kind, data, event_id)
    return data.encoded(f"sse-event {kind} {event_id}", lambda d: _event(kind, d, event_id))


def _resume(resource: str, arg: str, what: str) -> int:
    """The cursor: ``?<arg>=`` if given, else the one ``Last-Event-ID`` names
    (``{resource}/{cursor}``), else 0."""
    raw = request.args.get(arg)
    if raw is None:
        last = request.headers.get("Last-Event-ID", "")
        head, slash, tail = last.rpartition("/")
        if slash and head == resource and is_decimal(tail):
            return int(tail)
        return 0
    if not is_decimal(raw):
        raise errors.InvalidInput(f"{arg} must be a non-negative {what}", field=arg)
    return int(raw)


def _stream_config() -> tuple[int, float, Any]:
    depth = int(current_app.config.get("AOTX_SSE_QUEUE_DEPTH", DEFAULT_QUEUE_DEPTH))
    keepalive = float(current_app.config.get("AOTX_SSE_KEEPALIVE_S", DEFAULT_KEEPALIVE_S))
    return depth, keepalive, current_app.config.get("AOTX_METRICS")


def _sse(feed: Feed, keepalive: float, own: Any, greeting: bytes,
         frame_of: Callable[[Any], bytes]) -> Response:
    """The SSE response of ``feed`` through ``frame_of`` (keepalive comments when idle;
    the slow-consumer drop and errors as final events).  Every message buffered when
    the body wakes goes out in one chunk (one send, not one per event)."""

    def frame(kind: str, value: Any) -> bytes:
        if kind == "item":
            return frame_of(value)
        if kind == "stop" and value == SLOW_CONSUMER:
            if own is not None:
                own.sse_dropped.labels(SLOW_CONSUMER).inc()
            return _event("dropped", {"reason": SLOW_CONSUMER})
        if kind == "error":
            return _event("error", value.envelope()["error"])
        return b""          # "stop" for another reason: the stream ends

    async def body() -> AsyncIterator[bytes]:
        if own is not None:
            own.sse_subscribers.inc()
        try:
            yield greeting
            while not feed.ended:
                with trio.move_on_after(keepalive) as idle:
                    messages = await feed.batch()
                if idle.cancelled_caught:
                    yield b": keepalive\n\n"
                    continue
                data = b"".join([frame(kind, value) for kind, value in messages])
                if data:
                    yield data
        finally:
            feed.close()
            if own is not None:
                own.sse_subscribers.dec()

    return sse_response(body())


async def operation_events(client: DeviceClient, principal: Principal,
                           operation: str) -> Response:
    """The SSE response of ``GET /operations/{op}/events`` (see the module doc)."""
    principal.require("shared_read")
    params = {"principal": principal.name, "actions": list(principal.actions),
              "operation": operation, "offset": _resume(operation, "offset", "byte offset")}
    depth, keepalive, own = _stream_config()
    _, feed = await open_feed(client, "operation.watch", params, depth)

    def frame_of(value: Any) -> bytes:
        if "end" in value:
            total = value["receipt"]["result"]["bytes"]   # a resume gets the end only
            return _event("end", {"status": value["end"], "receipt": value["receipt"]},
                          f"{operation}/{total}")
        return _shared(value, "output", f"{operation}/{value['next_offset']}")

    return _sse(feed, keepalive, own, b": aotx operation events\n\n", frame_of)


async def conversation_events(client: DeviceClient, principal: Principal,
                              conversation: str) -> Response:
    """``GET /conversations/{con}/events?stream=true``: one ``input`` event per saved
    input in input order (id ``{con}/{cursor}``), and one ``gap`` event per run of
    retired cursors the stream passes, before the inputs after it (id
    ``{con}/{last}``; runtime/conv_events.py)."""
    principal.require("shared_read")
    cursor = _resume(conversation, "cursor", "input-order cursor")
    params = {"principal": principal.name, "actions": list(principal.actions),
              "conversation": conversation, "cursor": str(cursor)}
    depth, keepalive, own = _stream_config()
    _, feed = await open_feed(client, "conversation.watch", params, depth)
    greeting = b": aotx conversation events\n\n"

    def frame_of(value: Any) -> bytes:
        if value.get("gap"):
            return _event("gap", {k: v for k, v in value.items() if k != "gap"},
                          f"{conversation}/{value['last']}")
        return _shared(value, "input", f"{conversation}/{value['cursor']}")

    return _sse(feed, keepalive, own, greeting, frame_of)
