"""Reads of the shared state (participants, spaces, members, conversations, their
events, operations and their output) and the ``conversation.watch`` and
``operation.watch`` streams; each shows another participant's admission only once it
is saved (runtime/save_gate.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import trio

from aotx_trio import errors, vocab
from aotx_trio.native.device_codec import Participant
from aotx_trio.runtime import conv_events, render, validate
from aotx_trio.runtime.callers import Callers
from aotx_trio.runtime.save_gate import SaveGate
from aotx_trio.runtime.services import READ_CHUNK, Method, Services, StreamMethod
from aotx_trio.vocab import TERMINAL, format_id


class SharedReads:
    def __init__(self, services: Services, callers: Callers, gate: SaveGate) -> None:
        self.services = services
        self.callers = callers
        self.gate = gate
        self.device = services.device
        self.lineage = services.lineage

    def methods(self) -> dict[str, Method]:
        return {"participant.get": self.participant, "space.get": self.space,
                "space.list": self.spaces, "member.list": self.members,
                "conversation.list": self.conversations,
                "conversation.get": self.conversation,
                "conversation.events": self.conversation_events,
                "operation.get": self.operation, "operation.result": self.result}

    def streams(self) -> dict[str, StreamMethod]:
        return {"operation.watch": self.watch_operation,
                "conversation.watch": self.watch_conversation}

    async def participant(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        v = self.device.participant(grants, key, key)
        nxt, floor = render.counter(v.next_sequence), render.counter(v.retry_floor)
        participant = None
        if v.registered:
            participant = {"id": format_id(vocab.PREFIXES["participant"], self.lineage, key),
                           "principal": params["principal"],
                           "next_sequence": nxt, "retry_floor": floor}
        return {"lineage": self.lineage, "participant": participant,
                "next_sequence": nxt, "retry_floor": floor}

    async def space(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        await self.gate.saved_for(key, [("space", space)])
        return render.render_space(self.device.space(grants, key, space), self.lineage)

    async def spaces(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        cursor, limit = validate.cursor(params)
        await self.gate.saved_for(key, [("spaces", "*")])
        rows, nxt = await self.gate.saved_page(
            key, "space", lambda: self.device.spaces(grants, key, cursor, limit))
        return render.render_page([render.render_space(r, self.lineage) for r in rows], nxt)

    async def members(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self.gate.saved_for(key, [("space", space)])
        rows, nxt = self.device.members(grants, key, space, cursor, limit)
        # another member's counters are never shown, and its row may name a principal
        # that has not registered: only the caller's own row reads its participant
        items = [render.render_member(r, self.device.participant(grants, key, r.participant)
                                      if r.participant == key else
                                      Participant(r.participant, True, None, None),
                                      self.lineage) for r in rows]
        return render.render_page(items, nxt)

    async def conversations(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        space = validate.parse_id("space", params.get("space"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self.gate.saved_for(key, [("space", space)])
        rows, nxt = await self.gate.saved_page(
            key, "conversation",
            lambda: self.device.conversations(grants, key, space, cursor, limit))
        return render.render_page(
            [render.render_conversation(r, self.lineage) for r in rows], nxt)

    async def conversation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        await self.gate.saved_for(key, [("conversation", con)])
        return render.render_conversation(self.device.conversation(grants, key, con),
                                          self.lineage)

    async def conversation_events(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        cursor, limit = validate.cursor(params)
        await self.gate.saved_for(key, [])   # events are saved inputs; rights may be unsaved
        return conv_events.page(self.device, grants, key, con, cursor, limit, self.lineage)

    async def watch_conversation(self, params: Mapping[str, Any],
                                 ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``conversation.watch``: the conversation's events from ``cursor`` on, each
        pushed once its admission is saved (runtime/conv_events.py)."""
        con = validate.parse_id("conversation", params.get("conversation"), self.lineage)
        cursor, _ = validate.cursor(params)
        return await conv_events.watch(self.device, self.services.saver,
                                       lambda: self.callers.caller(params), con, cursor,
                                       self.lineage, fanout=self.services.fanout)

    async def operation(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        return render.render_receipt(await self.gate.saved_receipt(grants, key, op),
                                     self.lineage)

    async def result(self, params: Mapping[str, Any]) -> dict[str, Any]:
        grants, key = self.callers.caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        offset = validate.offset(params)
        receipt = await self.gate.saved_receipt(grants, key, op)
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

    async def watch_operation(self, params: Mapping[str, Any],
                              ) -> tuple[dict[str, Any], AsyncIterator[dict[str, Any]]]:
        """``operation.watch``: opens with the receipt, then pushes the operation's output
        bytes from ``offset`` as they are produced (``{"offset", "length", "data",
        "text"}``), then one ``{"end": status, "receipt"}`` once it is terminal and every
        byte was pushed.  Each push re-checks that the caller may still read it."""
        grants, key = self.callers.caller(params)
        op = validate.parse_id("operation", params.get("operation"), self.lineage)
        offset = validate.offset(params)
        first = await self.gate.saved_receipt(grants, key, op)
        chunk = render.render_span
        executor, fanout = self.services.executor, self.services.fanout

        async def items() -> AsyncIterator[dict[str, Any]]:
            pos = offset
            while True:
                grants_now, _ = self.callers.caller(params)
                receipt = self.device.receipt(grants_now, key, op)
                if receipt.status in TERMINAL:
                    receipt = await self.gate.saved_receipt(grants_now, key, op)
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
                if fanout is not None and executor is not None \
                        and executor.knows(op):   # running: follow the fanout's spans
                    with fanout.follow_operation(op, key, lambda: self.callers.caller(params),
                                                 pos, executor) as spans:
                        async for span in spans:
                            yield span
                            pos = span["next_offset"]
                    continue
                # live bytes to the actor only; anyone else reads what is saved
                live = executor.output(op) \
                    if executor is not None and receipt.participant == key else None
                if live is not None and len(live) > pos:
                    yield chunk(pos, live[pos:])
                    pos = len(live)
                    continue
                if executor is None:
                    await trio.sleep(0.05)      # nothing runs it here: poll the device
                else:
                    await executor.wait_progress()

        return render.render_receipt(first, self.lineage), items()
