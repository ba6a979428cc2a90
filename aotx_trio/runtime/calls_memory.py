"""A space's saved memory: ``memory.list`` and ``memory.get`` (runtime/memory.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aotx_trio.runtime import render, validate
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.memory import render_object, render_row
from aotx_trio.runtime.services import READ_CHUNK, Method, Services


class MemoryCalls:
    def __init__(self, services: Services, callers: Callers) -> None:
        self.device = services.device
        self.lineage = services.lineage
        self.callers = callers

    def methods(self) -> dict[str, Method]:
        return {"memory.list": self.list_rows, "memory.get": self.get_object}

    async def list_rows(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``memory.list``: the space's saved memory rows (read right on the space)."""
        grants, key = self.callers.caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        rows, nxt = self.device.memory_list(grants, key, space, cursor, limit)
        return render.render_page([render_row(r, self.lineage) for r in rows], nxt)

    async def get_object(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``memory.get``: one saved memory object of the space and its payload bytes
        from ``offset``."""
        grants, key = self.callers.caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        obj = validate.parse_id("memory", params.get("object"), self.lineage)
        offset = validate.offset(params)
        row, data = self.device.memory_read(grants, key, space, obj, offset, READ_CHUNK)
        return render_object(row, offset, data, self.lineage)
