"""The shared-state device: codes, ids, canonical bytes, rights, retirement,
results, recovery, and (in a child process on a small-capacity build) capacities."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native import device_codec as codec
from aotx_trio.native import lib as native
from aotx_trio.native.journal import JournalReader, SaveId, SaveState
from aotx_trio.native.lib import ffi, lib

ROOT = Path(__file__).resolve().parent.parent
L = "0123456789abcdef0123456789abcdef"
A, B, C = "a1" * 16, "b2" * 16, "c3" * 16
ALL = D.ALL_GRANTS


class Journal:
    def __init__(self) -> None:
        p = ffi.new("aotx_journal_params *")
        lib.aotx_journal_default_params(p)
        ffi.memmove(p.lineage, bytes.fromhex(L), 16)
        p.file_incarnation = 0x77
        out = ffi.new("aotx_journal **")
        native.check(lib.aotx_journal_new(p, out))
        self.handle = ffi.gc(out[0], lib.aotx_journal_free)
        buf = ffi.new("uint8_t[64]")
        assert lib.aotx_journal_header_encode(self.handle, buf, 64) == 64
        self.file = bytearray(bytes(buf))

    def save(self) -> None:
        buf = ffi.new("uint8_t[]", 192 * 16)
        first = ffi.new("uint64_t *")
        while (n := lib.aotx_journal_drain(self.handle, buf, 192 * 16, 16, first)) > 0:
            off = 64 + first[0] * 192
            self.file[off:off + n] = bytes(ffi.buffer(buf, n))
            native.check(lib.aotx_journal_ack(self.handle))
        assert n == 0

    def hold(self, on: bool) -> None:
        lib.aotx_journal_set_hold(self.handle, 2, int(on))


class Rig:
    """A device over a journal, plus a counter of sequences per principal."""

    def __init__(self) -> None:
        self.journal = Journal()
        self.dev = D.Device(self.journal, L)
        self.keys = 0

    def key(self) -> str:
        self.keys += 1
        return f"{self.keys:032x}"

    def seq(self, actor: str) -> int:
        return self.dev.participant(ALL, actor).next_sequence or 1

    def req(self, actor: str, kind: D.Kind, **kw: Any) -> D.Request:
        kw.setdefault("operation_key", self.key())
        kw.setdefault("sequence", self.seq(actor))
        return D.Request(kind=kind, lineage=kw.pop("lineage", L), **kw)

    def do(self, actor: str, kind: D.Kind, grants: int = ALL, **kw: Any) -> D.Receipt:
        return self.dev.submit(grants, actor, self.req(actor, kind, **kw))

    def register(self, *actors: str) -> None:
        for a in actors:
            self.do(a, D.Kind.REGISTER)

    def space(self, actor: str, scope: str = "private", ident: str | None = None) -> str:
        return self.do(actor, D.Kind.SPACE_CREATE, scope=scope, id=ident).resource_id

    def conversation(self, actor: str, space: str) -> str:
        return self.do(actor, D.Kind.CONVERSATION_CREATE, space=space).resource_id

    def input(self, actor: str, conv: str, grants: int = ALL, **kw: Any) -> D.Receipt:
        kw.setdefault("text", "hello")
        return self.do(actor, D.Kind.INPUT, grants, conversation=conv, model="gemma-3-270m",
                       **kw)

    def members(self, space: str, actor: str = A) -> dict[str, tuple[str, ...]]:
        rows, _ = self.dev.members(ALL, actor, space)
        return {r.participant: r.rights for r in rows}

    def snapshot(self) -> tuple[Any, ...]:
        parts = tuple(self.dev.participant(ALL, p) for p in (A, B, C))
        return (self.dev.usage(), parts)


@pytest.fixture
def rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.dev.close()


def refused(code: str, fn: Any, *args: Any, **kw: Any) -> errors.AotxError:
    with pytest.raises(errors.AotxError) as info:
        fn(*args, **kw)
    assert (info.value.native or info.value.code) == code, info.value
    return info.value


# ---- ids and canonical bytes ---------------------------------------------


def test_ids_and_formats(rig: Rig) -> None:
    r = rig.do(A, D.Kind.REGISTER)
    assert r.sequence == 1 and r.status == "succeeded" and r.kind == D.Kind.REGISTER
    assert len(r.op_id) == 32 and r.op_id != r.operation_key
    assert rig.dev.id_of("op", r.op_id) == f"op-{L}-{r.op_id}"
    body = json.loads(rig.dev.result(ALL, A, r.op_id)[0])
    assert body == {"participant": f"par-{L}-{A}"}
    s = rig.do(A, D.Kind.SPACE_CREATE, scope="room")
    assert s.resource_id == s.operation_key  # omitted id = operation key
    assert json.loads(rig.dev.result(ALL, A, s.op_id)[0]) == {
        "space": f"spc-{L}-{s.operation_key}", "scope": "room"}
    c = rig.do(A, D.Kind.CONVERSATION_CREATE, space=s.resource_id, id="ab" * 16)
    assert c.resource_id == "ab" * 16
    assert json.loads(rig.dev.result(ALL, A, c.op_id)[0]) == {
        "conversation": f"con-{L}-{'ab' * 16}", "space": f"spc-{L}-{s.resource_id}"}
    assert D.parse_resource_id("con", L, f"con-{L}-{'ab' * 16}") == "ab" * 16
    assert D.parse_resource_id("con", L, f"con-{'f' * 32}-{'ab' * 16}") is None
    assert D.parse_resource_id("spc", L, f"spc-{L}-{'AB' * 16}") is None
    # operation ids: distinct, never reused, the documented derivation of the admission number
    ops = [r.op_id, s.op_id, c.op_id]
    assert len(set(ops)) == 3
    assert [rig.dev.receipt(ALL, A, o).admission_number for o in ops] == [1, 2, 3]
    sys.path.insert(0, str(Path(__file__).parent))
    from test_device_model import model_op_id
    assert ops == [model_op_id(1), model_op_id(2), model_op_id(3)]


WORKED_SPACE = (
    "01021800" "00000000"
    "0123456789abcdef0123456789abcdef"
    "00112233445566778899aabbccddeeff"
    "0500000000000000"
    "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f" "02" "00000000000000")


def test_canonical_worked_example_and_round_trip() -> None:
    req = D.Request(D.Kind.SPACE_CREATE, L, "00112233445566778899aabbccddeeff", 5,
                    id="0f" * 16, scope="instance")
    raw = D.encode_canonical(req)
    assert raw.hex() == WORKED_SPACE  # docs/formats/device.md, worked example 1
    assert D.decode_canonical(raw) == req
    inp = D.Request(D.Kind.INPUT, L, "01" * 16, 9, conversation="0c" * 16, text="hé",
                    model="m1", temperature=0.5, media=(("audio", "ee" * 32),))
    raw = D.encode_canonical(inp)
    assert len(raw) == 48 + 48 + 33 + 2 + 3
    assert raw[1] == 5 and raw[2:4] == (48 + 33 + 2 + 3).to_bytes(2, "little")
    assert raw[48 + 24:48 + 32] == bytes.fromhex("000000000000e03f")  # 0.5 as f64 LE
    assert raw[-5:] == b"m1" + "hé".encode()
    assert D.decode_canonical(raw) == inp
    # defaults are part of the canonical form: omitted == explicit default
    assert D.encode_canonical(D.Request(D.Kind.SPACE_CREATE, L, "01" * 16, 2)) == \
        D.encode_canonical(D.Request(D.Kind.SPACE_CREATE, L, "01" * 16, 2, id="01" * 16,
                                     scope="private"))
    # -0.0 and 0.0 encode alike
    assert D.encode_canonical(inp) == D.encode_canonical(
        D.Request(**{**inp.__dict__, "temperature": 0.5}))
    # too small a buffer: buffer_too_small and the size needed
    c = ffi.new("aotx_request *")
    c.kind = 1
    c.operation_key[0] = 1
    need = ffi.new("uint32_t *")
    assert lib.aotx_canonical_encode(c, ffi.NULL, 0, need) == lib.AOTX_E_BUFFER_TOO_SMALL
    assert need[0] == 48
    # a reserved byte set: refused by decode
    bad = bytearray(D.encode_canonical(req))
    bad[48 + 20] = 1
    refused("invalid_argument", D.decode_canonical, bytes(bad))


# ---- sequences, retries, refusals ------------------------------------------


def test_sequences_retries_and_conflicts(rig: Rig) -> None:
    refused("future_sequence", rig.do, A, D.Kind.REGISTER, sequence=2)
    refused("below_retry_floor", rig.do, A, D.Kind.REGISTER, sequence=0)
    refused("participant_not_found", rig.do, A, D.Kind.SPACE_CREATE, sequence=1)
    assert rig.dev.participant(ALL, A) == D.Participant(A, False, 1, 1)
    first = rig.req(A, D.Kind.REGISTER)
    r1 = rig.dev.submit(ALL, A, first)
    assert not r1.retry
    again = rig.dev.submit(ALL, A, first)
    assert again.retry and again.op_id == r1.op_id
    assert rig.dev.usage().admissions == 1
    refused("sequence_conflict", rig.dev.submit, ALL, A,
            D.Request(**{**first.__dict__, "operation_key": rig.key()}))
    refused("registration_conflict", rig.do, A, D.Kind.REGISTER)
    sp = rig.req(A, D.Kind.SPACE_CREATE)
    rig.dev.submit(ALL, A, sp)
    # same sequence, changed scope
    refused("sequence_conflict", rig.dev.submit, ALL, A,
            D.Request(**{**sp.__dict__, "scope": "room"}))
    # operation key reused by a live receipt
    refused("operation_key_conflict", rig.do, A, D.Kind.SPACE_CREATE,
            operation_key=sp.operation_key, id="99" * 16)
    refused("lineage_mismatch", rig.do, A, D.Kind.SPACE_CREATE, lineage="f" * 32)
    refused("space_id_conflict", rig.do, A, D.Kind.SPACE_CREATE, id=sp.operation_key)
    refused("future_sequence", rig.do, A, D.Kind.SPACE_CREATE, sequence=9)
    assert rig.dev.participant(ALL, A).next_sequence == 3


def test_every_refusal_changes_nothing(rig: Rig) -> None:
    rig.register(A, B)
    s = rig.space(A, "private")
    conv = rig.conversation(A, s)
    inp = rig.input(A, conv)
    before = rig.snapshot()
    checks: list[tuple[str, str, D.Request, int]] = [
        ("operation_key_invalid", A, rig.req(A, D.Kind.SPACE_CREATE, operation_key="0" * 32), ALL),
        ("grant_forbidden", A, rig.req(A, D.Kind.SPACE_CREATE), D.GRANT_READ),
        ("space_not_found", B, rig.req(B, D.Kind.CONVERSATION_CREATE, space=s), ALL),
        ("space_not_found", A, rig.req(A, D.Kind.CONVERSATION_CREATE, space="77" * 16), ALL),
        ("conversation_id_conflict", A, rig.req(A, D.Kind.CONVERSATION_CREATE, space=s, id=conv),
         ALL),
        ("conversation_not_found", B, rig.req(B, D.Kind.INPUT, conversation=conv, text="x",
                                           model="m"), ALL),
        ("forbidden", A, rig.req(A, D.Kind.MEMBER_SET, space=s, participant=B,
                              permissions=("read",)), D.GRANT_READ | D.GRANT_WRITE),
        ("target_not_found", A, rig.req(A, D.Kind.CANCEL, target_sequence=50), ALL),
        ("target_sequence_invalid", A, rig.req(A, D.Kind.CANCEL, target_sequence=0), ALL),
        ("retry_floor_invalid", A, rig.req(A, D.Kind.RETIRE, retry_floor=99), ALL),
        ("retry_floor_invalid", A, rig.req(A, D.Kind.RETIRE, retry_floor=0), ALL),
        ("retirement_blocked", A, rig.req(A, D.Kind.RETIRE, retry_floor=2), ALL),  # unsaved
        ("text_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text=b"\xff",
                                 model="m"), ALL),
        ("text_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text=b"\xed\xa0\x80",
                                 model="m"), ALL),
        ("text_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="", model="m"), ALL),
        ("text_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x" * (2048 - 72),
                                 model="m", media=(("image", "00" * 32),)), ALL),
        ("model_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x", model=""), ALL),
        ("reserved_token_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, model="m",
                                              text="see <start_of_image> here"), ALL),
        ("reserved_token_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, model="m",
                                              text="<image:" + "0" * 64 + ">"), ALL),
        ("model_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x", model="a b"),
         ALL),
        ("sampling_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x", model="m",
                                     temperature=2.5), ALL),
        ("sampling_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x", model="m",
                                     top_p=0.0), ALL),
        ("sampling_invalid", A, rig.req(A, D.Kind.INPUT, conversation=conv, text="x", model="m",
                                     max_output_tokens=0), ALL),
    ]
    for code, actor, req, grants in checks:
        refused(code, rig.dev.submit, grants, actor, req)
        assert rig.snapshot() == before, code
    # the exact limit fits: 2048 - 73 bytes of text beside one media link
    ok = rig.input(A, conv, text="x" * (2048 - 73), media=(("image", "00" * 32),))
    assert ok.status == "admitted"
    # C-level checks the Python layer cannot express (malformed: negative codes)
    def encode_rc(raw: object) -> int:
        rc = int(lib.aotx_canonical_encode(raw, ffi.NULL, 0, ffi.new("uint32_t *")))
        assert rc < 0
        return rc

    raw = ffi.new("aotx_request *")
    raw.kind = 9
    raw.operation_key[0] = 1
    assert native.code_name(encode_rc(raw)) == "kind_invalid"
    raw.kind = D.Kind.SPACE_CREATE
    raw.scope = 3
    assert native.code_name(encode_rc(raw)) == "scope_invalid"
    raw.kind = D.Kind.MEMBER_SET
    raw.rights = 8
    assert native.code_name(encode_rc(raw)) == "rights_invalid"
    raw.kind = D.Kind.INPUT
    raw.text_len, raw.model_len, raw.max_output_tokens, raw.top_p = 1, 1, 1, 1.0
    raw.text[0] = raw.model[0] = ord("x")
    raw.n_media = 1
    raw.media[0].type = 3
    assert native.code_name(encode_rc(raw)) == "media_invalid"
    refused("rights_invalid", D.rights_mask, ("owner",))
    # executor-side refusals
    refused("status_invalid", rig.dev.complete, inp.op_id, "admitted")
    refused("admission_unsaved", rig.dev.start, inp.op_id)
    refused("operation_not_found", rig.dev.complete, "55" * 16, "succeeded")
    cancel = rig.do(A, D.Kind.CANCEL, target_sequence=1)
    refused("already_terminal", rig.dev.complete, cancel.op_id, "succeeded")
    refused("cursor_invalid", rig.dev.spaces, ALL, A, 99, 10)


def test_journal_hold_refuses_and_changes_nothing(rig: Rig) -> None:
    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    inp = rig.input(A, conv)
    before = rig.snapshot()
    rig.journal.hold(True)
    refused("journal_hold", rig.do, A, D.Kind.SPACE_CREATE)
    refused("journal_hold", rig.dev.complete, inp.op_id, "succeeded", b"x")
    assert rig.snapshot() == before
    # reads still answer during a hold, and show the hold
    assert rig.dev.receipt(ALL, A, inp.op_id).save.hold & 2
    rig.journal.hold(False)
    rig.do(A, D.Kind.SPACE_CREATE)


def test_receipt_save_states_and_results(rig: Rig) -> None:
    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    r = rig.input(A, conv)
    assert (r.status, r.device_committed, r.admission_saved, r.terminal_saved) == (
        "admitted", True, False, False)
    assert r.save.file_incarnation == 0x77 and r.save.boot == 1 and r.save.pending_bytes > 0
    refused("admission_unsaved", rig.dev.start, r.op_id)
    rig.journal.save()
    r = rig.dev.receipt(ALL, A, r.op_id)
    assert r.admission_saved and not r.terminal_saved and r.save.pending_bytes == 0
    assert r.save.generation >= 1 and r.save.saved_records == r.admission_record + 1
    rig.dev.start(r.op_id)
    assert rig.dev.receipt(ALL, A, r.op_id).status == "running"
    payload = "résumé ".encode() * 100
    rig.dev.complete(r.op_id, "succeeded", payload, 12, 34)
    r = rig.dev.receipt(ALL, A, r.op_id)
    assert (r.status, r.terminal_saved, r.input_tokens, r.output_tokens, r.result_len) == (
        "succeeded", False, 12, 34, len(payload))
    rig.journal.save()
    assert rig.dev.receipt(ALL, A, r.op_id).terminal_saved
    assert rig.dev.result(ALL, A, r.op_id) == (payload, len(payload))
    assert rig.dev.result(ALL, A, r.op_id, offset=1, limit=5) == (payload[1:6], len(payload))
    assert rig.dev.result(ALL, A, r.op_id, offset=len(payload) + 3) == (b"", len(payload))
    refused("already_terminal", rig.dev.complete, r.op_id, "failed")


def _constructed(r: D.Receipt) -> D.Receipt:
    """``r`` made again through the dataclass constructors."""
    import dataclasses

    def again(obj: Any) -> Any:
        return type(obj)(**{f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)})

    return D.Receipt(**{**{f.name: getattr(r, f.name) for f in dataclasses.fields(r)},
                        "save": again(r.save),
                        "saved_by": None if r.saved_by is None else again(r.saved_by)})


def test_receipt_views_are_the_constructors_objects(rig: Rig) -> None:
    """device_codec.receipt_of builds its frozen dataclasses without their __init__ (_built):
    every field set, in field order, equal (and hashing alike) to the constructed ones,
    still frozen; unsaved, saved (with the save that acknowledged it), terminal."""
    import dataclasses

    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    r = rig.input(A, conv)
    seen = [r]
    rig.journal.save()
    seen.append(rig.dev.receipt(ALL, A, r.op_id))
    rig.dev.start(r.op_id)
    rig.dev.complete(r.op_id, "succeeded", b"done", 1, 2)
    seen.append(rig.dev.receipt(ALL, A, r.op_id))
    assert seen[1].saved_by is not None and seen[0].saved_by is None
    for got in seen:
        want = _constructed(got)
        assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
        for obj, cls in ((got, D.Receipt), (got.save, SaveState),
                         (got.saved_by, SaveId)):
            if obj is None:
                continue
            assert type(obj) is cls
            assert list(vars(obj)) == [f.name for f in dataclasses.fields(cls)]
        with pytest.raises(dataclasses.FrozenInstanceError):
            got.status = "failed"   # type: ignore[misc]


def test_cancel_marks_running_operations(rig: Rig) -> None:
    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    inp = rig.input(A, conv)
    c = rig.do(A, D.Kind.CANCEL, target_sequence=inp.sequence)
    assert c.resource_id == inp.op_id
    assert json.loads(rig.dev.result(ALL, A, c.op_id)[0]) == {
        "target_sequence": str(inp.sequence), "cancel_requested": True}
    assert rig.dev.receipt(ALL, A, inp.op_id).cancel_requested
    c2 = rig.do(A, D.Kind.CANCEL, target_sequence=1)  # registration: already terminal
    assert json.loads(rig.dev.result(ALL, A, c2.op_id)[0])["cancel_requested"] is False
    refused("target_not_found", rig.do, A, D.Kind.CANCEL, target_sequence=rig.seq(A))


# ---- rights ----------------------------------------------------------------


def test_rights_matrix_per_scope(rig: Rig) -> None:
    rig.register(A, B, C)
    priv, room, inst = rig.space(A, "private"), rig.space(A, "room"), rig.space(A, "instance")
    for s in (priv, room, inst):
        assert rig.dev.space(ALL, A, s).rights == ("read", "write", "manage")
    # non-owners: private and room are invisible, instance gives read|write
    for s in (priv, room):
        refused("space_not_found", rig.dev.space, ALL, B, s)
        refused("space_not_found", rig.do, B, D.Kind.CONVERSATION_CREATE, space=s)
        refused("space_not_found", rig.dev.members, ALL, B, s)
    assert rig.dev.space(ALL, B, inst).rights == ("read", "write")
    assert [s.id for s in rig.dev.spaces(ALL, B)[0]] == [inst]
    assert [s.id for s in rig.dev.spaces(ALL, A)[0]] == [priv, room, inst]
    conv_b = rig.conversation(B, inst)
    refused("forbidden", rig.do, B, D.Kind.MEMBER_SET, space=inst, participant=C,
            permissions=("read",))
    # an explicit row adds rights in a room...
    rig.do(A, D.Kind.MEMBER_SET, space=room, participant=B, permissions=["read"])
    assert rig.dev.space(ALL, B, room).rights == ("read",)
    refused("forbidden", rig.do, B, D.Kind.CONVERSATION_CREATE, space=room)
    rig.do(A, D.Kind.MEMBER_SET, space=room, participant=B, permissions=["write", "read"])
    rig.conversation(B, room)
    assert rig.members(room) == {B: ("read", "write")}
    # ...and a zero-rights row blocks implicit instance access
    rig.do(A, D.Kind.MEMBER_SET, space=inst, participant=B, permissions=[])
    assert rig.members(inst) == {B: ()}
    refused("space_not_found", rig.dev.space, ALL, B, inst)
    refused("conversation_not_found", rig.dev.conversation, ALL, B, conv_b)
    refused("conversation_not_found", rig.input, B, conv_b)
    assert rig.dev.space(ALL, C, inst).rights == ("read", "write")
    # a row with write only: visible (forbidden, not hidden) for reads
    rig.do(A, D.Kind.MEMBER_SET, space=priv, participant=C, permissions=["write"])
    refused("forbidden", rig.dev.space, ALL, C, priv)
    assert priv not in [s.id for s in rig.dev.spaces(ALL, C)[0]]
    # the owner's own row replaces the owner's implicit rights too
    rig.do(A, D.Kind.MEMBER_SET, space=priv, participant=A, permissions=["read", "manage"])
    assert rig.dev.space(ALL, A, priv).rights == ("read", "manage")
    refused("forbidden", rig.do, A, D.Kind.CONVERSATION_CREATE, space=priv)
    # manage lets a member grant rights
    rig.do(A, D.Kind.MEMBER_SET, space=room, participant=C, permissions=["manage", "read"])
    rig.do(C, D.Kind.MEMBER_SET, space=room, participant=B, permissions=["read"])
    assert rig.members(room)[B] == ("read",)


def test_a_member_row_never_tells_whether_a_key_is_registered(rig: Rig) -> None:
    """Issue 10 item 8: naming a registered non-member and an unregistered key answer
    alike (a receipt, a row); the unregistered key's row applies once it registers."""
    rig.register(A, B)
    room = rig.space(A, "room")
    got = [rig.do(A, D.Kind.MEMBER_SET, space=room, participant=who, permissions=("read",))
           for who in (B, C)]
    assert [(r.status, r.kind, r.resource_id) for r in got] == \
        [("succeeded", D.Kind.MEMBER_SET, room)] * 2
    assert rig.members(room) == {B: ("read",), C: ("read",)}
    refused("space_not_found", rig.dev.space, ALL, C, room)     # C is not registered
    rig.register(C)
    assert rig.dev.space(ALL, C, room).rights == ("read",)


def test_grants_intersect_stored_rights(rig: Rig) -> None:
    rig.register(A, B)
    inst = rig.space(A, "instance")
    conv = rig.conversation(A, inst)
    r, w, m = D.GRANT_READ, D.GRANT_WRITE, D.GRANT_MANAGE
    refused("grant_forbidden", rig.dev.space, w | m, A, inst)
    refused("grant_forbidden", rig.dev.spaces, w, A)
    refused("grant_forbidden", rig.dev.participant, w, A)
    assert rig.dev.space(r, A, inst).rights == ("read",)
    refused("grant_forbidden", rig.do, A, D.Kind.SPACE_CREATE, grants=r | m)
    refused("forbidden", rig.do, A, D.Kind.MEMBER_SET, grants=r | w, space=inst, participant=B,
            permissions=("read",))
    rig.do(A, D.Kind.MEMBER_SET, grants=w | m, space=inst, participant=B, permissions=("read",))
    # B has a read-only row now; the write grant does not add rights
    refused("forbidden", rig.input, B, conv)
    rig.do(A, D.Kind.MEMBER_SET, space=inst, participant=B, permissions=("write", "read"))
    ok = rig.input(B, conv, grants=r | w)
    assert ok.status == "admitted"
    # a reader of the space sees B's input receipt, without B's counters
    foreign = rig.dev.receipt(r, A, ok.op_id)
    assert foreign.sequence is None and foreign.operation_key is None and foreign.participant == B
    assert rig.dev.participant(r, A, B) == D.Participant(B, True, None, None)
    refused("participant_not_found", rig.dev.participant, r, A, "c3" * 16)
    # B's other receipts stay hidden from A
    b_reg = rig.dev.spaces(r, B)
    assert b_reg[0][0].id == inst
    rig.do(A, D.Kind.MEMBER_SET, space=inst, participant=A, permissions=())
    refused("operation_not_found", rig.dev.receipt, r, A, ok.op_id)


# ---- retirement and the receipt table --------------------------------------


def test_retirement_floor_key_reuse_and_slots(rig: Rig) -> None:
    rig.register(A)
    s1 = rig.do(A, D.Kind.SPACE_CREATE)            # seq 2
    conv = rig.conversation(A, s1.resource_id)     # seq 3
    inp = rig.input(A, conv)                       # seq 4
    refused("retirement_blocked", rig.do, A, D.Kind.RETIRE, retry_floor=3)  # not saved yet
    rig.journal.save()
    refused("retirement_blocked", rig.do, A, D.Kind.RETIRE, retry_floor=5)  # input unfinished
    used = rig.dev.usage().receipts
    ret = rig.do(A, D.Kind.RETIRE, retry_floor=3)  # seq 5: retires seq 1, 2
    assert json.loads(rig.dev.result(ALL, A, ret.op_id)[0]) == {"retry_floor": "3"}
    assert rig.dev.participant(ALL, A).retry_floor == 3
    # slots are still held until the retirement is saved; the retired ids are gone
    assert rig.dev.usage().receipts == used + 1
    refused("operation_not_found", rig.dev.receipt, ALL, A, s1.op_id)
    assert s1.operation_key is not None
    refused("below_retry_floor", rig.dev.submit, ALL, A,
            D.Request(D.Kind.SPACE_CREATE, L, s1.operation_key, 2))
    rig.journal.save()
    # a read frees no slot (no reclaim scan) and still finds nothing retired; the
    # usage read frees the two slots
    refused("operation_not_found", rig.dev.receipt, ALL, A, s1.op_id)
    assert rig.dev.usage().receipts == used + 1 - 2
    # the retired key may be reused; the old operation id never selects the new receipt
    again = rig.do(A, D.Kind.SPACE_CREATE, operation_key=s1.operation_key, id="42" * 16)
    assert again.op_id != s1.op_id
    refused("operation_not_found", rig.dev.receipt, ALL, A, s1.op_id)
    refused("retry_floor_invalid", rig.do, A, D.Kind.RETIRE, retry_floor=2)  # below the floor
    rig.dev.complete(inp.op_id, "failed")
    rig.journal.save()
    rig.do(A, D.Kind.RETIRE, retry_floor=5)


# ---- recovery --------------------------------------------------------------


def recover_from(file: bytes) -> tuple[Journal, D.Device, Any]:
    j = Journal()
    dev = D.Device(j, L)
    reader = JournalReader(file)
    dev.recover(reader)
    return j, dev, reader


def test_recovery_restores_state_and_interrupts_inputs(rig: Rig) -> None:
    rig.register(A, B)
    inst = rig.space(A, "instance")
    conv = rig.conversation(B, inst)
    rig.do(A, D.Kind.MEMBER_SET, space=inst, participant=B, permissions=("read", "write"))
    done = rig.input(B, conv)
    rig.dev.complete(done.op_id, "succeeded", b"answer", 5, 6)
    open_ = rig.input(B, conv, text="still running")
    rig.journal.save()
    _j2, dev2, keep = recover_from(bytes(rig.journal.file))
    try:
        assert dev2.usage() == rig.dev.usage()
        for who in (A, B):
            assert dev2.participant(ALL, who) == rig.dev.participant(ALL, who)
            assert dev2.spaces(ALL, who) == rig.dev.spaces(ALL, who)
        assert dev2.members(ALL, A, inst) == rig.dev.members(ALL, A, inst)
        assert dev2.conversation(ALL, A, conv) == rig.dev.conversation(ALL, A, conv)
        r = dev2.receipt(ALL, B, done.op_id)
        assert (r.status, r.terminal_saved, r.output_tokens) == ("succeeded", True, 6)
        assert dev2.result(ALL, B, done.op_id)[0] == b"answer"
        r = dev2.receipt(ALL, B, open_.op_id)
        assert (r.status, r.admission_saved, r.terminal_saved) == ("interrupted", True, False)
        assert dev2.result(ALL, B, open_.op_id) == (b"", 0)
        # new admissions continue the numbering and the journal
        nxt = dev2.submit(ALL, A, D.Request(D.Kind.SPACE_CREATE, L, "99" * 16, 4))
        assert nxt.admission_number == rig.dev.usage().admissions + 1
        assert nxt.admission_record > r.admission_record
        refused("device_out_of_order", dev2.recover, keep)
    finally:
        dev2.close()


def test_recovery_fails_closed_on_inconsistent_transfer() -> None:
    """A well-formed journal whose admission contradicts the replay: refuse, name the record."""
    j = Journal()
    good = Rig()
    good.register(A)
    good.journal.save()
    # Re-encode A's registration admission with a wrong operation id, in a fresh journal.
    start = 64 + 192  # record 0 is the boot transfer
    rec = good.journal.file[start:start + 192]
    payload = bytearray(rec[32:32 + int.from_bytes(rec[16:20], "little")])
    assert payload[0] == 1 and payload[1] == D.Kind.REGISTER
    payload[24] ^= 1
    last = ffi.new("uint64_t *")
    native.check(lib.aotx_journal_enqueue(j.handle, 2, bytes(payload), len(payload), last))
    j.save()
    err = refused("recovery_damage", recover_from, bytes(j.file))
    assert err.fields["record"] == 1
    # a completion for an operation that was never admitted
    j = Journal()
    comp = bytes([1, 2, 0, 0]) + (0).to_bytes(4, "little") + b"\x55" * 16 + bytes(8)
    native.check(lib.aotx_journal_enqueue(j.handle, 5, comp, len(comp), last))
    j.save()
    assert refused("recovery_damage", recover_from, bytes(j.file)).fields["record"] == 1
    # a journal of another lineage is foreign
    other = D.Device(Journal(), "f" * 32)
    refused("journal_foreign", other.recover, JournalReader(bytes(good.journal.file)))
    other.close()
    good.dev.close()


# ---- capacities (a small-capacity build, in a child process) ---------------

SMALL = {"AOTX_MAX_PARTICIPANTS": "2", "AOTX_MAX_SPACES": "3", "AOTX_MAX_CONVERSATIONS": "3",
         "AOTX_MAX_MEMBERS": "2", "AOTX_MAX_RECEIPTS": "8", "AOTX_MAX_COMMAND_BYTES": "200",
         "AOTX_MAX_RESULT_BYTES": "256"}

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    from aotx_trio.native import lib as native
    from aotx_trio.native import device as D
    from test_device import A, B, C, Rig, refused
    caps = native.capacities()
    assert caps["receipts"] == 8 and caps["spaces"] == 3, caps
    rig = Rig()
    used = lambda: rig.dev.usage().receipts
    rig.register(A, B)                                   # A1 B1
    refused("participants_full", rig.do, C, D.Kind.REGISTER)
    s = rig.space(A, "instance")                         # A2
    p2 = rig.space(A)                                    # A3
    rig.space(A)                                         # A4
    refused("spaces_full", rig.do, A, D.Kind.SPACE_CREATE)
    rig.conversation(A, s)                               # A5
    rig.conversation(A, s)                               # A6
    conv = rig.conversation(A, s)                        # A7
    refused("conversations_full", rig.do, A, D.Kind.CONVERSATION_CREATE, space=s)
    refused("command_too_large", rig.input, A, conv, text="x" * 120)
    assert used() == 8
    refused("receipt_table_full", rig.do, B, D.Kind.CANCEL, target_sequence=1)
    refused("receipt_table_full", rig.do, A, D.Kind.MEMBER_SET, space=s, participant=A,
            permissions=["read"])
    # a retirement that frees nothing cannot take the reserve slot
    refused("receipt_table_full", rig.do, A, D.Kind.RETIRE, retry_floor=1)
    refused("retirement_blocked", rig.do, A, D.Kind.RETIRE, retry_floor=3)       # unsaved
    rig.journal.save()
    rig.do(A, D.Kind.RETIRE, retry_floor=3)              # A8: the reserve slot
    assert used() == 9
    refused("receipt_table_full", rig.do, B, D.Kind.CANCEL, target_sequence=1)
    refused("receipt_table_full", rig.do, A, D.Kind.RETIRE, retry_floor=4)
    rig.journal.save()                                   # the retirement is saved: 2 freed
    assert used() == 7
    rig.do(A, D.Kind.MEMBER_SET, space=s, participant=B, permissions=["read"])  # A9
    rig.journal.save()
    rig.do(A, D.Kind.RETIRE, retry_floor=9)              # A10 frees 3..8
    rig.journal.save()
    assert used() == 3
    rig.do(A, D.Kind.MEMBER_SET, space=s, participant=A,
           permissions=["read", "write", "manage"])      # A11: second row
    refused("members_full", rig.do, A, D.Kind.MEMBER_SET, space=p2, participant=B,
            permissions=["read"])
    rig.do(A, D.Kind.MEMBER_SET, space=s, participant=B, permissions=[])  # update, no new row
    inp = rig.input(A, conv, text="ok")
    refused("result_too_large", rig.dev.complete, inp.op_id, "succeeded", b"r" * 257)
    rig.dev.complete(inp.op_id, "succeeded", b"r" * 256)
    assert rig.dev.result(D.ALL_GRANTS, A, inp.op_id)[1] == 256
    print("CHILD-OK")
""")


@pytest.fixture(scope="session")
def small_build() -> Path:
    out = ROOT / "build" / "dev-device-small"
    env = {**os.environ, **SMALL}
    subprocess.run([sys.executable, "build.py", "--only", "device,journal,common", "--out",
                    str(out)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=240)
    return out


def test_capacities_on_a_small_build(small_build: Path) -> None:
    env = {**os.environ, "AOTX_NATIVE_DIR": str(small_build)}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CHILD-OK" in proc.stdout


def test_model_on_a_small_build(small_build: Path) -> None:
    env = {**os.environ, "AOTX_NATIVE_DIR": str(small_build), "AOTX_MODEL_EXAMPLES": "30"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_device_model.py"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_list_pages_follow_the_cursor(rig: Rig) -> None:
    rig.register(A, B)
    ids = [rig.space(A, "instance") for _ in range(3)]
    hidden = rig.space(A, "private")
    ids.append(rig.space(A, "room"))
    rig.do(A, D.Kind.MEMBER_SET, space=ids[3], participant=B, permissions=["read"])
    seen: list[str] = []
    cursor = 0
    while True:
        page, cursor = rig.dev.spaces(ALL, B, cursor, 2)
        assert len(page) <= 2
        seen += [s.id for s in page]
        if cursor == 0:
            break
    assert seen == ids and hidden not in seen
    convs = [rig.conversation(A, ids[0]) for _ in range(3)]
    first, nxt = rig.dev.conversations(ALL, B, ids[0], 0, 2)
    rest, end = rig.dev.conversations(ALL, B, ids[0], nxt, 2)
    assert [c.id for c in first + rest] == convs and end == 0
    assert rig.dev.space(ALL, B, ids[0]).conversations == 3



def _chain(file: bytes, records: int) -> bytes:
    import hashlib

    d = hashlib.sha256(file[:64]).digest()
    for i in range(records):
        d = hashlib.sha256(d + file[64 + 192 * i:64 + 192 * (i + 1)]).digest()
    return d


def test_receipts_keep_the_save_that_acknowledged_them(rig: Rig) -> None:
    """Save fields are the acknowledging save's (frozen), never the journal's state when
    read; recovery rebuilds them exactly (docs/formats/journal.md, "Save identity")."""
    rig.do(A, D.Kind.REGISTER)
    first = rig.do(A, D.Kind.SPACE_CREATE)
    assert rig.dev.receipt(ALL, A, first.op_id).saved_by is None   # not saved: no identity
    rig.journal.save()                                      # save 1: boot, register, space
    r1 = rig.dev.receipt(ALL, A, first.op_id)
    s = r1.save                                             # the journal's state now
    assert r1.saved_by is not None and r1.saved_by.generation == s.generation == 1
    assert r1.saved_by.commit_digest == s.commit_digest     # the save ended on this transfer
    made = [first] + [rig.do(A, D.Kind.SPACE_CREATE) for _ in range(3)]
    rig.journal.save()                                      # save 2: three spaces
    conv = rig.do(A, D.Kind.CONVERSATION_CREATE, space=first.resource_id)
    long_ = rig.input(A, conv.resource_id)
    made += [conv, long_]
    rig.journal.save()                                      # save 3
    rig.dev.complete(long_.op_id, "succeeded", bytes(5000), 1, 2)   # 32 records
    made.append(rig.do(A, D.Kind.SPACE_CREATE))             # 2 more: the third of these saves
    rig.journal.save()                                      # saves 4, 5, 6
    ids = {r.op_id: rig.dev.receipt(ALL, A, r.op_id).saved_by for r in made}
    gens = {op: i.generation for op, i in ids.items() if i is not None}
    assert len(gens) == len(made)
    assert sorted(set(gens.values())) == [1, 2, 3, 6]
    for r in made:
        i = ids[r.op_id]
        assert i is not None and (i.file_incarnation, i.boot) == (0x77, 1)
        # the digest is the file's chain through the save's last complete transfer
        assert i.commit_records > rig.dev.receipt(ALL, A, r.op_id).admission_record
        assert i.commit_digest == _chain(bytes(rig.journal.file), i.commit_records)
    assert len({ids[r.op_id] for r in made[1:4]}) == 1      # one save, one identity
    # later saves move the journal on, never these fields
    for _ in range(20):
        rig.do(A, D.Kind.SPACE_CREATE)
        rig.journal.save()
    now = rig.dev.receipt(ALL, A, first.op_id)
    assert now.save.generation > 20 and now.saved_by == ids[first.op_id]
    assert {op: rig.dev.receipt(ALL, A, op).saved_by for op in ids} == ids
    # a restart rebuilds every identity from the file alone
    _j2, dev2, _keep = recover_from(bytes(rig.journal.file))
    try:
        assert {op: dev2.receipt(ALL, A, op).saved_by for op in ids} == ids
    finally:
        dev2.close()


def _receipt_oracle(v: Any) -> D.Receipt:
    """``aotx_receipt_view`` read field by field through cffi (the oracle of the one
    ``unpack`` device_codec.receipt_of does)."""
    foreign = bool(v.foreign)
    status = D.STATUSES[v.status]
    save = v.admission_save
    return D.Receipt(
        op_id=bytes(v.op_id).hex(), kind=D.Kind(v.kind), status=status,
        participant=bytes(v.participant).hex(),
        sequence=None if foreign else int(v.sequence),
        operation_key=None if foreign else bytes(v.operation_key).hex(),
        retry=bool(v.retry), device_committed=bool(v.device_committed),
        admission_saved=bool(v.admission_saved), terminal_saved=bool(v.terminal_saved),
        cancel_requested=bool(v.cancel_requested), admission_number=int(v.admission_number),
        admission_record=int(v.admission_record),
        terminal_record=None if v.terminal_record == 2**64 - 1 else int(v.terminal_record),
        resource_id=bytes(v.resource_id).hex(), result_len=int(v.result_len),
        input_tokens=int(v.input_tokens), output_tokens=int(v.output_tokens),
        save=SaveState(saved_records=int(v.saved_records), pending_bytes=int(v.pending_bytes),
                         file_incarnation=int(v.file_incarnation),
                         generation=int(v.generation), boot=int(v.boot),
                         commit_digest=bytes(v.commit_digest),
                         disk_error=int(v.disk_error), hold=int(v.hold)),
        saved_by=SaveId(file_incarnation=int(save.file_incarnation),
                          generation=int(save.generation), boot=int(save.boot),
                          commit_records=int(save.commit_records),
                          commit_digest=bytes(save.commit_digest))
        if v.admission_save_known else None,
        input_index=int(v.input_index), finish=D.finish_of(status, int(v.finish)),
        leased=bool(v.leased), lease_revision=int(v.lease_revision),
        lease_mode=int(v.lease_mode))


@pytest.mark.parametrize("seed", range(64))
def test_receipt_conversion_reads_every_field_of_the_view(seed: int) -> None:
    import random

    rng = random.Random(seed)
    v = ffi.new("aotx_receipt_view *")
    raw = bytes(rng.getrandbits(8) for _ in range(ffi.sizeof("aotx_receipt_view")))
    ffi.memmove(v, raw, len(raw))
    v.kind = int(rng.choice(list(D.Kind)))
    v.status = rng.randrange(len(D.STATUSES))
    v.finish = rng.randrange(3)
    for flag in ("foreign", "retry", "device_committed", "admission_saved", "terminal_saved",
                 "cancel_requested", "admission_save_known", "leased"):
        setattr(v, flag, rng.choice((0, 1, rng.randrange(2, 256))))
    if seed % 4 == 0:
        v.terminal_record = 2**64 - 1
    assert codec.receipt_of(v) == _receipt_oracle(v)


def test_hex16_ids_are_remembered_but_checked_alike() -> None:
    """device_codec.hex16 looks up ids it has parsed (bounded), and refuses a bad id under
    the name it is checked as, whatever was seen before."""
    good = "0123456789abcdef" * 2
    assert codec.hex16(good, "actor") == bytes.fromhex(good) == codec.hex16(good, "space")
    assert codec._HEX16[good] == bytes.fromhex(good)
    for bad in (good.upper(), good[:-1], good + "0", "g" * 32):
        for name in ("actor", "space"):
            with pytest.raises(errors.InvalidInput) as info:
                codec.hex16(bad, name)
            assert info.value.code == f"{name}_invalid"
            assert bad not in codec._HEX16
    for i in range(codec._HEX16_MAX + 10):
        codec.hex16(f"{i:032x}", "id")
    assert len(codec._HEX16) <= codec._HEX16_MAX


def test_new_request_is_the_constructors_request() -> None:
    """device.new_request (the mutation path's Request, built without the frozen
    dataclass's __init__): the constructor's object, every field in order, defaults
    included; an unknown field is a TypeError, as for the constructor."""
    import dataclasses

    from aotx_trio.runtime import validate

    got = D.new_request(D.Kind.MEMBER_SET, L, A, 5, space=B, participant=C,
                        permissions=("read",))
    want = D.Request(kind=D.Kind.MEMBER_SET, lineage=L, operation_key=A, sequence=5,
                     space=B, participant=C, permissions=("read",))
    assert got == want and hash(got) == hash(want) and repr(got) == repr(want)
    assert list(vars(got)) == [f.name for f in dataclasses.fields(D.Request)]
    with pytest.raises(TypeError):
        D.new_request(D.Kind.REGISTER, L, A, 1, colour="red")
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.sequence = 6   # type: ignore[misc]
    body = {"lineage": L, "operation_key": A, "sequence": "7", "space": f"spc-{L}-{B}",
            "participant": f"par-{L}-{C}", "permissions": ["manage", "read"]}
    req = validate.build_request("member.set", body, L)
    assert req == D.Request(kind=D.Kind.MEMBER_SET, lineage=L, operation_key=A, sequence=7,
                            space=B, participant=C, permissions=("read", "manage"))
    assert list(vars(req)) == [f.name for f in dataclasses.fields(D.Request)]


def _fill_by_fields(req: D.Request) -> Any:
    """The native request set field by field (device_codec.fill_request before it packed the struct
    in one pack_into): the oracle of the test below."""
    c = ffi.new("aotx_request *")
    c.kind = int(req.kind)
    ffi.memmove(c.lineage, bytes.fromhex(req.lineage), 16)
    ffi.memmove(c.operation_key, bytes.fromhex(req.operation_key), 16)
    c.sequence = req.sequence
    if req.id is not None:
        c.has_id = 1
        ffi.memmove(c.id, bytes.fromhex(req.id), 16)
    c.scope = D.SCOPES.index(req.scope)
    for name in ("space", "participant", "conversation", "object"):
        value = getattr(req, name)
        if value is not None:
            ffi.memmove(getattr(c, name), bytes.fromhex(value), 16)
    c.rights = D.rights_mask(req.permissions)
    text = req.text.encode() if isinstance(req.text, str) else req.text
    c.text_len = len(text)
    ffi.memmove(c.text, text, len(text))
    model = req.model.encode()
    c.model_len = len(model)
    ffi.memmove(c.model, model, len(model))
    c.max_output_tokens = req.max_output_tokens
    c.pages = req.pages
    c.temperature = float(req.temperature)
    c.top_p = float(req.top_p)
    c.n_media = len(req.media)
    for i, (mtype, sha) in enumerate(req.media):
        c.media[i].type = D.MEDIA_TYPES[mtype]
        ffi.memmove(c.media[i].sha256, bytes.fromhex(sha), 32)
    c.target_sequence = req.target_sequence
    c.retry_floor = req.retry_floor
    c.source_version = req.source_version
    return c


@pytest.mark.parametrize("req", [
    D.Request(kind=D.Kind.REGISTER, lineage=L, operation_key=A, sequence=1),
    D.Request(kind=D.Kind.SPACE_CREATE, lineage=L, operation_key=A, sequence=2**64 - 1,
              id=B, scope="instance"),
    D.Request(kind=D.Kind.MEMBER_SET, lineage=L, operation_key=B, sequence=9, space=A,
              participant=C, permissions=("read", "manage")),
    D.Request(kind=D.Kind.INPUT, lineage=L, operation_key=C, sequence=3, conversation=A,
              text="héllo " * 200, model="gemma-3-270m", max_output_tokens=2**32 - 1,
              pages=7, temperature=0.7, top_p=0.25,
              media=(("image", "ab" * 32), ("audio", "0f" * 32))),
    D.Request(kind=D.Kind.CANCEL, lineage=L, operation_key=A, sequence=4,
              target_sequence=3),
    D.Request(kind=D.Kind.RETIRE, lineage=L, operation_key=A, sequence=5, retry_floor=5),
    D.Request(kind=D.Kind.PUBLISH, lineage=L, operation_key=A, sequence=6, space=B,
              object=C, source_version=2**63),
], ids=lambda r: r.kind.name)
def test_fill_packs_the_request_as_set_field_by_field(req: D.Request) -> None:
    """device_codec.fill_request writes the native request in one pack_into laid out from cffi's
    offsets: byte for byte what setting each field gives, for every kind."""
    got, want = codec.fill_request(req), _fill_by_fields(req)
    assert bytes(ffi.buffer(got)) == bytes(ffi.buffer(want))


def test_fill_refuses_as_before() -> None:
    """The checks before the pack, in their order: each bad field named."""
    base = {"kind": D.Kind.INPUT, "lineage": L, "operation_key": A, "sequence": 1}
    for bad, code in (({"lineage": "x" * 32}, "lineage_invalid"),
                      ({"sequence": 2**64}, "sequence_invalid"),
                      ({"scope": "galaxy"}, "scope_invalid"),
                      ({"permissions": ("fly",)}, "rights_invalid"),
                      ({"text": "x" * 2049}, "text_invalid"),
                      ({"model": "m" * 129}, "model_invalid"),
                      ({"pages": 2**32}, "pages_invalid"),
                      ({"top_p": float("nan")}, "sampling_invalid"),
                      ({"media": (("image", "zz" * 32),)}, "media_invalid"),
                      ({"retry_floor": -1}, "retry_floor_invalid")):
        with pytest.raises(errors.InvalidInput) as info:
            codec.fill_request(D.Request(**{**base, **bad}))
        assert info.value.code == code, (bad, info.value.code)
