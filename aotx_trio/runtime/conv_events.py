"""A conversation's events: its inputs in input order, by input-order cursor.

An event is one INPUT of the conversation, ``{"cursor": "<its input index>",
"receipt": <the operation resource>}`` (another participant's counters null).
Only *saved* admissions are events: the listing stops at the first unsaved
input (saves are a prefix of the journal, so nothing saved follows it), so no
reader ever sees an admission a crash could take back, and a cursor never
passes an event that appears later.  Inputs retired with their actors' retry
floors leave the window, anywhere in it (one actor's inputs interleave with
the others'): a read that passes retired cursors says so, each run of them a
*gap* ``{"first", "last"}``.  The *event floor* is the highest cursor at or
below which every input is retired (the window's start): a cursor below it
always reports a gap.

``conversation.events`` answers one page: ``{"items", "next_cursor" (always
the cursor to continue from, past the gaps the page reports), "more"
(another page is ready now), "event_floor", "gap" (the page passed retired
cursors), "gaps" (which, in order)}``.  ``conversation.watch`` opens with
``{"cursor", "event_floor", "gap"}`` and pushes each event as its admission
is saved, and each gap as ``{"gap": true, "cursor", "first", "last",
"event_floor"}`` before the events after it, for as long as the caller may
read the conversation: it reads pages with the caller's current grants while
it is behind, then follows the runtime's fanout (runtime/fanout.py: one read
per conversation and save, the read right checked again per reader before
each push).
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


def _read(device: Device, grants: int, key: str, conversation: str, cursor: int,
          limit: int, lineage: str) -> tuple[list[dict[str, Any]], int, bool, int]:
    """(the page's events and gaps in cursor order, the cursor after them, whether
    another page is ready now, the event floor).  Every input up to the
    conversation's count (read first: an input admitted meanwhile is not in it) that
    the listing passes is retired: the listing returns every live one in order."""
    total = device.conversation(grants, key, conversation).inputs
    rows, nxt, floor = device.conversation_inputs(grants, key, conversation, cursor, limit)
    out: list[dict[str, Any]] = []
    at = cursor

    def passed(last: int) -> None:      # the retired cursors at+1..last
        nonlocal at
        if last > at:
            out.append({"gap": True, "cursor": str(at), "first": str(at + 1),
                        "last": str(last), "event_floor": str(floor)})
            at = last

    for r in rows:
        passed(r.input_index - 1)
        if not _saved(r):
            return out, at, False, floor
        out.append(event(r, lineage))
        at = r.input_index
    if not nxt:
        passed(total)
    return out, at, bool(nxt), floor


def page(device: Device, grants: int, key: str, conversation: str, cursor: int, limit: int,
         lineage: str) -> dict[str, Any]:
    got, at, more, floor = _read(device, grants, key, conversation, cursor, limit, lineage)
    gaps = [{"first": g["first"], "last": g["last"]} for g in got if "gap" in g]
    return {"items": [e for e in got if "gap" not in e], "next_cursor": str(at),
            "more": more, "event_floor": str(floor), "gap": bool(gaps), "gaps": gaps}


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
    opened = {"cursor": str(cursor), "event_floor": first["event_floor"],
              "gap": cursor < int(first["event_floor"])}

    async def items() -> AsyncIterator[dict[str, Any]]:
        at = cursor
        while True:
            mark = saver.saved_records
            grants_now, _ = caller()
            got, at, more, _ = _read(device, grants_now, key, conversation, at, batch,
                                     lineage)
            for item in got:
                yield item
            if more:
                continue
            if fanout is None:
                await saver.wait_saved(mark)     # the next save may make one visible
            elif not got:     # caught up, nothing yielded since the read: follow
                with fanout.follow_conversation(conversation, key, caller, at) as live:
                    async for item in live:
                        yield item
                        at = int(item["last" if item.get("gap") else "cursor"])

    return opened, items()
