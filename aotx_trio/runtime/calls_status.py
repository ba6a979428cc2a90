"""The runtime's own state: ``ping``, ``capabilities``, ``save_state``, ``metrics`` and
the ``save.watch`` stream (docs/formats/socket.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from aotx_trio import errors, vocab
from aotx_trio.native import lib as native
from aotx_trio.runtime import render
from aotx_trio.runtime.memory import MemoryService
from aotx_trio.runtime.services import Method, Services, StreamMethod


class StatusCalls:
    def __init__(self, services: Services, memory: MemoryService) -> None:
        self.services = services
        self.memory = memory

    def methods(self) -> dict[str, Method]:
        return {"ping": self.ping, "capabilities": self.capabilities,
                "save_state": self.save_state, "metrics": self.metrics}

    def streams(self) -> dict[str, StreamMethod]:
        return {"save.watch": self.watch_saves}

    async def ping(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"lineage": self.services.lineage}

    async def capabilities(self, params: Mapping[str, Any]) -> dict[str, Any]:
        s = self.services
        caps = native.capacities()
        usage = s.device.usage()
        runs = s.executor is not None and bool(s.models.text)
        tables = ("participants", "spaces", "conversations", "members", "receipts", "memory")
        return {
            "lineage": s.lineage,
            "schema": vocab.SCHEMA,
            "capacities": {k: caps[k] for k in tables},
            "usage": {k: int(getattr(usage, k)) for k in tables},
            "limits": {"command_bytes": caps["command_bytes"],
                       "result_bytes": caps["result_bytes"],
                       "max_text_bytes": vocab.MAX_TEXT_BYTES, "max_media": vocab.MAX_MEDIA,
                       "media_link_bytes": vocab.MEDIA_LINK_BYTES},
            "models": s.models.describe(),
            "features": {"inputs": runs, "events": runs, "cancellations": runs,
                         "memory": runs and self.memory.enabled, "publications": True,
                         "media": s.media is not None},
            "save": render.render_save(s.save_state()),
        }

    async def metrics(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The runtime's numbers for the gateway's ``/metrics`` (no principal: the
        gateway checks ``metrics_read`` itself; nothing here is per-participant)."""
        s = self.services
        models = {}
        for m in s.models:
            kv = m.engine.kv_stats()
            models[m.name] = {"kv_pages": kv.n_pages, "kv_free_pages": kv.free_pages,
                              "kv_used_pages": kv.used_pages,
                              "kv_shared_pages": kv.shared_pages, "sequences": kv.n_seqs,
                              "kv_page_bytes": kv.page_bytes}
        save = s.save_state()
        out: dict[str, Any] = {"models": models,
                               "journal": {"saved_records": save.saved_records,
                                           "pending_bytes": save.pending_bytes,
                                           "hold": save.hold,
                                           "tick_seconds": s.saver.tick_seconds.snapshot(),
                                           "fsync_seconds":
                                               s.saver.fsync_seconds.snapshot()}}
        if s.executor is not None:
            out["executor"] = s.executor.metrics()
        return out

    async def save_state(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return render.render_save(self.services.save_state())

    async def watch_saves(self, params: Mapping[str, Any],
                          ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``save.watch``: opens with the current save state, then pushes it each time
        the journal saves more records; ends (``complete``) after ``limit`` items when
        one is given."""
        limit = params.get("limit")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 1):
            raise errors.InvalidInput("limit must be a positive integer", field="limit")

        s = self.services
        opened = s.save_state()

        async def items() -> AsyncIterator[dict[str, Any]]:
            # each item: a save after the last state shown (counted from the opening
            # state, not from whenever this generator first runs: a save in between
            # is pushed, not skipped)
            shown = opened.saved_records
            sent = 0
            while limit is None or sent < limit:
                await s.saver.wait_saved(shown)
                sent += 1
                state = s.save_state()
                shown = state.saved_records
                yield render.render_save(state)

        return render.render_save(opened), items()
