"""A conversation's events: its inputs in input order, by input-order cursor.

An event is one INPUT of the conversation, ``{"cursor": "<its input index>",
"receipt": <the operation resource>}`` (another participant's counters null).
Only *saved* admissions are events: the listing stops at the first unsaved
input (saves are a prefix of the journal, so nothing saved follows it), so no
reader ever sees an admission a crash could take back, and a cursor never
passes an event that appears later.  Inputs retired with their actors' retry
floors leave the window: the *event floor* is the highest retired index, and
a cursor below it reports ``gap: true`` and lists from the floor on.

``conversation.events`` answers one page: ``{"items", "next_cursor" (always
the cursor to continue from), "more" (another page is ready now),
"event_floor", "gap"}``.  ``conversation.watch`` opens with ``{"cursor",
"event_floor", "gap"}`` and pushes each event as its admission is saved, for
as long as the caller may read the conversation: it reads pages with the
caller's current grants while it is behind, then follows the runtime's
fanout (runtime/fanout.py: one read per conversation and save, the read
right checked again per reader before each push).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Receipt
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.runtime.render import render_receipt

Saver = Any   # the emitter: saved_records, wait_saved(record)


def _saved(r: Receipt) -> bool:
    return r.admission_saved or r.save.saved_records > r.admission_record


def page(device: Device, grants: int, key: str, conversation: str, cursor: int, limit: int,
         lineage: str) -> dict[str, Any]:
    rows, nxt, floor = device.conversation_inputs(grants, key, conversation, cursor, limit)
    items: list[dict[str, Any]] = []
    at = max(cursor, floor)
    for r in rows:
        if not _saved(r):
            nxt = 0
            break
        items.append(event(r, lineage))
        at = r.input_index
    return {"items": items, "next_cursor": str(at), "more": bool(nxt),
            "event_floor": str(floor), "gap": cursor < floor}


def event(r: Receipt, lineage: str) -> dict[str, Any]:
    return {"cursor": str(r.input_index), "receipt": render_receipt(r, lineage)}


async def watch(device: Device, saver: Saver, caller: Callable[[], tuple[int, str]],
                conversation: str, cursor: int, lineage: str, batch: int = 64,
                fanout: Fanout | None = None,
                ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
    """The open value and the items of ``conversation.watch``.  With ``fanout`` (the
    runtime's, runtime/fanout.py) the stream reads pages with the caller's grants only
    while it is behind, then follows the fanout's pushes; without it, every save makes
    it read again."""
    grants, key = caller()
    first = page(device, grants, key, conversation, cursor, 1, lineage)
    opened = {"cursor": str(cursor), "event_floor": first["event_floor"], "gap": first["gap"]}

    async def items() -> AsyncIterator[dict[str, Any]]:
        at = cursor
        while True:
            mark = saver.saved_records
            grants_now, _ = caller()
            got = page(device, grants_now, key, conversation, at, batch, lineage)
            for item in got["items"]:
                yield item
            at = int(got["next_cursor"])
            if got["more"]:
                continue
            if fanout is None:
                await saver.wait_saved(mark)     # the next save may make one visible
            elif not got["items"]:     # caught up, nothing yielded since the read: follow
                with fanout.follow_conversation(conversation, key, caller, at) as live:
                    async for item in live:
                        yield item
                        at = int(item["cursor"])

    return opened, items()
