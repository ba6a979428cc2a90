"""gateway/streams.py's Feed: the SSE body reads the subscription itself and gets every
buffered message in one batch (one body chunk); the end reason, the slow-consumer drop
and errors come last, exactly once."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from aotx_trio import errors
from aotx_trio.gateway.streams import Feed
from aotx_trio.service.client import InProcessClient

pytestmark = pytest.mark.timeout(30)


class Handler:
    """Streams ``n`` items at once (no pause), then ends as ``end`` says."""

    def __init__(self) -> None:
        self.closed = trio.Event()

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def open_stream(self, method: str, params: dict[str, Any],
                          ) -> tuple[Any, AsyncIterator[Any]]:
        return {"stream": method}, self._items(params["n"], params.get("end"))

    async def _items(self, n: int, end: str | None) -> AsyncIterator[Any]:
        try:
            for i in range(n):
                yield {"i": i}
            if end == "error":
                raise errors.JournalHold("hold", code="journal_hold", hold=["disk"])
            if end == "dropped":
                raise errors.OverCapacity("fell behind", code="slow_consumer")
            if end == "forever":
                await trio.sleep_forever()
        finally:
            self.closed.set()


async def _batches(params: dict[str, Any], buffer: int, limit: int = 64,
                   ) -> tuple[Handler, list[list[tuple[str, Any]]]]:
    handler = Handler()
    out: list[list[tuple[str, Any]]] = []
    async with InProcessClient(handler).subscribe("s", params, buffer=buffer) as sub:
        await trio.testing.wait_all_tasks_blocked()     # everything pushed is buffered
        feed = Feed(sub, trio.Event())
        while not feed.ended:
            with trio.fail_after(5):
                out.append(await feed.batch(limit))
        assert await feed.batch() == []
    return handler, out


async def test_everything_buffered_comes_in_one_batch_then_the_end() -> None:
    _, got = await _batches({"n": 5}, buffer=8)
    assert got == [[*[("item", {"i": i}) for i in range(5)], ("stop", "complete")]]


async def test_a_batch_holds_at_most_limit_messages_in_order() -> None:
    _, got = await _batches({"n": 5}, buffer=8, limit=2)
    assert [len(b) for b in got] == [2, 2, 2]
    assert [m for b in got for m in b] == [*[("item", {"i": i}) for i in range(5)],
                                          ("stop", "complete")]


async def test_a_full_buffer_drops_the_subscriber_as_a_slow_consumer() -> None:
    _, got = await _batches({"n": 5}, buffer=2)
    assert got == [[("item", {"i": 0}), ("item", {"i": 1}), ("stop", "slow_consumer")]]
    _, got = await _batches({"n": 1, "end": "dropped"}, buffer=8)   # the runtime dropped it
    assert got == [[("item", {"i": 0}), ("stop", "slow_consumer")]]


async def test_an_error_comes_last_after_what_was_pushed() -> None:
    _, got = await _batches({"n": 2, "end": "error"}, buffer=8)
    assert [m[0] for m in got[0]] == ["item", "item", "error"]
    assert isinstance(got[0][2][1], errors.JournalHold)


async def test_a_waiting_batch_wakes_for_the_next_item_and_close_ends_it() -> None:
    handler = Handler()
    async with InProcessClient(handler).subscribe("s", {"n": 0, "end": "forever"},
                                                  buffer=8) as sub:
        done = trio.Event()
        feed = Feed(sub, done)
        with trio.move_on_after(0.05) as idle:
            await feed.batch()
        assert idle.cancelled_caught and not feed.ended     # nothing yet: it waited
        feed.close()
        assert done.is_set() and feed.ended and await feed.batch() == []
    assert handler.closed.is_set()           # leaving the subscription ended the stream
