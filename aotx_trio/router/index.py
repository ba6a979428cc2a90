"""The in-memory model index behind ``GET /models``, refreshed from the event feed.

:meth:`ModelIndex.run` is a supervised task: it loads every published model once
(``started()`` after that first load, so the app serves a complete list), then
every ``interval_s`` reads the feed after its cursor and re-reads the models the
new events name (``model.*`` subjects).  A cursor older than the retained feed
(the feed was trimmed past it, or another store was swapped in) reloads
everything.  Keyed reads (``GET /models/{id}``) never use the index: they read
the store.  A store that fails a refresh is logged and retried next interval;
the index keeps serving what it has.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import trio

from aotx_trio.errors import AotxError, FormatError, Gone, NotFound
from aotx_trio.router.registry import ModelView, Registry

log = logging.getLogger("aotx.router.index")

DEFAULT_INTERVAL_S = 30.0
PAGE = 500


@dataclass(frozen=True)
class Entry:
    model_id: str
    model_type: str
    state: str
    listing: dict[str, Any]


def listing(view: ModelView) -> dict[str, Any]:
    """One row of ``GET /models``."""
    man = view.manifest
    return {"model_id": view.model_id, "model_type": man.model_type, "state": view.state,
            "successor_id": view.successor_id,
            "release": man.serving.runtime_release.name,
            "manifest_sha256": view.manifest_sha256,
            "published_at": view.published.published_at}


class ModelIndex:
    def __init__(self, reg: Registry, *, interval_s: float = DEFAULT_INTERVAL_S) -> None:
        if not (interval_s > 0 and math.isfinite(interval_s)):
            raise ValueError("index refresh interval must be a positive number of seconds")
        self.reg = reg
        self.interval_s = interval_s
        self.cursor = 0
        self.entries: dict[str, Entry] = {}
        self.refreshed = trio.Event()     # set (and replaced) after each refresh
        self._sorted: list[Entry] | None = None   # entries by id; rebuilt after a change

    def list(self, model_type: str | None = None, state_filter: str = "active",
             ) -> list[dict[str, Any]]:
        if self._sorted is None:
            self._sorted = [e for _, e in sorted(self.entries.items())]
        return [e.listing for e in self._sorted
                if (model_type is None or e.model_type == model_type)
                and state_filter in ("all", e.state)]

    async def _entry(self, model_id: str) -> Entry | None:
        try:
            view = await self.reg.get_model(model_id)
        except (Gone, NotFound):
            return None
        except FormatError as exc:
            log.warning("index: %s", exc.message)
            return None
        return Entry(model_id, view.manifest.model_type, view.state, listing(view))

    async def _load(self, model_id: str) -> None:
        entry = await self._entry(model_id)
        if entry is not None:
            self.entries[model_id] = entry
            self._sorted = None
        elif self.entries.pop(model_id, None) is not None:
            self._sorted = None

    async def reload(self) -> None:
        """Everything, from the store (the cursor first, so nothing is missed); the
        rows are swapped in whole, so a listing never sees half a reload."""
        head = await self._head()
        fresh: dict[str, Entry] = {}
        for key in await self.reg.run(self.reg.store.keys, "published"):
            entry = await self._entry(key)
            if entry is not None:
                fresh[key] = entry
        self.entries, self._sorted, self.cursor = fresh, None, head

    async def _head(self) -> int:
        seq = self.cursor
        while True:
            page = await self.reg.events(seq, PAGE)
            if not page:
                return seq
            seq = int(page[-1]["seq"])

    async def refresh(self) -> None:
        """Follow the feed from the cursor; reload when the cursor fell out of it."""
        page = await self.reg.events(self.cursor, PAGE)
        if page and int(page[0]["seq"]) != self.cursor + 1 and self.cursor:
            await self.reload()
            return
        while page:
            for ev in page:
                if str(ev.get("type", "")).startswith("model."):
                    await self._load(str(ev["subject"]))
                self.cursor = int(ev["seq"])
            page = await self.reg.events(self.cursor, PAGE)

    def _done(self) -> None:
        done, self.refreshed = self.refreshed, trio.Event()
        done.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        await self.reload()
        self._done()
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            try:
                await self.refresh()
            except (AotxError, OSError) as exc:
                log.warning("index refresh failed (retrying in %g s): %s", self.interval_s,
                            exc)
            self._done()
