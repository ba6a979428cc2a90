"""The runtime's service handler: the methods of docs/formats/socket.md.

:class:`ServiceHandler` answers calls and opens streams against one device.
It resolves the caller's principal to its deployment grants (the grant file
read at boot), intersects them with the actions the gateway vouches for,
passes that bitmask on every device call, waits for the journal to save an
admission before answering a new mutation, and renders device records with
:mod:`aotx_trio.runtime.render`.  Either transport serves it: the in-process
client calls it directly, :func:`aotx_trio.runtime.socket_server.serve_socket`
over the Unix socket.
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol

import trio

from aotx_trio import errors, vocab
from aotx_trio.identity import build_commit, descriptor_sha256
from aotx_trio.native import lib as native
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Participant, Receipt, Request
from aotx_trio.native.journal import SaveState
from aotx_trio.runtime import conv_events, history, render, validate
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.fanout import Fanout
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.media import MediaStore
from aotx_trio.runtime.memory import MemoryService, render_object, render_row
from aotx_trio.runtime.prompt import Turn, render_chat
from aotx_trio.runtime.quota import Quotas, media_quota
from aotx_trio.runtime.served import ModelSet, TextModel
from aotx_trio.runtime.state import RuntimeState
from aotx_trio.runtime.stats import Histogram
from aotx_trio.runtime.unsaved import Key, Unsaved
from aotx_trio.vocab import TERMINAL, format_id, grant_mask, principal_key

READ_CHUNK = 65536
EMBED_QUEUE = 64        # embed calls waiting for the encoder; one more is over_capacity
MAX_LOADED_ON_DEMAND = 4   # GGUF models model.load may add
#: how long a read by another participant waits for the save of an admission it would
#: show (then 503 save_pending; docs/reliability.md, "No dirty reads")
READ_WAIT_S = 2.0
MAX_CACHED_PRINCIPALS = 4096


class Saver(Protocol):
    """The journal emitter as the handler sees it."""

    saved_records: int
    tick_seconds: Histogram       # each saved tick, drain to ack
    fsync_seconds: Histogram      # its fsync alone

    def wake(self) -> None: ...
    async def wait_saved(self, record_index: int, timeout: float = ...) -> bool: ...


class GrantTable(Protocol):
    def actions_for(self, key: str | bytes) -> frozenset[str]: ...


Method = Callable[[Mapping[str, Any]], Awaitable[Any]]
StreamMethod = Callable[[Mapping[str, Any]], Awaitable[tuple[Any, AsyncIterator[Any]]]]


class ServiceHandler:
    """Answers service calls and streams against one device.

    ``saver`` is the journal emitter; ``save_state`` returns the journal's
    current save state."""

    def __init__(self, device: Device, saver: Saver, save_state: Callable[[], SaveState],
                 lineage: str, grants: GrantTable, *, models: ModelSet | None = None,
                 executor: Executor | None = None, save_timeout: float = 30.0) -> None:
        self.device = device
        self.saver = saver
        self.save_state = save_state
        self.lineage = lineage
        self.grants = grants
        self.models = models or ModelSet({})
        self.executor = executor
        self.save_timeout = save_timeout
        self.read_wait = READ_WAIT_S
        self.unsaved = Unsaved()       # admissions others may not see yet
        self.quotas = Quotas(device)   # per-principal quotas (the grant file's limits)
        self.state: RuntimeState | None = None   # set by boot (tests, tools)
        self.media: MediaStore | None = None     # set by boot: the journal folder's media
        self.fanout: Fanout | None = None        # set by boot: the event fanout's task
        self.memory = MemoryService(device, self.models.embedding)
        self._handing: set[str] = set()          # inputs being retained and handed over
        # principal name -> (device key, deployed actions) of the grant table self.grants
        self._principals: dict[str, tuple[str, frozenset[str]]] = {}
        self._principals_of: GrantTable = grants
        self._methods: dict[str, Method] = {
            "ping": self._ping,
            "capabilities": self._capabilities,
            "save_state": self._save_state,
            "metrics": self._metrics,
            "participant.get": self._participant,
            "mutation.submit": self._submit,
            "space.get": self._space,
            "space.list": self._spaces,
            "member.list": self._members,
            "conversation.list": self._conversations,
            "conversation.get": self._conversation,
            "conversation.events": self._conversation_events,
            "operation.get": self._operation,
            "operation.result": self._result,
            "identity": self._identity,
            "embed": self._embed,
            "media.put": self._media_put,
            "model.load": self._load_model,
            "memory.list": self._memory_list,
            "memory.get": self._memory_get,
        }
        self._embed_limiter = trio.CapacityLimiter(1)
        self.memory.limiter = self._embed_limiter   # one encoder run at a time, all callers
        self._load_lock = trio.Lock()
        self._streams: dict[str, StreamMethod] = {"save.watch": self._watch_saves,
                                                  "operation.watch": self._watch_operation,
                                                  "conversation.watch": self._watch_conversation,
                                                  "chat.generate": self._chat}

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

    # -- callers ------------------------------------------------------------------
    def _caller(self, params: Mapping[str, Any]) -> tuple[int, str]:
        """(grant bitmask, principal key): the deployment grants of the principal,
        intersected with the actions the gateway vouches for on this call."""
        actions, key = self._actions(params)
        return grant_mask(list(actions)), key

    def _actions(self, params: Mapping[str, Any]) -> tuple[frozenset[str], str]:
        """(actions, principal key): the principal's deployed actions that the gateway
        also vouches for on this call."""
        name, actions = validate.caller(params)
        if self._principals_of is not self.grants:   # a new grant table: forget
            self._principals, self._principals_of = {}, self.grants
        known = self._principals.get(name)
        if known is None:
            if len(self._principals) >= MAX_CACHED_PRINCIPALS:
                self._principals.clear()
            key = principal_key(name)
            known = self._principals[name] = (key, self.grants.actions_for(key))
        key, deployed = known
        return frozenset(a for a in actions if a in deployed), key

    # -- reads --------------------------------------------------------------------
    async def _ping(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {"lineage": self.lineage}

    async def _capabilities(self, params: Mapping[str, Any]) -> dict[str, Any]:
        caps = native.capacities()
        usage = self.device.usage()
        runs = self.executor is not None and bool(self.models.text)
        tables = ("participants", "spaces", "conversations", "members", "receipts", "memory")
        return {
            "lineage": self.lineage,
            "schema": vocab.SCHEMA,
            "capacities": {k: caps[k] for k in tables},
            "usage": {k: int(getattr(usage, k)) for k in tables},
            "limits": {"command_bytes": caps["command_bytes"],
                       "result_bytes": caps["result_bytes"],
                       "max_text_bytes": vocab.MAX_TEXT_BYTES, "max_media": vocab.MAX_MEDIA,
                       "media_link_bytes": vocab.MEDIA_LINK_BYTES},
            "models": self.models.describe(),
            "features": {"inputs": runs, "events": runs, "cancellations": runs,
                         "memory": runs and self.memory.enabled, "publications": True,
                         "media": self.media is not None},
            "save": render.render_save(self.save_state()),
        }

    async def _identity(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Who this runtime is, for the router's attestation check: the build commit,
        the engine sets it has (none on CPU), every loaded artifact and descriptor."""
        return {"runtime_id": self.lineage, "source_commit": build_commit(), "gpu": None,
                "engine_sets": [], "artifacts": self.models.identity()}

    def _ran(self, artifact_sha256: str, descriptor: Mapping[str, Any]) -> dict[str, Any]:
        return {"source_commit": build_commit(), "artifact_sha256": artifact_sha256,
                "descriptor_sha256": descriptor_sha256(descriptor), "gpu": None}

    async def _embed(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``embed``: one float32 vector (little-endian, base64) per text, in order."""
        actions, _ = self._actions(params)
        if "models_invoke" not in actions:
            raise errors.Forbidden("the principal lacks the models_invoke action",
                                   action="models_invoke", reason="deployment_grant")
        texts = validate.embed_texts(params)
        model = self.models.embedding
        if model is None:
            raise errors.InvalidInput("this runtime has no embedding model",
                                      code="unknown_model", field="model")
        embedder = model.get()
        if self._embed_limiter.statistics().tasks_waiting >= EMBED_QUEUE:
            raise errors.OverCapacity("the embedding queue is full", retry_after=1)
        tokens = [len(embedder.tokenize(t)) for t in texts]
        vectors = await trio.to_thread.run_sync(embedder.embed, texts,
                                                limiter=self._embed_limiter)
        rows = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
        return {"model": model.name, "dim": embedder.dim, "vectors_b64": rows,
                "tokens": tokens, "identity": self._ran(model.artifact_sha256,
                                                        model.descriptor)}

    async def _load_model(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``model.load``: load a GGUF file (the router exported it from its store) for a
        release or scratch revision this runtime has not loaded; its identity row."""
        actions, _ = self._actions(params)
        if "models_invoke" not in actions:
            raise errors.Forbidden("the principal lacks the models_invoke action",
                                   action="models_invoke", reason="deployment_grant")
        path, sha, descriptor = validate.model_load(params)
        async with self._load_lock:
            for row in self.models.identity():
                if row["artifact_sha256"] == sha and row["kind"] == "textgen" and (
                        descriptor is None
                        or row["descriptor_sha256"] == descriptor_sha256(descriptor)):
                    return row
            loaded = [m for m in self.models if m.name.startswith("artifact-")]
            if len(loaded) >= MAX_LOADED_ON_DEMAND:
                raise errors.OverCapacity(f"{len(loaded)} models are loaded on demand (the "
                                          "limit)", retry_after=60)
            model = await trio.to_thread.run_sync(self.models.load_gguf, path, sha,
                                                  descriptor)
            if model.name in self.models.text:
                model.engine.close()
                raise errors.Conflict("another descriptor of this artifact is loaded",
                                      code="artifact_loaded", field="descriptor")
            self.models.text[model.name] = model
        return next(r for r in self.models.identity() if r["name"] == model.name)

    async def _metrics(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The runtime's numbers for the gateway's ``/metrics`` (no principal: the
        gateway checks ``metrics_read`` itself; nothing here is per-participant)."""
        models = {}
        for m in self.models:
            kv = m.engine.kv_stats()
            models[m.name] = {"kv_pages": kv.n_pages, "kv_free_pages": kv.free_pages,
                              "kv_used_pages": kv.used_pages,
                              "kv_shared_pages": kv.shared_pages, "sequences": kv.n_seqs,
                              "kv_page_bytes": kv.page_bytes}
        save = self.save_state()
        out: dict[str, Any] = {"models": models,
                               "journal": {"saved_records": save.saved_records,
                                           "pending_bytes": save.pending_bytes,
                                           "hold": save.hold,
                                           "tick_seconds": self.saver.tick_seconds.snapshot(),
                                           "fsync_seconds":
                                               self.saver.fsync_seconds.snapshot()}}
        if self.executor is not None:
            out["executor"] = self.executor.metrics()
        return out

    async def _save_state(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return render.render_save(self.save_state())

    async def _participant(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        v = self.device.participant(grants, key, key)
        nxt, floor = render.counter(v.next_sequence), render.counter(v.retry_floor)
        participant = None
        if v.registered:
            participant = {"id": format_id(vocab.PREFIXES["participant"], self.lineage, key),
                           "principal": params["principal"],
                           "next_sequence": nxt, "retry_floor": floor}
        return {"lineage": self.lineage, "participant": participant,
                "next_sequence": nxt, "retry_floor": floor}

    async def _space(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        await self._saved_for(key, [("space", space)])
        return render.render_space(self.device.space(grants, key, space), self.lineage)

    async def _spaces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        cursor, limit = validate.cursor(params)
        await self._saved_for(key, [("spaces", "*")])
        rows, nxt = self.device.spaces(grants, key, cursor, limit)
        if await self._saved_for(key, [("space", r.id) for r in rows]):
            rows, nxt = self.device.spaces(grants, key, cursor, limit)
        return render.render_page([render.render_space(r, self.lineage) for r in rows], nxt)

    async def _members(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self._saved_for(key, [("space", space)])
        rows, nxt = self.device.members(grants, key, space, cursor, limit)
        # another member's counters are never shown, and its row may name a principal
        # that has not registered: only the caller's own row reads its participant
        items = [render.render_member(r, self.device.participant(grants, key, r.participant)
                                      if r.participant == key else
                                      Participant(r.participant, True, None, None),
                                      self.lineage) for r in rows]
        return render.render_page(items, nxt)

    async def _conversations(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self._saved_for(key, [("space", space)])
        rows, nxt = self.device.conversations(grants, key, space, cursor, limit)
        if await self._saved_for(key, [("conversation", r.id) for r in rows]):
            rows, nxt = self.device.conversations(grants, key, space, cursor, limit)
        return render.render_page(
            [render.render_conversation(r, self.lineage) for r in rows], nxt)

    async def _conversation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        await self._saved_for(key, [("conversation", con)])
        return render.render_conversation(self.device.conversation(grants, key, con),
                                          self.lineage)

    async def _conversation_events(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self._saved_for(key, [])   # events are saved inputs; rights may be unsaved
        return conv_events.page(self.device, grants, key, con, cursor, limit, self.lineage)

    async def _watch_conversation(self, params: Mapping[str, Any],
                                  ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``conversation.watch``: the conversation's events from ``cursor`` on, each
        pushed once its admission is saved (runtime/conv_events.py)."""
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        cursor, _ = validate.cursor(params)
        return await conv_events.watch(self.device, self.saver, lambda: self._caller(params),
                                       con, cursor, self.lineage, fanout=self.fanout)

    async def _operation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        return render.render_receipt(await self._saved_receipt(grants, key, op), self.lineage)

    async def _result(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self._caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        offset = validate.offset(params)
        receipt = await self._saved_receipt(grants, key, op)
        if receipt.status == "deadline_exceeded":
            raise errors.DeadlineExceeded(
                "the operation ran past its execution deadline", operation=format_id(
                    vocab.PREFIXES["operation"], self.lineage, op),
                output_bytes=receipt.result_len)
        data, total = self.device.result(grants, key, op, offset, READ_CHUNK)
        return {
            "operation": format_id(vocab.PREFIXES["operation"], self.lineage, op),
            "status": receipt.status,
            **render.render_span(offset, data),
            "total": total,
            "finished": receipt.status in TERMINAL,
            "finish": receipt.finish,
            "input_tokens": receipt.input_tokens,
            "output_tokens": receipt.output_tokens,
        }

    # -- no dirty reads -----------------------------------------------------------
    async def _saved_for(self, reader: str, keys: list[Key]) -> bool:
        """Wait until no other participant's unsaved admission changes what ``keys``
        name; True when it waited (the caller reads again)."""
        last = self.unsaved.blocking(self.saver.saved_records, reader,
                                     [("spaces", reader), *keys])
        if last is None:
            return False
        await self._wait_record(last)
        return True

    async def _wait_record(self, record: int) -> None:
        self.saver.wake()
        with trio.move_on_after(self.read_wait) as waited:
            await self.saver.wait_saved(record)
        if waited.cancelled_caught:
            raise errors.SavePending(
                "the read would show another participant's admission that is not saved "
                "yet; retry once the journal saves it", reason="unsaved_state",
                retry_after=1)

    async def _saved_receipt(self, grants: int, key: str, op: str) -> Receipt:
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

    # -- mutations ----------------------------------------------------------------
    async def _submit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        receipt, created = await self._admit(params)
        return {"receipt": render.render_receipt(receipt, self.lineage), "created": created}

    async def submit_json(self, params: Mapping[str, Any]) -> tuple[bytes, bool, str]:
        """``mutation.submit`` for the in-process gateway: (the receipt as the gateway's
        JSON bytes, created, operation id); the same receipt, rendered once, directly
        (:func:`aotx_trio.runtime.render.receipt_json`)."""
        receipt, created = await self._admit(params)
        return (render.receipt_json(receipt, self.lineage), created,
                format_id(vocab.PREFIXES["operation"], self.lineage, receipt.op_id))

    async def _admit(self, params: Mapping[str, Any]) -> tuple[Receipt, bool]:
        """Admit one mutation and wait for its save: (its receipt read after the save,
        created)."""
        grants, key = self._caller(params)
        kind = params.get("kind")
        body = params.get("body")
        if not isinstance(kind, str) or not isinstance(body, Mapping):
            raise errors.InvalidInput("mutation.submit needs kind and body", field="kind")
        req = validate.build_request(kind, body, self.lineage)
        model = None
        if req.kind == vocab.Kind.INPUT:
            model = self._input_model(req.model, req.max_output_tokens)
            self._check_media(key, req.media, model)
        limits = getattr(self.grants, "quotas", None)
        if limits is not None:
            self.quotas.check(limits, key, req)
        receipt = self.device.submit(grants, key, req)
        created = not receipt.retry
        if created:
            self.quotas.admitted(key, receipt)
            self.unsaved.add(receipt.admission_record, key, _changes(req, receipt),
                            self.saver.saved_records)
        self.saver.wake()
        if not await self.saver.wait_saved(receipt.admission_record, self.save_timeout):
            raise errors.SavePending(
                f"operation admitted but not saved within {self.save_timeout:g} s; an exact "
                "retry answers with its receipt once it is saved",
                operation=format_id(vocab.PREFIXES["operation"], self.lineage, receipt.op_id),
                retry_after=1)
        try:  # the receipt again, with the save state after the wait
            receipt = self.device.receipt(grants, key, receipt.op_id)
        except errors.AotxError:
            pass
        if req.kind == vocab.Kind.CANCEL and self.executor is not None:
            self.executor.cancel(receipt.resource_id)   # the target operation
        if model is not None and self.executor is not None and receipt.status == "admitted" \
                and not self.executor.knows(receipt.op_id) and receipt.op_id not in self._handing:
            # saved now: retain its memory, then hand it to the executor (once; an exact
            # retry after a save that timed out hands it over here)
            text = req.text if isinstance(req.text, bytes) else req.text.encode("utf-8")
            self._handing.add(receipt.op_id)
            try:
                with trio.CancelScope(shield=True):   # retained and handed over, or neither
                    await self.memory.hand_over(self.executor, Job(
                        receipt.op_id, str(req.conversation), model,
                        Turn(history.label_of(receipt.participant), text),
                        req.max_output_tokens, req.temperature, req.top_p,
                        input_index=receipt.input_index, actor=receipt.participant), text)
            finally:
                self._handing.discard(receipt.op_id)
        return receipt, created

    async def _memory_list(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``memory.list``: the space's saved memory rows (read right on the space)."""
        grants, key = self._caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        rows, nxt = self.device.memory_list(grants, key, space, cursor, limit)
        return render.render_page([render_row(r, self.lineage) for r in rows], nxt)

    async def _memory_get(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``memory.get``: one saved memory object of the space and its payload bytes
        from ``offset``."""
        grants, key = self._caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        obj = validate.parse_id("memory", params.get("object"), self.lineage)
        offset = validate.offset(params)
        row, data = self.device.memory_read(grants, key, space, obj, offset, READ_CHUNK)
        return render_object(row, offset, data, self.lineage)

    async def _media_put(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``media.put``: store ``data`` (base64) as the caller's media; answers once it is
        durable (runtime/media.py)."""
        grants, key = self._caller(params)
        if not grants & vocab.GRANT_WRITE:
            raise errors.Forbidden("uploading media needs the shared_write grant",
                                   reason="deployment_grant", action="shared_write")
        if self.media is None:
            raise errors.NotReady("this runtime stores no media", missing="media")
        try:
            data = base64.b64decode(str(params.get("data", "")), validate=True)
        except ValueError:
            raise errors.InvalidInput("data must be base64", field="data") from None
        if not data:
            raise errors.InvalidInput("an upload needs at least one byte", field="body")
        media, created = await media_quota(self.media).put(  # quotas.media_bytes
            getattr(self.grants, "quotas", None), key, str(params.get("content_type", "")), data)
        return {"media": {"type": media.type, "sha256": media.sha256,
                          "content_type": media.content_type, "bytes": media.bytes},
                "created": created}

    def _check_media(self, key: str, media: tuple[tuple[str, str], ...], model: TextModel,
                     ) -> None:
        """An input's media rows: each one the actor's own upload of that type (else 404
        ``media_not_found``, whoever else uploaded it), then a model that takes them."""
        for i, (kind, sha) in enumerate(media):
            owned = None if self.media is None else self.media.owned(key, sha)
            if owned is None or owned.type != kind:
                raise errors.NotFound(f"no {kind} media {sha} uploaded by the caller",
                                      code="media_not_found", field=f"media[{i}]")
        if media:
            raise errors.InvalidInput(f"model {validate.shown(model.name)} takes text only",
                                      code="media_unsupported", field="media",
                                      model=model.name)

    def _input_model(self, name: str, max_output_tokens: int) -> TextModel:
        """The loaded text model an input names, and its output limit checked against
        that model's context (422 naming the field)."""
        if self.executor is None:
            raise errors.InvalidInput("this runtime runs no models", code="unknown_model",
                                      field="model", model=name)
        model = self.models.get(name)
        if max_output_tokens > model.context - 1:
            raise errors.InvalidInput(
                f"max_output_tokens {max_output_tokens} is over the context of {name!r} "
                f"({model.context} positions, one at least for the input)",
                field="max_output_tokens", limit=model.context - 1)
        return model

    # -- streams ------------------------------------------------------------------
    async def _watch_saves(self, params: Mapping[str, Any],
                           ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``save.watch``: opens with the current save state, then pushes it each time
        the journal saves more records; ends (``complete``) after ``limit`` items when
        one is given."""
        limit = params.get("limit")
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool)
                                  or limit < 1):
            raise errors.InvalidInput("limit must be a positive integer", field="limit")

        opened = self.save_state()

        async def items() -> AsyncIterator[dict[str, Any]]:
            # each item: a save after the last state shown (counted from the opening
            # state, not from whenever this generator first runs: a save in between
            # is pushed, not skipped)
            shown = opened.saved_records
            sent = 0
            while limit is None or sent < limit:
                await self.saver.wait_saved(shown)
                sent += 1
                state = self.save_state()
                shown = state.saved_records
                yield render.render_save(state)

        return render.render_save(opened), items()

    async def _watch_operation(self, params: Mapping[str, Any],
                               ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``operation.watch``: opens with the receipt, then pushes the operation's output
        bytes from ``offset`` as they are produced (``{"offset", "length", "data",
        "text"}``), then one ``{"end": status, "receipt"}`` once it is terminal and every
        byte was pushed.  Each push re-checks that the caller may still read it."""
        grants, key = self._caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        offset = validate.offset(params)
        first = await self._saved_receipt(grants, key, op)
        chunk = render.render_span

        async def items() -> AsyncIterator[dict[str, Any]]:
            pos = offset
            while True:
                grants_now, _ = self._caller(params)
                receipt = self.device.receipt(grants_now, key, op)
                if receipt.status in TERMINAL:
                    receipt = await self._saved_receipt(grants_now, key, op)
                    while True:
                        data, total = self.device.result(grants_now, key, op, pos, READ_CHUNK)
                        if data:
                            yield chunk(pos, data)
                            pos += len(data)
                        if not data or pos >= total:
                            break
                    yield {"end": receipt.status,
                           "receipt": render.render_receipt(receipt, self.lineage)}
                    return
                if self.fanout is not None and self.executor is not None \
                        and self.executor.knows(op):   # running: follow the fanout's spans
                    with self.fanout.follow_operation(op, key, lambda: self._caller(params),
                                                      pos, self.executor) as spans:
                        async for span in spans:
                            yield span
                            pos = span["next_offset"]
                    continue
                # live bytes to the actor only; anyone else reads what is saved
                live = self.executor.output(op) \
                    if self.executor is not None and receipt.participant == key else None
                if live is not None and len(live) > pos:
                    yield chunk(pos, live[pos:])
                    pos = len(live)
                    continue
                if self.executor is None:
                    await trio.sleep(0.05)      # nothing runs it here: poll the device
                else:
                    await self.executor.wait_progress()

        return render.render_receipt(first, self.lineage), items()

    async def _chat(self, params: Mapping[str, Any],
                    ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``chat.generate``: an ordinary (nothing persists) chat completion on a loaded
        text model, through the same executor, KV pool and admission order as shared
        inputs (``prompt`` instead of ``messages``: raw text continued as is).  Opens
        with ``{"model", "id", "prompt_tokens", "identity"}``; pushes ``{"text"}``
        pieces (never a part of a stop sequence); ends with one ``{"finish_reason",
        "usage"}``.  Leaving the stream early cancels the generation."""
        actions, _ = self._actions(params)
        if "models_invoke" not in actions:
            raise errors.Forbidden("the principal lacks the models_invoke action",
                                   action="models_invoke", reason="deployment_grant")
        if self.executor is None:
            raise errors.RuntimeUnavailable("this runtime runs no models")
        executor = self.executor
        req = validate.chat_request(params)
        model = self.models.get(req.model)
        prompt = render_chat(model.engine, req.messages) if req.prompt is None else \
            model.engine.tokenize(req.prompt, add_bos=True, parse_special=False)
        max_out = req.max_tokens if req.max_tokens is not None \
            else max(1, model.context - len(prompt))
        if len(prompt) + max_out > model.context:
            raise errors.InvalidInput(
                f"{len(prompt)} prompt tokens + max_tokens {max_out} are over the context "
                f"of {req.model!r} ({model.context})", code="context_length_exceeded",
                field="messages")
        job_id = secrets.token_hex(16)
        job = Job(job_id, "", model, Turn("", b""), max_out, req.temperature, req.top_p,
                  prompt=prompt, ephemeral=True, stop=req.stop, seed=req.seed)
        try:
            executor.submit(job)
        except trio.WouldBlock:
            raise errors.OverCapacity("the runtime's admission queue is full",
                                      retry_after=1) from None
        hold = max((len(s) for s in req.stop), default=1) - 1

        async def items() -> AsyncIterator[dict[str, Any]]:
            sent = 0
            try:
                while True:
                    done = executor.ended(job_id)
                    data = bytes(job.out)
                    safe = len(data) if done is not None else max(sent, len(data) - hold)
                    if safe > sent:
                        yield {"text": data[sent:safe].decode("utf-8", errors="replace")}
                        sent = safe
                    if done is not None:
                        yield {"finish_reason": done.finish or "stop", "usage": {
                            "prompt_tokens": len(prompt),
                            "completion_tokens": len(done.out_tokens),
                            "total_tokens": len(prompt) + len(done.out_tokens)}}
                        return
                    await executor.wait_progress()
            finally:
                executor.abandon(job_id)    # if the caller left early: free its pages

        return {"model": req.model, "id": job_id, "prompt_tokens": len(prompt),
                "identity": self._ran(model.digest, model.descriptor)}, items()
        return {"model": req.model, "id": job_id, "prompt_tokens": len(prompt)}, items()


def _changes(req: Request, receipt: Receipt) -> list[Key]:
    """What an admission changes, as :class:`aotx_trio.runtime.unsaved.Unsaved` keys."""
    kind = req.kind
    if kind == vocab.Kind.SPACE_CREATE:
        keys: list[Key] = [("space", receipt.resource_id)]
        if req.scope == "instance":
            keys.append(("spaces", "*"))
        return keys
    if kind == vocab.Kind.MEMBER_SET:
        return [("space", str(req.space)), ("spaces", str(req.participant))]
    if kind == vocab.Kind.CONVERSATION_CREATE:
        return [("space", str(req.space)), ("conversation", receipt.resource_id)]
    if kind == vocab.Kind.INPUT:
        return [("conversation", str(req.conversation))]
    if kind == vocab.Kind.CANCEL:
        return [("operation", receipt.resource_id)]
    return []
