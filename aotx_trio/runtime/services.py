"""What the service handler's calls run against (runtime/handler.py and its groups,
runtime/calls_*.py): :class:`Services`, opened by boot before the handler is built,
and the shapes the groups share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aotx_trio.native.device import Device
from aotx_trio.native.journal import SaveState
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.runtime.media import MediaStore
from aotx_trio.runtime.served import ModelSet
from aotx_trio.runtime.state import RuntimeState
from aotx_trio.runtime.stats import Histogram

READ_CHUNK = 65536

Method = Callable[[Mapping[str, Any]], Awaitable[Any]]
StreamMethod = Callable[[Mapping[str, Any]], Awaitable[tuple[Any, AsyncIterator[Any]]]]


class Saver(Protocol):
    """The journal emitter as the handler sees it."""

    saved_records: int
    tick_seconds: Histogram       # each saved tick, drain to ack
    fsync_seconds: Histogram      # its fsync alone

    def wake(self) -> None: ...
    async def wait_saved(self, record_index: int, timeout: float = ...) -> bool: ...


class GrantTable(Protocol):
    def actions_for(self, key: str | bytes) -> frozenset[str]: ...


@dataclass(frozen=True)
class Services:
    """One device and what runs beside it: ``saver`` is the journal emitter,
    ``save_state`` returns the journal's current save state.  ``executor`` None: this
    runtime runs no models; ``media`` None: it stores no media; ``fanout`` None: the
    watches poll the device; ``state`` None: not booted (tools, tests)."""

    device: Device
    saver: Saver
    save_state: Callable[[], SaveState]
    lineage: str
    models: ModelSet = field(default_factory=lambda: ModelSet({}))
    executor: Executor | None = None
    state: RuntimeState | None = None
    media: MediaStore | None = None
    fanout: Fanout | None = None

    @classmethod
    def booted(cls, state: RuntimeState, models: ModelSet, executor: Executor,
               media: MediaStore, fanout: Fanout) -> Services:
        """The services of a booted runtime (runtime/boot.py)."""
        return cls(state.device, state.emitter, state.journal_file.journal.save_state,
                   state.lineage, models, executor, state, media, fanout)
