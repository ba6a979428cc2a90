"""Per-principal quotas the runtime enforces on new admissions (429 ``over_quota``).

One principal must not be able to fill a fixed table for everyone else: each
principal may hold at most ``quotas.receipts`` receipts that are not retired
(its ``next_sequence - retry_floor``), and may create at most
``quotas.spaces`` spaces and ``quotas.conversations`` conversations (neither
can be freed).  The limits come from the grant file (``quotas``, written from
``gateway.json``'s ``limits.max_*_per_principal``), so both gateway paths and
every transport meet the same check.  Registration, retirement (the way out of
the receipt quota) and exact retries of known sequences are never refused here;
a cancellation may pass the receipt quota by :data:`CANCEL_MARGIN`.

Space and conversation counts are counted once per principal from the device
(the spaces it owns, the conversations it created in the spaces it can read)
and then kept up by :meth:`Quotas.admitted`; nothing deletes either.
"""

from __future__ import annotations

from typing import Protocol

from aotx_trio import errors, vocab
from aotx_trio.device import Device, Receipt, Request

PAGE = 256
#: cancellations may pass the receipt quota by this many, so a principal at its quota
#: can still cancel its own running inputs (whose receipts it cannot retire yet)
CANCEL_MARGIN = 8
_ALL = vocab.grant_mask(["shared_read", "shared_write", "shared_manage"])


class Limits(Protocol):
    @property
    def receipts(self) -> int: ...
    @property
    def spaces(self) -> int: ...
    @property
    def conversations(self) -> int: ...


def over_quota(quota: str, limit: int, message: str) -> errors.Refusal:
    return errors.Refusal(message, code="over_quota", quota=quota, limit=limit)


class Quotas:
    def __init__(self, device: Device) -> None:
        self.device = device
        self._spaces: dict[str, int] = {}
        self._conversations: dict[str, int] = {}

    def check(self, limits: Limits, key: str, req: Request) -> None:
        """Raise :func:`over_quota` when ``req`` (a new operation of principal ``key``)
        would pass one of ``limits``."""
        kind = req.kind
        if kind in (vocab.Kind.REGISTER, vocab.Kind.RETIRE):
            return
        p = self.device.participant(_ALL, key, key)
        if not p.registered or p.next_sequence is None or p.retry_floor is None \
                or req.sequence < p.next_sequence:
            return      # the device answers (an exact retry, a conflict, unregistered)
        held = p.next_sequence - p.retry_floor
        if held >= limits.receipts + (CANCEL_MARGIN if kind == vocab.Kind.CANCEL else 0):
            raise over_quota("receipts", limits.receipts,
                             f"the principal holds {limits.receipts} receipts that are not "
                             "retired; retire some (participant.retire) first")
        if kind == vocab.Kind.SPACE_CREATE and self._count_spaces(key) >= limits.spaces:
            raise over_quota("spaces", limits.spaces,
                             f"the principal has created {limits.spaces} spaces")
        if kind == vocab.Kind.CONVERSATION_CREATE \
                and self._count_conversations(key) >= limits.conversations:
            raise over_quota("conversations", limits.conversations,
                             f"the principal has created {limits.conversations} "
                             "conversations")

    def admitted(self, key: str, receipt: Receipt) -> None:
        """A new admission of ``key`` (not a retry) was made."""
        if receipt.kind == vocab.Kind.SPACE_CREATE and key in self._spaces:
            self._spaces[key] += 1
        elif receipt.kind == vocab.Kind.CONVERSATION_CREATE and key in self._conversations:
            self._conversations[key] += 1

    def _owned_spaces(self, key: str) -> list[str]:
        out: list[str] = []
        cursor = 0
        while True:
            rows, cursor = self.device.spaces(_ALL, key, cursor, PAGE)
            out += [r.id for r in rows if r.owner == key]
            if cursor == 0:
                return out

    def _count_spaces(self, key: str) -> int:
        n = self._spaces.get(key)
        if n is None:
            n = self._spaces[key] = len(self._owned_spaces(key))
        return n

    def _count_conversations(self, key: str) -> int:
        n = self._conversations.get(key)
        if n is not None:
            return n
        n = 0
        space_cursor = 0
        while True:
            spaces, space_cursor = self.device.spaces(_ALL, key, space_cursor, PAGE)
            for s in spaces:
                cursor = 0
                while True:
                    rows, cursor = self.device.conversations(_ALL, key, s.id, cursor, PAGE)
                    n += sum(1 for r in rows if r.creator == key)
                    if cursor == 0:
                        break
            if space_cursor == 0:
                break
        self._conversations[key] = n
        return n
