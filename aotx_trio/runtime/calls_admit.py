"""Mutations: ``mutation.submit`` admits one on the device (quotas checked), waits for
the journal to save the admission, and hands a saved input to the executor (its
memory retained first)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from aotx_trio import errors, vocab
from aotx_trio.native.device_codec import Receipt, Request
from aotx_trio.runtime import history, render, validate
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.calls_media import check_media
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.memory import MemoryService
from aotx_trio.runtime.prompt import Turn
from aotx_trio.runtime.quota import Quotas
from aotx_trio.runtime.save_gate import SaveGate
from aotx_trio.runtime.served import TextModel
from aotx_trio.runtime.services import Method, Services
from aotx_trio.runtime.unsaved import Key
from aotx_trio.vocab import format_id


class Admissions:
    """``handing``: the inputs being retained and handed over (shared by every
    rebuild of the group, like ``quotas``)."""

    def __init__(self, services: Services, callers: Callers, gate: SaveGate,
                 quotas: Quotas, memory: MemoryService, handing: set[str]) -> None:
        self.services = services
        self.callers = callers
        self.gate = gate
        self.quotas = quotas
        self.memory = memory
        self.handing = handing

    def methods(self) -> dict[str, Method]:
        return {"mutation.submit": self.submit}

    async def submit(self, params: Mapping[str, Any]) -> dict[str, Any]:
        receipt, created = await self.admit(params)
        return {"receipt": render.render_receipt(receipt, self.services.lineage),
                "created": created}

    async def submit_json(self, params: Mapping[str, Any]) -> tuple[bytes, bool, str]:
        """``mutation.submit`` for the in-process gateway: (the receipt as the gateway's
        JSON bytes, created, operation id); the same receipt, rendered once, directly
        (:func:`aotx_trio.runtime.render.receipt_json`)."""
        receipt, created = await self.admit(params)
        lineage = self.services.lineage
        return (render.receipt_json(receipt, lineage), created,
                format_id(vocab.PREFIXES["operation"], lineage, receipt.op_id))

    async def admit(self, params: Mapping[str, Any]) -> tuple[Receipt, bool]:
        """Admit one mutation and wait for its save: (its receipt read after the save,
        created)."""
        s = self.services
        grants, key = self.callers.caller(params)
        kind = params.get("kind")
        body = params.get("body")
        if not isinstance(kind, str) or not isinstance(body, Mapping):
            raise errors.InvalidInput("mutation.submit needs kind and body", field="kind")
        req = validate.build_request(kind, body, s.lineage)
        model = None
        if req.kind == vocab.Kind.INPUT:
            model = self._input_model(req.model, req.max_output_tokens)
            check_media(s.media, key, req.media, model)
        limits = self.callers.quota_limits()
        if limits is not None:
            self.quotas.check(limits, key, req, self._memory_rows(req, model))
        receipt = s.device.submit(grants, key, req)
        created = not receipt.retry
        if created:
            self.quotas.admitted(key, receipt)
            self.gate.unsaved.add(receipt.admission_record, key, _changes(req, receipt),
                                  s.saver.saved_records)
        await self.gate.admission_saved(receipt)
        try:  # the receipt again, with the save state after the wait
            receipt = s.device.receipt(grants, key, receipt.op_id)
        except errors.AotxError:
            pass
        executor = s.executor
        if req.kind == vocab.Kind.CANCEL and executor is not None:
            executor.cancel(receipt.resource_id)   # the target operation
        if model is not None and executor is not None and receipt.status == "admitted" \
                and not executor.knows(receipt.op_id) and receipt.op_id not in self.handing:
            # saved now: retain its memory, then hand it to the executor (once; an exact
            # retry after a save that timed out hands it over here)
            text = req.text if isinstance(req.text, bytes) else req.text.encode("utf-8")
            self.handing.add(receipt.op_id)
            try:
                with trio.CancelScope(shield=True):   # retained and handed over, or neither
                    await self.memory.hand_over(executor, Job(
                        receipt.op_id, str(req.conversation), model,
                        Turn(history.label_of(receipt.participant), text),
                        req.max_output_tokens, req.temperature, req.top_p,
                        input_index=receipt.input_index, actor=receipt.participant), text)
            finally:
                self.handing.discard(receipt.op_id)
        return receipt, created

    def _memory_rows(self, req: Request, model: TextModel | None) -> int:
        """The memory rows an admission adds (``quotas.memory_rows``): a publication its
        two copies; an input with text, when memory is retained, its text and embedding
        rows and, in mode 2, the interpretation and its embedding."""
        if req.kind == vocab.Kind.PUBLISH:
            return 2
        if req.kind != vocab.Kind.INPUT or model is None or not req.text \
                or not self.memory.enabled:
            return 0
        return 4 if self.memory.retention_mode(model) == 2 else 2

    def _input_model(self, name: str, max_output_tokens: int) -> TextModel:
        """The loaded text model an input names, and its output limit checked against
        that model's context (422 naming the field)."""
        if self.services.executor is None:
            raise errors.InvalidInput("this runtime runs no models", code="unknown_model",
                                      field="model", model=name)
        model = self.services.models.get(name)
        if max_output_tokens > model.context - 1:
            raise errors.InvalidInput(
                f"max_output_tokens {max_output_tokens} is over the context of {name!r} "
                f"({model.context} positions, one at least for the input)",
                field="max_output_tokens", limit=model.context - 1)
        return model


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
