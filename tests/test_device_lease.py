"""Execution leases and output transfers on the device (csrc/device/device_lease.c,
docs/formats/device.md "Lease transfer", "Output transfer"): the documented bytes,
every row check refusing with nothing changed, recovery replaying both and failing
closed on anything partial or inconsistent."""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_device import ALL, A, B, Journal, L, Rig, recover_from, refused

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native.journal import JournalReader
from aotx_trio.native.lib import ffi, lib

DOC = Path(__file__).resolve().parent.parent / "docs" / "formats" / "device.md"
VEC = [0.5, -0.25, 1.0, 0.0]
XFER_LEASE, XFER_OUTPUT, XFER_COMPLETION = 3, 4, 5


def doc_block(title: str, index: int = 0) -> bytes:
    """The bytes of the ``index``-th hex dump under the heading ``title`` of device.md."""
    text = DOC.read_text()
    section = text[text.index(title):]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    out = bytearray()
    for line in blocks[index].splitlines():
        for tok in line.split()[1:]:
            if not re.fullmatch(r"[0-9a-f]{2}", tok):
                break
            out.append(int(tok, 16))
    return bytes(out)


def transfers(rig: Rig, kind: int) -> list[Any]:
    rig.journal.save()
    return [t for t in JournalReader(bytes(rig.journal.file)) if t.kind == kind]


def enqueue(rig: Rig, kind: int, data: bytes) -> int:
    """A raw transfer in the rig's journal (what a damaged or foreign writer left);
    returns its first record."""
    last = ffi.new("uint64_t *")
    rc = lib.aotx_journal_enqueue(rig.journal.handle, kind, data, len(data), last)
    assert rc == 0, rc
    parts = (len(data) + 159) // 160 or 1
    return int(last[0]) - parts + 1


def example_rig() -> tuple[Rig, D.Receipt, D.Receipt, str]:
    """The worked example's state: A's space and conversation, two saved inputs, the
    first retained (mode 1)."""
    rig = Rig()
    rig.register(A)
    space = rig.space(A)
    conv = rig.conversation(A, space)
    first = rig.input(A, conv, text="hello")
    second = rig.input(A, conv, text="world")
    rig.journal.save()
    rig.dev.memory_retain(first.op_id, VEC)
    return rig, first, second, conv


def test_lease_transfer_matches_the_worked_example() -> None:
    rig, first, second, _ = example_rig()
    rows = [rig.dev.lease_row(first.op_id, 0), rig.dev.lease_row(second.op_id, 1)]
    assert rows == [D.LeaseRow(0, 3, 4, A, 1), D.LeaseRow(1, 4, 5, A, 0)]
    doc = doc_block("### Worked example 4")
    assert len(doc) == 88
    assert (lib.AOTX_LEASE_HEADER, lib.AOTX_LEASE_ROW_BYTES, lib.AOTX_LEASE_ROW_V1_BYTES,
            lib.AOTX_LEASE_MAX_ROWS, lib.AOTX_OUTPUT_HEADER, lib.AOTX_OUTPUT_HEADER_V2) == (
        D.LEASE_HEADER, D.LEASE_ROW, D.LEASE_ROW_V1, D.LEASE_MAX_ROWS, D.OUTPUT_HEADER,
        D.OUTPUT_HEADER_V2)
    assert ffi.sizeof("aotx_lease_row") == 40
    assert D.encode_lease(3, rows) == doc
    assert D.decode_lease(doc) == (3, rows)
    rig.dev.lease(3, rows)
    (lease,) = transfers(rig, XFER_LEASE)
    assert lease.data == doc
    r = rig.dev.receipt(ALL, A, first.op_id)
    assert (r.status, r.leased, r.lease_revision, r.lease_mode) == ("running", True, 3, 1)
    assert rig.dev.receipt(ALL, A, second.op_id).lease_mode == 0
    # the revision 1 form: 32-byte rows, mode 1 implied
    v1 = doc_block("### Worked example 4", 1)
    assert len(v1) == 40 and v1 == D.encode_lease(1, rows[:1])
    assert D.decode_lease(v1) == (1, [D.LeaseRow(0, 3, 4, A, 1)])
    # and the output example: three bytes of the first input
    rig.dev.output(first.op_id, b"par", 12, 1)
    (out,) = transfers(rig, XFER_OUTPUT)
    assert first.op_id == "976fb84bc1853e3c8e965ea710ff4be7"
    assert out.data == doc_block("### Worked example 5") and len(out.data) == 43
    rig.dev.close()


def test_revision_0_and_1_leases_are_read_on_recovery() -> None:
    rig, first, second, _ = example_rig()
    refused("lease_invalid", rig.dev.lease, 1, [rig.dev.lease_row(first.op_id)])
    refused("lease_invalid", rig.dev.lease, 0, [rig.dev.lease_row(second.op_id)])
    enqueue(rig, XFER_LEASE, D.encode_lease(1, [D.LeaseRow(0, 3, 4, A, 1)]))
    enqueue(rig, XFER_LEASE, D.encode_lease(0, [D.LeaseRow(0, 4, 5, A, 0)]))
    rig.journal.save()
    _j, dev, _k = recover_from(bytes(rig.journal.file))
    a = dev.receipt(ALL, A, first.op_id)
    b = dev.receipt(ALL, A, second.op_id)
    assert (a.leased, a.lease_revision, a.lease_mode, a.status) == (True, 1, 1, "interrupted")
    assert (b.leased, b.lease_revision, b.lease_mode, b.status) == (True, 0, 0, "interrupted")
    dev.close()
    rig.dev.close()


def test_recovery_finds_leased_receipts_in_reused_slots() -> None:
    """A retirement frees its slots once saved: live, an input admitted before that save
    takes a fresh slot; replay frees them at once and puts it in a reused one.  The
    lease names the live slot; recovery finds the receipt by actor and sequence (found
    by scripts/chaos.py, which retires while it runs)."""
    rig = Rig()
    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    old = rig.input(A, conv)
    rig.journal.save()
    rig.dev.complete(old.op_id, "succeeded", b"done")
    rig.journal.save()
    rig.do(A, D.Kind.RETIRE, retry_floor=old.sequence + 1)     # not saved yet ...
    new = rig.input(A, conv, text="after the retirement")         # ... so a fresh slot
    rig.journal.save()
    live = rig.dev.lease_row(new.op_id)
    rig.dev.lease(3, [live])
    rig.dev.output(new.op_id, b"kept")
    rig.journal.save()
    _j, dev, _k = recover_from(bytes(rig.journal.file))
    assert dev.lease_row(new.op_id).slot != live.slot          # replay placed it elsewhere
    got = dev.receipt(ALL, A, new.op_id)
    assert (got.status, got.leased, got.lease_revision) == ("interrupted", True, 3)
    assert dev.result(ALL, A, new.op_id)[0] == b"kept"
    dev.close()
    rig.dev.close()


# ---- every row check, nothing changed ---------------------------------------------


class Fixture:
    """One device with an input in each state a lease row can name."""

    def __init__(self) -> None:
        rig = self.rig = Rig()
        rig.register(A, B)
        space = rig.space(A, "instance")
        conv = rig.conversation(A, space)
        rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B,
               permissions=("read", "write"))
        self.free = [rig.input(A, conv, text=f"free {i}") for i in range(4)]
        self.free.append(rig.input(B, conv, text="b's"))
        self.done = rig.input(A, conv)
        self.leased = rig.input(A, conv)
        rig.journal.save()
        rig.dev.memory_retain(self.free[0].op_id, VEC)
        rig.dev.memory_retain(self.free[1].op_id, VEC)
        rig.dev.complete(self.done.op_id, "succeeded", b"x")
        rig.dev.lease(3, [rig.dev.lease_row(self.leased.op_id)])
        self.unsaved = rig.input(A, conv)        # never saved in this module
        self.ops = [(A, r.op_id) for r in [*self.free[:4], self.done, self.leased,
                                            self.unsaved]] + [(B, self.free[4].op_id)]
        self.space_op = rig.do(A, D.Kind.SPACE_CREATE)   # not an INPUT

    def valid_rows(self, picks: list[int]) -> list[D.LeaseRow]:
        return [self.rig.dev.lease_row(self.free[p].op_id, i) for i, p in enumerate(picks)]

    def snapshot(self) -> Any:
        dev = self.rig.dev
        st_ = ffi.new("aotx_save_state *")
        lib.aotx_journal_save_state(self.rig.journal.handle, st_)
        return ([dev.receipt(ALL, who, op) for who, op in self.ops], dev.usage(),
                int(st_.pending_bytes), int(st_.saved_records))


@pytest.fixture(scope="module")
def fx() -> Iterator[Fixture]:
    f = Fixture()
    yield f
    f.rig.dev.close()


REFUSALS = {"lease_invalid", "operation_not_found", "already_terminal", "lease_conflict",
            "admission_unsaved"}
FIELDS = ("request_index", "slot", "sequence", "actor", "mode", "reserved", "duplicate",
          "other_receipt", "revision")


@st.composite
def corrupted(draw: Any) -> tuple[int, list[tuple[int, str, int]]]:
    picks = draw(st.lists(st.integers(0, 4), min_size=1, max_size=5, unique=True))
    revision = draw(st.sampled_from([2, 3]))
    bad = draw(st.lists(st.tuples(st.integers(0, len(picks) - 1), st.sampled_from(FIELDS),
                                  st.integers(1, 2**32 - 1)), min_size=1, max_size=3,
                        unique_by=lambda e: e[0]))     # one corruption per row: each breaks it
    return revision, [(p, f, v) for p, f, v in bad] + [(-1, "picks", k) for k in picks]


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corrupted())
def test_every_row_check_refuses_with_nothing_changed(fx: Fixture,
                                                      case: tuple[int, list[Any]]) -> None:
    revision, edits = case
    picks = [v for p, f, v in edits if f == "picks"]
    rows = fx.valid_rows(picks)
    others = [fx.done, fx.leased, fx.unsaved]
    for at, what, value in (e for e in edits if e[1] != "picks"):
        r = rows[at]
        if what == "request_index":
            r = D.LeaseRow(r.request_index ^ (value or 1), r.slot, r.sequence, r.actor, r.mode)
        elif what == "slot":
            r = D.LeaseRow(r.request_index, r.slot ^ (value % 4096 or 1), r.sequence,
                           r.actor, r.mode)
        elif what == "sequence":
            r = D.LeaseRow(r.request_index, r.slot, r.sequence ^ value, r.actor, r.mode)
        elif what == "actor":
            flip = bytes.fromhex(r.actor)
            flip = bytes([flip[0] ^ (value & 0xFF or 1)]) + flip[1:]
            r = D.LeaseRow(r.request_index, r.slot, r.sequence, flip.hex(), r.mode)
        elif what == "mode":   # not retained yet (mode 0 here): only 3.. is wrong
            r = D.LeaseRow(r.request_index, r.slot, r.sequence, r.actor,
                           r.mode ^ (value % 8 or 1) if r.mode else 3 + value % 5)
        elif what == "reserved":
            r = D.LeaseRow(r.request_index, r.slot, r.sequence, r.actor, r.mode, value)
        elif what == "duplicate":
            rows.append(D.LeaseRow(len(rows), r.slot, r.sequence, r.actor, r.mode))
            continue
        elif what == "other_receipt":    # a row naming a receipt that cannot be leased
            r = fx.rig.dev.lease_row(others[value % 3].op_id, at)
        elif what == "revision":
            # 0/1 are never written; 4 needs mode 1 in every row, 5 mode 2 (none here)
            revision = [0, 1, 6, 7, 2**31, 4 if any(x.mode != 1 for x in rows) else 5][value % 6]
        rows[at] = r
    before = fx.snapshot()
    with pytest.raises(errors.AotxError) as info:
        fx.rig.dev.lease(revision, rows)
    assert info.value.native in REFUSALS, info.value
    assert fx.snapshot() == before


def test_row_checks_name_their_code(fx: Fixture) -> None:
    dev = fx.rig.dev
    good = fx.valid_rows([0, 2])
    refused("lease_invalid", dev.lease, 3, [])
    refused("lease_invalid", dev.lease, 3, [fx.valid_rows([0])[0]] * 257)
    refused("lease_invalid", dev.lease, 4, good)             # row 1 has mode 0: not source-only
    refused("lease_invalid", dev.lease, 5, good)
    refused("lease_invalid", dev.lease, 6, good)
    refused("already_terminal", dev.lease, 3, [dev.lease_row(fx.done.op_id)])
    refused("lease_conflict", dev.lease, 3, [dev.lease_row(fx.leased.op_id)])
    refused("admission_unsaved", dev.lease, 3, [dev.lease_row(fx.unsaved.op_id)])
    reg = D.LeaseRow(0, 0, 1, A, 0)        # slot 0: A's REGISTER receipt
    refused("lease_invalid", dev.lease, 3, [reg])
    refused("operation_not_found", dev.lease, 3, [D.LeaseRow(0, 1000, 1, A, 0)])
    refused("lease_invalid", dev.lease, 3, [D.LeaseRow(0, 5000, 1, A, 0)])
    refused("operation_not_found", dev.lease_row, fx.space_op.op_id)
    # the last row decides too: nothing of the first (valid) rows is applied
    bad_last = [*good, D.LeaseRow(2, good[0].slot, good[0].sequence, A, good[0].mode)]
    refused("lease_invalid", dev.lease, 3, bad_last)
    assert not dev.receipt(ALL, A, fx.free[0].op_id).leased


# ---- output ---------------------------------------------------------------------


def test_output_rules_and_reads() -> None:
    rig, first, _second, _ = example_rig()
    refused("lease_missing", rig.dev.output, first.op_id, b"x")
    rig.dev.lease(3, [rig.dev.lease_row(first.op_id)])
    refused("invalid_argument", rig.dev.output, first.op_id, b"")
    rig.dev.output(first.op_id, b"one ")
    # not saved yet: a read shows nothing a crash could take back
    assert rig.dev.result(ALL, A, first.op_id) == (b"", 0)
    rig.journal.save()
    assert rig.dev.result(ALL, A, first.op_id) == (b"one ", 4)
    rig.dev.output(first.op_id, b"two ")
    assert rig.dev.result(ALL, A, first.op_id) == (b"one ", 4)
    assert rig.dev.receipt(ALL, A, first.op_id).result_len == 4
    rig.journal.save()
    assert rig.dev.result(ALL, A, first.op_id) == (b"one two ", 8)
    refused("result_too_large", rig.dev.output, first.op_id, b"z" * (65536 - 7))
    refused("output_conflict", rig.dev.complete, first.op_id, "succeeded", b"one", 1, 1,
            "stop")
    refused("output_conflict", rig.dev.complete, first.op_id, "succeeded", b"one tw0 x", 1,
            1, "stop")
    rig.dev.complete(first.op_id, "succeeded", b"one two three", 3, 3, "stop")
    refused("already_terminal", rig.dev.output, first.op_id, b"x")
    (done,) = transfers(rig, XFER_COMPLETION)
    assert done.data[32:] == b"three" and struct.unpack_from("<I", done.data, 4)[0] == 5
    assert rig.dev.result(ALL, A, first.op_id) == (b"one two three", 13)
    _j, dev, _k = recover_from(bytes(rig.journal.file))
    assert dev.result(ALL, A, first.op_id) == (b"one two three", 13)
    assert dev.receipt(ALL, A, first.op_id).finish == "stop"
    dev.close()
    rig.dev.close()


def test_a_restored_leased_input_is_interrupted_with_its_journaled_output() -> None:
    rig, first, second, _ = example_rig()
    rig.dev.lease(4, [rig.dev.lease_row(first.op_id)])
    rig.dev.output(first.op_id, "caf\u00e9 ".encode(), 11, 2)
    live = rig.dev.receipt(ALL, A, first.op_id)   # a running input reports them too
    assert (live.status, live.input_tokens, live.output_tokens) == ("running", 11, 2)
    rig.dev.output(first.op_id, b"au lait", 11, 4)
    rig.journal.save()
    _j, dev, _k = recover_from(bytes(rig.journal.file))
    r = dev.receipt(ALL, A, first.op_id)
    assert (r.status, r.leased, r.lease_revision) == ("interrupted", True, 4)
    # the token counts its last saved output carried
    assert (r.input_tokens, r.output_tokens) == (11, 4)
    assert dev.result(ALL, A, first.op_id)[0] == "caf\u00e9 au lait".encode()
    other = dev.receipt(ALL, A, second.op_id)   # no output saved: no counts
    assert (other.status, other.input_tokens, other.output_tokens) == ("interrupted", 0, 0)
    refused("already_terminal", dev.lease, 3, [dev.lease_row(second.op_id)])
    # and a second restart reads the same (the interrupted completion carries no bytes)
    _j.file[:] = rig.journal.file      # the recovered journal continues this file
    _j.save()
    _j3, dev3, _k3 = recover_from(bytes(_j.file))
    assert dev3.result(ALL, A, first.op_id)[0] == "caf\u00e9 au lait".encode()
    r3 = dev3.receipt(ALL, A, first.op_id)
    assert (r3.input_tokens, r3.output_tokens) == (11, 4)
    for d in (dev, dev3, rig.dev):
        d.close()


def test_a_version_1_output_transfer_is_still_read() -> None:
    """Journals written before the token counts (version 1 OUTPUT transfers) recover as
    before: the bytes are the result, the interrupted input's counts stay 0."""
    rig, first, _second, _ = example_rig()
    rig.dev.lease(3, [rig.dev.lease_row(first.op_id)])
    enqueue(rig, XFER_OUTPUT, output_bytes(first.op_id, 0, b"old form"))
    rig.journal.save()
    _j, dev, _k = recover_from(bytes(rig.journal.file))
    r = dev.receipt(ALL, A, first.op_id)
    assert (r.status, r.input_tokens, r.output_tokens) == ("interrupted", 0, 0)
    assert dev.result(ALL, A, first.op_id)[0] == b"old form"
    dev.close()
    rig.dev.close()


# ---- recovery fails closed ----------------------------------------------------------


def damaged(rig: Rig, data: bytes, kind: int = XFER_LEASE) -> None:
    first = enqueue(rig, kind, data)
    rig.journal.save()
    with pytest.raises(errors.AotxError) as info:
        recover_from(bytes(rig.journal.file))
    assert info.value.native == "recovery_damage"
    assert info.value.fields.get("record") == first, (info.value.fields, first)


@pytest.mark.parametrize("case", [
    "unknown_slot", "unknown_receipt", "terminal", "already_leased", "revision", "reserved",
    "short",
    "long", "zero_rows", "mode", "sequence"])
def test_recovery_fails_closed_on_an_inconsistent_lease(case: str) -> None:
    rig, first, _second, _ = example_rig()
    row = rig.dev.lease_row(first.op_id)
    if case == "terminal":
        rig.dev.complete(first.op_id, "failed", b"")
    if case == "already_leased":
        rig.dev.lease(3, [row])
    rows = {"unknown_slot": [D.LeaseRow(0, 5000, 4, A, 1)],
            "unknown_receipt": [D.LeaseRow(0, row.slot, 4, B, 1)],
            "mode": [D.LeaseRow(0, row.slot, row.sequence, A, 0)],
            "sequence": [D.LeaseRow(0, row.slot, 99, A, 1)],
            "reserved": [D.LeaseRow(0, row.slot, row.sequence, A, 1, 7)]}.get(case, [row])
    data = D.encode_lease(6 if case == "revision" else 3, rows)
    if case == "short":
        data = data[:-1]
    elif case == "long":
        data += b"\0" * 40
    elif case == "zero_rows":
        data = struct.pack("<II", 0, 3)
    damaged(rig, data)
    rig.dev.close()


def output_bytes(op_id: str, offset: int, data: bytes) -> bytes:
    return struct.pack("<BxxxIII", 1, offset, len(data), 0) + bytes.fromhex(op_id) + data


@pytest.mark.parametrize("case", ["unleased", "offset", "over_limit", "unknown", "reserved",
                                  "terminal", "empty", "version", "v2_short"])
def test_recovery_fails_closed_on_an_inconsistent_output(case: str) -> None:
    rig, first, _second, _ = example_rig()
    if case != "unleased":
        rig.dev.lease(3, [rig.dev.lease_row(first.op_id)])
    if case == "terminal":
        rig.dev.complete(first.op_id, "cancelled")
    op = "77" * 16 if case == "unknown" else first.op_id
    data = {"offset": output_bytes(op, 3, b"abc"),
            "over_limit": output_bytes(op, 0, b"x" * 65537),
            "empty": output_bytes(op, 0, b"")}.get(case, output_bytes(op, 0, b"abc"))
    if case == "reserved":
        data = data[:12] + b"\x01" + data[13:]
    elif case == "version":   # no version 3
        data = b"\x03" + data[1:]
    elif case == "v2_short":  # version 2 whose length leaves no room for its token counts
        data = b"\x02" + data[1:]
    damaged(rig, data, XFER_OUTPUT)
    rig.dev.close()


def lease_of_many(rig: Rig, conv: str, n: int) -> list[D.Receipt]:
    ins = [rig.input(A, conv, text=f"input {i}") for i in range(n)]
    rig.journal.save()
    rig.dev.lease(3, [rig.dev.lease_row(r.op_id, i) for i, r in enumerate(ins)])
    return ins


def test_a_lease_cut_at_the_tail_is_never_replayed() -> None:
    """A lease transfer whose last parts never reached the disk (the file ends inside
    it): a torn tail (docs/reliability.md), truncated; its inputs read interrupted,
    never leased."""
    rig, _first, _second, conv = example_rig()
    ins = lease_of_many(rig, conv, 8)          # 8 + 8*40 = 328 bytes: 3 parts
    rig.journal.save()
    (lease,) = transfers(rig, XFER_LEASE)
    image = bytes(rig.journal.file)
    cut = 64 + (lease.first_record + 2) * 192   # its first two parts only
    reader = JournalReader(image[:cut])
    j = Journal()
    dev = D.Device(j, L)
    dev.recover(reader)
    for r in ins:
        got = dev.receipt(ALL, A, r.op_id)
        assert (got.status, got.leased) == ("interrupted", False)
    dev.close()
    rig.dev.close()


def test_a_lease_missing_parts_before_later_records_fails_closed() -> None:
    """The same lease with a damaged middle part and a later save after it: not a tail,
    so the journal refuses (journal_damage, nothing replayed)."""
    rig, _first, _second, conv = example_rig()
    lease_of_many(rig, conv, 8)
    rig.journal.save()
    (lease,) = transfers(rig, XFER_LEASE)
    rig.input(A, conv, text="a later save")
    rig.journal.save()
    image = bytearray(rig.journal.file)
    at = 64 + (lease.first_record + 1) * 192 + 40     # inside the second part's data
    image[at] ^= 0xFF
    with pytest.raises(errors.AotxError) as info:
        recover_from(bytes(image))
    assert info.value.native == "journal_damage"
    rig.dev.close()
