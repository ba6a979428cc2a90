"""A device-client stream feeding an HTTP streaming response.

:func:`open_stream` opens ``client.subscribe(method, params)`` in a pump task
in the app's nursery (quart-trio cancels it at shutdown) and hands the
response body a bounded channel of ``("item", value)``, then one ``("stop",
end reason)`` or ``("error", AotxError)``.  Open errors (unknown, invisible,
forbidden) raise from :func:`open_stream` itself, before any byte of the
response; a body that stops reading (the HTTP client left) closes the
channel, which ends the pump and so cancels the stream at the runtime.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import trio
from quart import Response, current_app

from aotx_trio import errors
from aotx_trio._process import leaves
from aotx_trio.service.client import DeviceClient, Subscription

Message = tuple[str, Any]
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)
BATCH = 64          # messages one body chunk carries at most (Feed.batch)


async def open_stream(client: DeviceClient, method: str, params: dict[str, Any],
                      depth: int) -> tuple[Any, trio.MemoryReceiveChannel[Message]]:
    """(the stream's open value, the channel its messages arrive on)."""
    send, receive = trio.open_memory_channel[Message](depth)

    async def pump(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        async with send:
            try:
                async with client.subscribe(method, params, buffer=depth) as sub:
                    task_status.started(sub.opened)
                    started = True
                    async for item in sub:
                        await send.send(("item", item))
                    await send.send(("stop", sub.end_reason))
            except (BaseExceptionGroup, errors.AotxError, *_GONE) as exc:
                if not started:
                    raise
                found = list(leaves(exc))
                if any(not isinstance(e, (errors.AotxError, *_GONE)) for e in found):
                    raise
                failure = next((e for e in found if isinstance(e, errors.AotxError)), None)
                if failure is not None:
                    with contextlib.suppress(*_GONE, trio.WouldBlock):
                        send.send_nowait(("error", failure))

    nursery: trio.Nursery = current_app.nursery   # type: ignore[attr-defined]
    opened = await nursery.start(pump)
    return opened, receive


async def open_streams(client: DeviceClient, method: str, params: list[dict[str, Any]],
                       depth: int) -> tuple[list[Any], trio.MemoryReceiveChannel[
                           tuple[int, str, Any]]]:
    """:func:`open_stream` of each of ``params`` (in order; one that fails to open
    closes those already open and raises), merged into one channel of ``(index, kind,
    value)`` by a forwarder per stream in the app's nursery.  Closing the merged channel
    closes every stream."""
    opened: list[Any] = []
    channels: list[trio.MemoryReceiveChannel[Message]] = []
    try:
        for p in params:
            value, channel = await open_stream(client, method, p, depth)
            opened.append(value)
            channels.append(channel)
    except BaseException:
        for channel in channels:
            channel.close()
        raise
    send, merged = trio.open_memory_channel[tuple[int, str, Any]](depth)

    async def forward(i: int, channel: trio.MemoryReceiveChannel[Message],
                      out: trio.MemorySendChannel[tuple[int, str, Any]]) -> None:
        async with out, channel:
            with contextlib.suppress(*_GONE):
                async for kind, value in channel:
                    await out.send((i, kind, value))

    nursery: trio.Nursery = current_app.nursery   # type: ignore[attr-defined]
    async with send:
        for i, channel in enumerate(channels):
            nursery.start_soon(forward, i, channel, send.clone())
    return opened, merged


class Feed:
    """The messages of one open subscription, read by the response body itself (no
    pump hop between the subscription and the body): :meth:`batch` waits for the next
    message and returns it together with every one already buffered, so a subscriber
    that is behind gets them in one body chunk (one send)."""

    def __init__(self, sub: Subscription, done: trio.Event) -> None:
        self._sub = sub
        self._done = done
        self.failure: errors.AotxError | None = None   # the subscription's own exit
        self.ended = False

    def _end(self) -> Message:
        self.ended = True
        failure = self._sub.error or self.failure
        if failure is not None:
            return ("error", failure)
        return ("stop", self._sub.end_reason)

    async def batch(self, limit: int = BATCH) -> list[Message]:
        """The next message and every one ready behind it (at most ``limit``); the last
        of a stream is ``("stop", reason)`` or ``("error", AotxError)``; ``[]`` after
        that."""
        if self.ended:
            return []
        out: list[Message] = []
        try:
            out.append(("item", await self._sub.__anext__()))
            while len(out) < limit:
                out.append(("item", self._sub.next_nowait()))
        except trio.WouldBlock:
            pass
        except StopAsyncIteration:
            out.append(self._end())
        except errors.AotxError as exc:
            self.ended = True
            out.append(("error", exc))
        return out

    def close(self) -> None:
        """The body is done: end the subscription (which cancels it at the runtime)."""
        self.ended = True
        self._done.set()


async def open_feed(client: DeviceClient, method: str, params: dict[str, Any],
                    depth: int) -> tuple[Any, Feed]:
    """(the stream's open value, its :class:`Feed`): like :func:`open_stream`, but a
    task in the app's nursery only holds the subscription open until the body calls
    :meth:`Feed.close`; the body reads the subscription's own bounded buffer
    (``depth`` items; a subscriber further behind is dropped, ``slow_consumer``)."""
    done = trio.Event()

    async def hold(task_status: trio.TaskStatus[Feed] = trio.TASK_STATUS_IGNORED) -> None:
        feed: Feed | None = None
        try:
            async with client.subscribe(method, params, buffer=depth) as sub:
                feed = Feed(sub, done)
                task_status.started(feed)
                await done.wait()
        except (BaseExceptionGroup, errors.AotxError, *_GONE) as exc:
            if feed is None:
                raise
            found = list(leaves(exc))
            if any(not isinstance(e, (errors.AotxError, *_GONE)) for e in found):
                raise
            feed.failure = next((e for e in found if isinstance(e, errors.AotxError)), None)
        finally:
            if feed is not None:       # the body, still reading, ends next
                feed._sub.close()

    nursery: trio.Nursery = current_app.nursery   # type: ignore[attr-defined]
    feed: Feed = await nursery.start(hold)
    return feed._sub.opened, feed


def sse_response(body: AsyncIterator[bytes]) -> Response:
    """A ``text/event-stream`` response of ``body``: no caching, no proxy buffering,
    and no response timeout (the stream lives as long as the client reads it)."""
    response = Response(body, status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None
    return response
