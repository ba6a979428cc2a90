"""Device records as the JSON resources of docs/api.md.

Every counter that can pass 2**53 is a decimal string; ids are the
``{prefix}-{lineage}-{32 hex}`` forms of :mod:`aotx_trio.vocab`.  Pure
functions over :mod:`aotx_trio.native.device_codec` views; nothing here touches the device.
"""

from __future__ import annotations

import base64
import errno
import json
from typing import Any

from aotx_trio.native import device_codec as dev
from aotx_trio.native import journal
from aotx_trio.vocab import KIND_NAMES, PREFIXES, TERMINAL, Kind, format_id

#: The journal's hold bits and their names (csrc/journal/aotx_journal.h, AOTX_HOLD_*).
HOLD_REASONS = ((1, "file_cap"), (2, "disk"), (4, "pending_cap"))
#: The resource a receipt's ``resource`` names, by kind (a cancellation: its target).
RESOURCE_PREFIX: dict[Kind, str] = {
    Kind.REGISTER: PREFIXES["participant"], Kind.SPACE_CREATE: PREFIXES["space"],
    Kind.MEMBER_SET: PREFIXES["space"], Kind.CONVERSATION_CREATE: PREFIXES["conversation"],
    Kind.INPUT: PREFIXES["conversation"], Kind.CANCEL: PREFIXES["operation"],
    Kind.PUBLISH: PREFIXES["space"],
}
ZERO16 = "0" * 32


def counter(value: int | None) -> str | None:
    """A u64 counter as JSON: a decimal string, or null."""
    return None if value is None else str(value)


def hold_names(save: journal.SaveState) -> list[str]:
    """The names of the journal's holds now (none: writes are admitted)."""
    return [name for bit, name in HOLD_REASONS if int(save.hold) & bit]


def render_save(save: journal.SaveState) -> dict[str, Any]:
    """The ``save`` object: which journal save this state is, and its trouble."""
    err = int(save.disk_error)
    return {
        "source": "journal",
        "file_incarnation": f"{int(save.file_incarnation):016x}",
        "generation": str(int(save.generation)),
        "boot": str(int(save.boot)),
        "commit_digest": save.commit_digest.hex(),
        "saved_records": str(int(save.saved_records)),
        "pending_bytes": int(save.pending_bytes),
        "disk_error": None if err == 0 else {"errno": err,
                                             "name": errno.errorcode.get(err, str(err))},
        "hold": hold_names(save),
    }


def render_receipt_save(r: dev.Receipt) -> dict[str, Any]:
    """A receipt's ``save``: the identity of the save that acknowledged its admission
    (``r.saved_by``: file incarnation, generation, boot, commit digest and the records
    it covers; frozen once saved, null before), with the journal's pending bytes, disk
    error and hold as read now."""
    out = render_save(r.save)
    ack = r.saved_by
    out.update({
        "file_incarnation": None if ack is None else f"{int(ack.file_incarnation):016x}",
        "generation": None if ack is None else str(int(ack.generation)),
        "boot": None if ack is None else str(int(ack.boot)),
        "commit_digest": None if ack is None else ack.commit_digest.hex(),
        "saved_records": None if ack is None else str(int(ack.commit_records)),
    })
    return out


def render_receipt(r: dev.Receipt, lineage: str) -> dict[str, Any]:
    """A receipt as the operation resource."""
    prefix = RESOURCE_PREFIX.get(r.kind)
    saved = int(r.save.saved_records)
    admission_saved = r.admission_saved or saved > r.admission_record
    terminal_record = r.terminal_record
    terminal_saved = r.terminal_saved or (
        r.status in TERMINAL and terminal_record is not None and saved > terminal_record)
    return {
        "operation": format_id(PREFIXES["operation"], lineage, r.op_id),
        "kind": KIND_NAMES.get(r.kind, str(int(r.kind))),
        "status": r.status,
        "participant": format_id(PREFIXES["participant"], lineage, r.participant),
        "operation_key": r.operation_key,
        "sequence": counter(r.sequence),
        "resource": format_id(prefix, lineage, r.resource_id)
        if prefix and r.resource_id != ZERO16 else None,
        "transport": {"accepted": True},
        "device": {"committed": r.device_committed,
                   "admission_number": str(r.admission_number)},
        "admission": {"saved": admission_saved, "record": str(r.admission_record)},
        "terminal": {"saved": terminal_saved, "record": counter(terminal_record)},
        "cancel_requested": r.cancel_requested,
        "finish": r.finish,
        "result": {"bytes": r.result_len, "input_tokens": r.input_tokens,
                   "output_tokens": r.output_tokens},
        "save": render_receipt_save(r),
    }


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_BOOL = ("false", "true")


def _js(value: str | None) -> str:
    """A string (or null) as JSON, as the gateway's encoder writes it (ASCII letters and
    digits only, e.g. a hex id or a status name, need no escape: quoted as they are)."""
    if value is None:
        return "null"
    if value.isascii() and value.isalnum():
        return f'"{value}"'
    return _ENCODER.encode(value)


def receipt_json(r: dev.Receipt, lineage: str) -> bytes:
    """``render_receipt(r, lineage)`` as the gateway's compact JSON bytes (the
    gateway's ``dumps``: ``separators=(",", ":")``, ``ensure_ascii=False``), written
    directly: the mutation routes answer with it, without building the dict.  Every
    value is a hex id, a decimal, a bool or a name from a fixed table; the names go
    through the encoder (tests/test_render.py checks it against ``render_receipt``
    over generated receipts)."""
    prefix = RESOURCE_PREFIX.get(r.kind)
    saved = int(r.save.saved_records)
    admission_saved = r.admission_saved or saved > r.admission_record
    terminal_record = r.terminal_record
    terminal_saved = r.terminal_saved or (
        r.status in TERMINAL and terminal_record is not None and saved > terminal_record)
    resource = f'"{prefix}-{lineage}-{r.resource_id}"' \
        if prefix and r.resource_id != ZERO16 else "null"
    seq = "null" if r.sequence is None else f'"{int(r.sequence)}"'
    terminal = "null" if terminal_record is None else f'"{terminal_record}"'
    op, par = PREFIXES["operation"], PREFIXES["participant"]
    kind = _js(KIND_NAMES.get(r.kind, str(int(r.kind))))
    return (
        f'{{"operation":"{op}-{lineage}-{r.op_id}","kind":{kind},'
        f'"status":{_js(r.status)},"participant":"{par}-{lineage}-{r.participant}",'
        f'"operation_key":{_js(r.operation_key)},"sequence":{seq},'
        f'"resource":{resource},"transport":{{"accepted":true}},'
        f'"device":{{"committed":{_BOOL[bool(r.device_committed)]},'
        f'"admission_number":"{r.admission_number}"}},'
        f'"admission":{{"saved":{_BOOL[bool(admission_saved)]},'
        f'"record":"{r.admission_record}"}},'
        f'"terminal":{{"saved":{_BOOL[bool(terminal_saved)]},"record":{terminal}}},'
        f'"cancel_requested":{_BOOL[bool(r.cancel_requested)]},"finish":{_js(r.finish)},'
        f'"result":{{"bytes":{int(r.result_len)},"input_tokens":{int(r.input_tokens)},'
        f'"output_tokens":{int(r.output_tokens)}}},'
        f'"save":{_receipt_save_json(r)}}}').encode()


def _receipt_save_json(r: dev.Receipt) -> str:
    """``render_receipt_save(r)`` as JSON text (see :func:`receipt_json`)."""
    save, ack = r.save, r.saved_by
    err = int(save.disk_error)
    disk = "null" if err == 0 else \
        f'{{"errno":{err},"name":{_js(errno.errorcode.get(err, str(err)))}}}'
    hold = ",".join(f'"{name}"' for name in hold_names(save))
    ident = 'null,"generation":null,"boot":null,"commit_digest":null,"saved_records":null' \
        if ack is None else (
            f'"{int(ack.file_incarnation):016x}","generation":"{int(ack.generation)}",'
            f'"boot":"{int(ack.boot)}","commit_digest":{_js(ack.commit_digest.hex())},'
            f'"saved_records":"{int(ack.commit_records)}"')
    return (f'{{"source":"journal","file_incarnation":{ident},'
            f'"pending_bytes":{int(save.pending_bytes)},"disk_error":{disk},'
            f'"hold":[{hold}]}}')


def render_space(v: dev.Space, lineage: str) -> dict[str, Any]:
    return {
        "id": format_id(PREFIXES["space"], lineage, v.id),
        "scope": v.scope,
        "owner": format_id(PREFIXES["participant"], lineage, v.owner),
        "permissions": list(v.rights),
        "conversations": str(v.conversations),
        "admission_number": str(v.admission_number),
    }


def render_member(m: dev.Member, p: dev.Participant, lineage: str) -> dict[str, Any]:
    """A member row with the member's counters as the caller may see them."""
    return {
        "participant": format_id(PREFIXES["participant"], lineage, m.participant),
        "permissions": list(m.rights),
        "next_sequence": counter(p.next_sequence),
        "retry_floor": counter(p.retry_floor),
    }


def render_conversation(v: dev.Conversation, lineage: str) -> dict[str, Any]:
    return {
        "id": format_id(PREFIXES["conversation"], lineage, v.id),
        "space": format_id(PREFIXES["space"], lineage, v.space),
        "creator": format_id(PREFIXES["participant"], lineage, v.creator),
        "inputs": str(v.inputs),
        "admission_number": str(v.admission_number),
    }


def render_page(items: list[dict[str, Any]], next_cursor: int) -> dict[str, Any]:
    """A list page: ``next_cursor`` is null at the end."""
    return {"items": items, "next_cursor": str(next_cursor) if next_cursor else None}


def render_span(offset: int, data: bytes) -> dict[str, Any]:
    """A span of an operation's output bytes: exact base64, its length, where the next
    read starts, and the text only when the span is complete UTF-8."""
    return {"offset": offset, "length": len(data),
            "data": base64.b64encode(data).decode("ascii"), "text": text_or_none(data),
            "next_offset": offset + len(data)}


def text_or_none(data: bytes) -> str | None:
    """The span as text only when it is complete UTF-8 (never replaced)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None
