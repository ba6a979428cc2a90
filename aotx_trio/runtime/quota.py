"""Per-principal quotas the runtime enforces on new admissions (429 ``over_quota``).

One principal must not be able to fill a fixed table for everyone else: each
principal may hold at most ``quotas.receipts`` receipts that are not retired
(its ``next_sequence - retry_floor``), and may create at most
``quotas.spaces`` spaces and ``quotas.conversations`` conversations (neither
can be freed).  The member rows of the spaces a principal owns count against
its ``quotas.members`` (the owner answers for its spaces' rows, whoever with
``manage`` adds them; the owner's own rights are the space's, not a row; a
``member.set`` that only changes an existing row takes none; rows are never freed), the
memory rows it adds against ``quotas.memory_rows`` (an input with text is promised
its text and embedding rows, four with a mode 2 interpretation; a publication adds
two copies; memory rows are never freed: the table of 4096 is shared by everyone), and
the bytes of the media it uploaded against ``quotas.media_bytes``
(:class:`MediaQuota`; the same bytes uploaded again are not counted twice).
The limits come from the grant file (``quotas``, written from
``gateway.json``'s ``limits.max_*_per_principal``), so both gateway paths and
every transport meet the same check.  Registration, retirement (the way out of
the receipt quota) and exact retries of known sequences are never refused here;
a cancellation may pass the receipt quota by :data:`CANCEL_MARGIN`.

Space, conversation, member-row and memory-row counts are counted once per principal
from the device (the spaces it owns, the conversations it created in the spaces it
can read, the member rows of the spaces it owns, the memory rows it is the actor of
in the spaces it can read) and then kept up by
:meth:`Quotas.admitted`; nothing deletes any of them.  Media bytes are counted
once per principal from the media store's owner records.
"""

from __future__ import annotations

import hashlib
import json
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import trio

from aotx_trio import errors, vocab
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Receipt, Request
from aotx_trio.runtime.media import Media, MediaStore

PAGE = 256
#: cancellations may pass the receipt quota by this many, so a principal at its quota
#: can still cancel its own running inputs (whose receipts it cannot retire yet)
CANCEL_MARGIN = 8
MAX_KNOWN_ROWS = 1 << 16   # member rows remembered as existing (then forgotten, re-read)
_ALL = vocab.grant_mask(["shared_read", "shared_write", "shared_manage"])


class Limits(Protocol):
    @property
    def receipts(self) -> int: ...
    @property
    def spaces(self) -> int: ...
    @property
    def conversations(self) -> int: ...
    @property
    def members(self) -> int: ...
    @property
    def media_bytes(self) -> int: ...
    @property
    def memory_rows(self) -> int: ...


def over_quota(quota: str, limit: int, message: str) -> errors.Refusal:
    return errors.Refusal(message, code="over_quota", quota=quota, limit=limit)


class Quotas:
    def __init__(self, device: Device) -> None:
        self.device = device
        self._spaces: dict[str, int] = {}
        self._conversations: dict[str, int] = {}
        self._members: dict[str, int] = {}       # owner -> member rows of its spaces
        self._memory: dict[str, int] = {}        # actor -> memory rows (and promised)
        self._new_row: str | None = None         # the owner a checked member.set adds to
        self._new_memory = 0                     # memory rows a checked admission adds
        # (space, participant) member rows seen on the device: rows are never freed, so
        # a member.set of one of these changes a row and charges nobody (no device scan)
        self._rows: set[tuple[str, str]] = set()

    def check(self, limits: Limits, key: str, req: Request, memory_rows: int = 0) -> None:
        """Raise :func:`over_quota` when ``req`` (a new operation of principal ``key``
        that adds ``memory_rows`` memory rows) would pass one of ``limits``."""
        kind = req.kind
        self._new_memory = 0
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
        if memory_rows:
            held = self._count_memory(key)
            if held + memory_rows > limits.memory_rows:
                raise over_quota("memory_rows", limits.memory_rows,
                                 f"the principal holds {held} memory rows; {memory_rows} "
                                 f"more are over its {limits.memory_rows}")
            self._new_memory = memory_rows
        self._new_row = None
        owner = self._row_owner(key, req) if kind == vocab.Kind.MEMBER_SET else None
        if owner is not None:
            if self._count_members(owner) >= limits.members:
                raise over_quota("members", limits.members,
                                 f"the spaces of {'the principal' if owner == key else 'the owner'}"
                                 f" hold {limits.members} member rows")
            self._new_row = owner

    def admitted(self, key: str, receipt: Receipt) -> None:
        """A new admission of ``key`` (not a retry) was made (right after :meth:`check`)."""
        if receipt.kind == vocab.Kind.SPACE_CREATE and key in self._spaces:
            self._spaces[key] += 1
        elif receipt.kind == vocab.Kind.CONVERSATION_CREATE and key in self._conversations:
            self._conversations[key] += 1
        rows, self._new_memory = self._new_memory, 0
        if rows and key in self._memory:
            self._memory[key] += rows
        owner, self._new_row = self._new_row, None
        if owner is not None and owner in self._members \
                and receipt.kind == vocab.Kind.MEMBER_SET:
            self._members[owner] += 1

    def _row_owner(self, key: str, req: Request) -> str | None:
        """The owner whose quota a ``member.set`` by ``key`` charges: the space's owner
        when the row is new, None when it exists (or the device refuses the request:
        it answers that itself)."""
        if req.space is None or req.participant is None:
            return None
        row = (req.space, req.participant)
        if row in self._rows:
            return None
        try:
            space = self.device.space(_ALL, key, req.space)
            cursor = 0
            while True:
                rows, cursor = self.device.members(_ALL, key, req.space, cursor, PAGE)
                if any(r.participant == req.participant for r in rows):
                    if len(self._rows) >= MAX_KNOWN_ROWS:
                        self._rows.clear()
                    self._rows.add(row)
                    return None
                if cursor == 0:
                    return space.owner
        except errors.AotxError:
            return None

    def _count_members(self, owner: str) -> int:
        n = self._members.get(owner)
        if n is not None:
            return n
        n = 0
        for space in self._owned_spaces(owner):
            cursor = 0
            while True:
                rows, cursor = self.device.members(_ALL, owner, space, cursor, PAGE)
                n += len(rows)
                if cursor == 0:
                    break
        self._members[owner] = n
        return n

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

    def _count_memory(self, key: str) -> int:
        n = self._memory.get(key)
        if n is None:
            n = self._memory[key] = self._count_in_spaces(
                key, self.device.memory_list, lambda r: r.actor == key)
        return n

    def _count_conversations(self, key: str) -> int:
        n = self._conversations.get(key)
        if n is None:
            n = self._conversations[key] = self._count_in_spaces(
                key, self.device.conversations, lambda r: r.creator == key)
        return n

    def _count_in_spaces(self, key: str, listing: Callable[..., tuple[list[Any], int]],
                         mine: Callable[[Any], bool]) -> int:
        """The rows of ``listing`` (a per-space device listing: conversations, memory
        rows) that are ``mine``, over every space ``key`` can read."""
        n = 0
        space_cursor = 0
        while True:
            spaces, space_cursor = self.device.spaces(_ALL, key, space_cursor, PAGE)
            for s in spaces:
                cursor = 0
                while True:
                    try:
                        rows, cursor = listing(_ALL, key, s.id, cursor, PAGE)
                    except errors.AotxError:   # listed, not readable: nothing it adds
                        break
                    n += sum(1 for r in rows if mine(r))
                    if cursor == 0:
                        break
            if space_cursor == 0:
                return n


class MediaQuota:
    """The bytes each principal's uploads hold in the media store (``quotas.media_bytes``).

    Counted once per principal from its owner records (``media/owners/*/<key>``),
    then kept up as uploads land; an upload of bytes the principal already owns is
    never refused (it answers 200 and stores nothing).  :meth:`put` checks, stores and
    counts under one lock, so two uploads at once cannot both pass the last bytes."""

    def __init__(self, store: MediaStore) -> None:
        self.store = store
        self._used: dict[str, int] = {}
        self._lock = trio.Lock()

    def _count(self, key: str) -> int:
        n = self._used.get(key)
        if n is None:
            n = 0
            for record in (self.store.folder / "owners").glob(f"*/{key}"):
                n += _record_bytes(record)
            self._used[key] = n
        return n

    async def put(self, limits: Limits | None, key: str, content_type: str,
                  data: bytes) -> tuple[Media, bool]:
        """:meth:`MediaStore.put`, refused with ``over_quota`` (``quota: "media_bytes"``)
        when new bytes would take ``key`` past ``limits.media_bytes``."""
        async with self._lock:
            if limits is not None:
                used = await trio.to_thread.run_sync(self._count, key)
                if used + len(data) > limits.media_bytes:
                    sha = hashlib.sha256(data).hexdigest()
                    if self.store.owned(key, sha) is None:
                        raise over_quota("media_bytes", limits.media_bytes,
                                         f"the principal's media hold {used} bytes; "
                                         f"{len(data)} more are over its "
                                         f"{limits.media_bytes}")
            media, created = await self.store.put(key, content_type, data)
            if created and key in self._used:
                self._used[key] += media.bytes
            return media, created


_MEDIA_QUOTAS: weakref.WeakKeyDictionary[MediaStore, MediaQuota] = weakref.WeakKeyDictionary()


def media_quota(store: MediaStore) -> MediaQuota:
    """The one :class:`MediaQuota` of ``store``."""
    quota = _MEDIA_QUOTAS.get(store)
    if quota is None:
        quota = _MEDIA_QUOTAS[store] = MediaQuota(store)
    return quota


def _record_bytes(record: Path) -> int:
    try:
        return int(json.loads(record.read_text("utf-8"))["bytes"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
