"""No dirty reads (docs/reliability.md): the handler's index of the admissions it made
that are not saved yet, the waits a read by another participant makes before it shows
one, and the wait of a new mutation for its own save."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

import trio

from aotx_trio import errors, vocab
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Receipt
from aotx_trio.runtime.services import Saver
from aotx_trio.runtime.unsaved import Key, Unsaved
from aotx_trio.vocab import format_id

#: how long a read by another participant waits for the save of an admission it would
#: show (then 503 save_pending; docs/reliability.md, "No dirty reads")
READ_WAIT_S = 2.0
#: how long a new mutation waits for its admission's save (then 503 save_pending)
SAVE_TIMEOUT_S = 30.0


class _Row(Protocol):
    @property
    def id(self) -> str: ...


R = TypeVar("R", bound=_Row)


class SaveGate:
    """Holds reads back until what they would show is saved; ``read_wait`` and
    ``save_timeout`` are the two waits (seconds)."""

    def __init__(self, device: Device, saver: Saver, lineage: str) -> None:
        self.device = device
        self.saver = saver
        self.lineage = lineage
        self.unsaved = Unsaved()       # admissions others may not see yet
        self.read_wait = READ_WAIT_S
        self.save_timeout = SAVE_TIMEOUT_S

    async def saved_for(self, reader: str, keys: list[Key]) -> bool:
        """Wait until no other participant's unsaved admission changes what ``keys``
        name; True when it waited (the caller reads again)."""
        last = self.unsaved.blocking(self.saver.saved_records, reader,
                                     [("spaces", reader), *keys])
        if last is None:
            return False
        await self._wait_record(last)
        return True

    async def saved_page(self, reader: str, kind: str,
                         read: Callable[[], tuple[list[R], int]]) -> tuple[list[R], int]:
        """A page of rows (each with an ``id``) as ``read`` answers it, read again when
        it showed another participant's unsaved ``kind`` row (once that is saved)."""
        rows, nxt = read()
        if await self.saved_for(reader, [(kind, r.id) for r in rows]):
            rows, nxt = read()
        return rows, nxt

    async def _wait_record(self, record: int) -> None:
        self.saver.wake()
        with trio.move_on_after(self.read_wait) as waited:
            await self.saver.wait_saved(record)
        if waited.cancelled_caught:
            raise errors.SavePending(
                "the read would show another participant's admission that is not saved "
                "yet; retry once the journal saves it", reason="unsaved_state",
                retry_after=1)

    async def saved_receipt(self, grants: int, key: str, op: str) -> Receipt:
        """The receipt ``key`` may read; another participant's receipt only once its
        admission (and its terminal result, when it has one) is saved."""
        receipt = self.device.receipt(grants, key, op)
        if receipt.participant == key:
            return receipt
        need: int | None = None
        if not receipt.admission_saved:
            need = receipt.admission_record
        elif receipt.terminal and receipt.terminal_record is not None \
                and not receipt.terminal_saved:
            need = receipt.terminal_record
        other = self.unsaved.blocking(self.saver.saved_records, key,
                                      [("operation", op), ("spaces", key)])
        if other is not None and (need is None or other > need):
            need = other
        if need is None:
            return receipt
        await self._wait_record(need)
        return self.device.receipt(grants, key, op)

    async def admission_saved(self, receipt: Receipt) -> None:
        """Wait for the save of a new mutation's admission (503 ``save_pending`` after
        ``save_timeout``)."""
        self.saver.wake()
        if not await self.saver.wait_saved(receipt.admission_record, self.save_timeout):
            raise errors.SavePending(
                f"operation admitted but not saved within {self.save_timeout:g} s; an exact "
                "retry answers with its receipt once it is saved",
                operation=format_id(vocab.PREFIXES["operation"], self.lineage, receipt.op_id),
                retry_after=1)
