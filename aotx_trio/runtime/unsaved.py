"""Which admitted changes are not saved yet, by what they touch (no dirty reads).

The device applies an admission at once (device commit) and the journal saves
it later.  Until it is saved, only its actor may see it: a read by anyone else
that would show it waits for the save (docs/reliability.md, "No dirty reads").
:class:`Unsaved` is the handler's index of the admissions it made that are not
saved yet, keyed by what each one changes:

==========================  ==================================================
key                         changed by
==========================  ==================================================
``("space", S)``            creating S; a member row of S; a conversation in S
``("spaces", P)``           a member row for participant P (P's rights)
``("spaces", "*")``         creating an instance space (every reader's list)
``("conversation", C)``     creating C; an input to C
``("operation", O)``        a cancellation of O
==========================  ==================================================

Entries leave once the journal's ``saved_records`` passes their last record
(records are saved in order, so the oldest leave first).  Recovered state is
always saved, so a restart starts empty.  Receipts need no entry: the device
reports their admission and terminal records itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

Key = tuple[str, str]


class Unsaved:
    """The admissions not yet saved, by the keys they change (see the module doc)."""

    def __init__(self) -> None:
        self._order: deque[tuple[int, str, tuple[Key, ...]]] = deque()
        self._by_key: dict[Key, list[tuple[int, str]]] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(self, record: int, actor: str, keys: Iterable[Key], saved_records: int = 0,
            ) -> None:
        """An admission whose last record is ``record``, made by ``actor``; entries
        already saved (below ``saved_records``) leave first, so the index stays as
        small as the unsaved tail even when nothing reads."""
        self.prune(saved_records)
        ks = tuple(keys)
        if not ks:
            return
        self._order.append((record, actor, ks))
        for k in ks:
            self._by_key.setdefault(k, []).append((record, actor))

    def prune(self, saved_records: int) -> None:
        while self._order and self._order[0][0] < saved_records:
            record, actor, ks = self._order.popleft()
            for k in ks:
                rows = self._by_key.get(k)
                if rows is None:
                    continue
                rows.remove((record, actor))
                if not rows:
                    del self._by_key[k]

    def blocking(self, saved_records: int, reader: str, keys: Iterable[Key]) -> int | None:
        """The last record that must be saved before ``reader`` may read what ``keys``
        name (another actor's unsaved change to one of them), or None."""
        self.prune(saved_records)
        if not self._by_key:
            return None
        last: int | None = None
        for k in keys:
            for record, actor in self._by_key.get(k, ()):
                if actor != reader and record >= saved_records and \
                        (last is None or record > last):
                    last = record
        return last
