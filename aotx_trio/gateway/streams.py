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
from aotx_trio.client import DeviceClient

Message = tuple[str, Any]
_GONE = (trio.BrokenResourceError, trio.ClosedResourceError)


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


def sse_response(body: AsyncIterator[bytes]) -> Response:
    """A ``text/event-stream`` response of ``body``: no caching, no proxy buffering,
    and no response timeout (the stream lives as long as the client reads it)."""
    response = Response(body, status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None
    return response
