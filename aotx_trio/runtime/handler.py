"""The runtime's service handler: the methods of docs/formats/socket.md.

:class:`ServiceHandler` answers calls and opens streams against one device, with
the :class:`~aotx_trio.runtime.services.Services` boot opened.  Its calls come in
groups, each built from those services:

* runtime/calls_status.py: ``ping``, ``capabilities``, ``save_state``, ``metrics``,
  ``save.watch``;
* runtime/calls_shared.py: the reads of the shared state, ``operation.watch`` and
  ``conversation.watch``;
* runtime/calls_admit.py: ``mutation.submit``;
* runtime/calls_models.py: ``identity``, ``embed``, ``model.load``, ``chat.generate``;
* runtime/calls_memory.py and calls_media.py: ``memory.list``/``memory.get``,
  ``media.put``.

Every call resolves the caller's principal to its deployment grants
(runtime/callers.py) and passes that bitmask on every device call; a new mutation
waits for the journal to save its admission, and a read waits for the save of
another participant's admission it would show (runtime/save_gate.py).  Either
transport serves it: the in-process client calls it directly,
:func:`aotx_trio.runtime.socket_server.serve_socket` over the Unix socket.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.calls_admit import Admissions
from aotx_trio.runtime.calls_media import MediaCalls
from aotx_trio.runtime.calls_memory import MemoryCalls
from aotx_trio.runtime.calls_models import ModelCalls
from aotx_trio.runtime.calls_shared import SharedReads
from aotx_trio.runtime.calls_status import StatusCalls
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.runtime.media import MediaStore
from aotx_trio.runtime.memory import MemoryService
from aotx_trio.runtime.quota import Quotas
from aotx_trio.runtime.save_gate import SaveGate
from aotx_trio.runtime.served import ModelSet
from aotx_trio.runtime.services import GrantTable, Method, Services, StreamMethod
from aotx_trio.runtime.state import RuntimeState


class ServiceHandler:
    """Answers service calls and streams against ``services``; ``grants`` is the
    deployment grant table (assign :attr:`grants` to reload it)."""

    def __init__(self, services: Services, grants: GrantTable) -> None:
        # what outlives a rebuild of the groups (see _install)
        self.callers = Callers(grants)
        self.gate = SaveGate(services.device, services.saver, services.lineage)
        self.quotas = Quotas(services.device)   # per-principal quotas (the grant file's)
        self.memory = MemoryService(services.device, services.models.embedding)
        self._load_lock = trio.Lock()
        self._handing: set[str] = set()          # inputs being retained and handed over
        self._install(services)

    def _install(self, services: Services) -> None:
        """Build the call groups from ``services``."""
        self.services = services
        self._admissions = Admissions(services, self.callers, self.gate, self.quotas,
                                      self.memory, self._handing)
        status = StatusCalls(services, self.memory)
        shared = SharedReads(services, self.callers, self.gate)
        # one encoder run at a time, all callers: embed shares memory's limiter
        models = ModelCalls(services, self.callers, self.memory.limiter, self._load_lock)
        self._methods: dict[str, Method] = {
            **status.methods(), **shared.methods(), **self._admissions.methods(),
            **models.methods(), **MediaCalls(services, self.callers).methods(),
            **MemoryCalls(services, self.callers).methods()}
        self._streams: dict[str, StreamMethod] = {
            **status.streams(), **shared.streams(), **models.streams()}

    async def call(self, method: str, params: dict[str, Any]) -> Any:
        fn = self._methods.get(method)
        if fn is None:
            raise errors.NotFound(f"no service method {method!r}", code="method_not_found",
                                  method=method)
        return await fn(params)

    async def open_stream(self, method: str, params: dict[str, Any],
                          ) -> tuple[Any, AsyncIterator[Any]]:
        fn = self._streams.get(method)
        if fn is None:
            raise errors.NotFound(f"no service stream {method!r}", code="method_not_found",
                                  method=method)
        return await fn(params)

    async def submit_json(self, params: Mapping[str, Any]) -> tuple[bytes, bool, str]:
        """``mutation.submit`` for the in-process gateway: (the receipt as the gateway's
        JSON bytes, created, operation id)."""
        return await self._admissions.submit_json(params)

    # -- what the runtime holds (read by serve, tools and tests) -------------------
    @property
    def lineage(self) -> str:
        return self.services.lineage

    @property
    def state(self) -> RuntimeState | None:
        return self.services.state

    @property
    def media(self) -> MediaStore | None:
        return self.services.media

    @property
    def fanout(self) -> Fanout | None:
        return self.services.fanout

    @property
    def executor(self) -> Executor | None:
        return self.services.executor

    @executor.setter
    def executor(self, executor: Executor | None) -> None:
        """Swap the executor (tests drive one by hand): the groups are rebuilt."""
        self._install(dataclasses.replace(self.services, executor=executor))

    @property
    def models(self) -> ModelSet:
        return self.services.models

    @models.setter
    def models(self, models: ModelSet) -> None:
        """Swap the models (tests): the groups are rebuilt; memory keeps its own."""
        self._install(dataclasses.replace(self.services, models=models))

    @property
    def grants(self) -> GrantTable:
        return self.callers.grants

    @grants.setter
    def grants(self, grants: GrantTable) -> None:
        """Reload the deployment grants (SIGHUP) without a restart."""
        self.callers.grants = grants

    @property
    def save_timeout(self) -> float:
        return self.gate.save_timeout

    @save_timeout.setter
    def save_timeout(self, seconds: float) -> None:
        self.gate.save_timeout = seconds

    @property
    def read_wait(self) -> float:
        return self.gate.read_wait

    @read_wait.setter
    def read_wait(self, seconds: float) -> None:
        self.gate.read_wait = seconds
