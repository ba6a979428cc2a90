"""The device's memory table: retention (modes 1 and 2) journaled in MEMORY transfers, its
byte layout, reads (saved rows only, read right on the space), recall ranking, recovery
(rebuilt alike; damaged or partial transfers fail closed or are never published), and
the table's capacity (in a child process on a small build)."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_device import ALL, A, B, C, Journal, L, Rig, recover_from, refused

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native import lib as native
from aotx_trio.native.journal import XFER_MEMORY, JournalReader
from aotx_trio.native.lib import ffi, lib

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(name="rig")
def _rig() -> Iterator[Rig]:
    r = Rig()
    yield r
    r.dev.close()


VEC = [0.5, -0.25, 1.0, 0.0]


def _mix(z: int) -> int:
    m = (1 << 64) - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def memory_id(m: int) -> str:
    lin = bytes.fromhex(L)
    l0, l1 = struct.unpack("<QQ", lin)
    return (struct.pack("<Q", _mix(m ^ l0 ^ 0x6D656D5F6F626A31))
            + struct.pack("<Q", _mix(m ^ l1 ^ 0x6F626A5F69645F32))).hex()


def setup(rig: Rig, scope: str = "private") -> tuple[str, str]:
    rig.register(A, B)
    space = rig.space(A, scope)
    return space, rig.conversation(A, space)


def test_retention_writes_one_memory_transfer_with_the_documented_bytes() -> None:
    """docs/formats/device.md, "Memory transfer": the worked example, byte for byte."""
    rig = Rig()
    space, conv = setup(rig)
    inp = rig.input(A, conv, text="the key is 42")
    refused("admission_unsaved", rig.dev.memory_retain, inp.op_id, VEC)
    rig.journal.save()
    rows = rig.dev.memory_retain(inp.op_id, VEC)
    assert [r.kind for r in rows] == ["text", "embedding"]
    text, emb = rows
    assert text.object == memory_id(1) and emb.object == memory_id(2)
    assert (text.version, text.scope, text.mode, text.byte_length, text.dim) == \
        (1, "private", 1, 13, 0)
    assert (text.owner, text.room, text.source, text.actor, text.conversation) == \
        (space, None, inp.op_id, A, conv)
    assert (emb.byte_length, emb.dim, emb.source) == (16, 4, text.object)
    rig.journal.save()
    transfers = [t for t in JournalReader(bytes(rig.journal.file)) if t.kind == XFER_MEMORY]
    assert len(transfers) == 1
    data = transfers[0].data
    assert len(data) == 8 + 2 * 128 + 13 + 16
    assert data[:8] == bytes([1, 2, 0, 0, 0, 0, 0, 0])
    r0 = data[8:136]
    assert r0[0:16] == bytes.fromhex(memory_id(1))
    assert struct.unpack_from("<QBBBBI", r0, 16) == (1, 1, 0, 1, 1, 13)
    assert r0[32:48] == bytes.fromhex(space) and r0[48:64] == bytes(16)
    assert r0[64:80] == bytes.fromhex(inp.op_id) and r0[80:96] == bytes.fromhex(A)
    assert r0[96:112] == bytes.fromhex(conv)
    assert struct.unpack_from("<QII", r0, 112) == (inp.admission_number, 0, 0)
    r1 = data[136:264]
    assert r1[24] == 2 and struct.unpack_from("<I", r1, 28)[0] == 16
    assert r1[64:80] == bytes.fromhex(memory_id(1)) and struct.unpack_from("<I", r1, 120)[0] == 4
    assert data[264:277] == b"the key is 42"
    assert data[277:] == struct.pack("<4f", *VEC)
    refused("memory_retained", rig.dev.memory_retain, inp.op_id, VEC)
    assert rig.dev.usage().memory == 2
    rig.dev.close()


def test_retention_refusals_change_nothing(rig: Rig) -> None:
    _, conv = setup(rig)
    inp = rig.input(A, conv)
    rig.journal.save()
    refused("embedding_invalid", rig.dev.memory_retain, inp.op_id, [])
    refused("embedding_invalid", rig.dev.memory_retain, inp.op_id, [1.0] * 513)
    refused("embedding_invalid", rig.dev.memory_retain, inp.op_id, [float("nan")])
    refused("operation_not_found", rig.dev.memory_retain, "77" * 16, VEC)
    space_op = rig.do(A, D.Kind.SPACE_CREATE)
    refused("operation_not_found", rig.dev.memory_retain, space_op.op_id, VEC)
    rig.dev.complete(inp.op_id, "succeeded", b"x")
    refused("already_terminal", rig.dev.memory_retain, inp.op_id, VEC)
    assert rig.dev.usage().memory == 0


def test_cancellation_cannot_undo_committed_memory(rig: Rig) -> None:
    space, conv = setup(rig)
    inp = rig.input(A, conv, text="remember me")
    rig.journal.save()
    rig.dev.memory_retain(inp.op_id, VEC)
    rig.do(A, D.Kind.CANCEL, target_sequence=inp.sequence)
    rig.dev.complete(inp.op_id, "cancelled")
    rig.journal.save()
    rows, _ = rig.dev.memory_list(ALL, A, space)
    assert [r.kind for r in rows] == ["text", "embedding"]
    assert rig.dev.memory_read(ALL, A, space, rows[0].object)[1] == b"remember me"


def test_reads_show_saved_rows_to_readers_of_the_space_only(rig: Rig) -> None:
    space, conv = setup(rig)
    inp = rig.input(A, conv, text="héllo")
    rig.journal.save()
    rig.dev.memory_retain(inp.op_id, VEC)
    # unsaved: nobody reads it (no dirty reads), not even its actor
    assert rig.dev.memory_list(ALL, A, space) == ([], 0)
    text_id = memory_id(1)
    refused("memory_not_found", rig.dev.memory_read, ALL, A, space, text_id)
    rig.journal.save()
    rows, nxt = rig.dev.memory_list(ALL, A, space)
    assert len(rows) == 2 and nxt == 0
    row, data = rig.dev.memory_read(ALL, A, space, text_id)
    assert row == rows[0] and data == "héllo".encode()
    assert rig.dev.memory_read(ALL, A, space, text_id, offset=2)[1] == "héllo".encode()[2:]
    assert rig.dev.memory_read(ALL, A, space, text_id, offset=99)[1] == b""
    emb = rig.dev.memory_read(ALL, A, space, memory_id(2))[1]
    assert np.frombuffer(emb, "<f4").tolist() == VEC
    # B is no member: the space is not found; with a write-only row: forbidden
    refused("space_not_found", rig.dev.memory_list, ALL, B, space)
    refused("space_not_found", rig.dev.memory_read, ALL, B, space, text_id)
    rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("write",))
    refused("forbidden", rig.dev.memory_list, ALL, B, space)
    rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("read",))
    assert len(rig.dev.memory_list(ALL, B, space)[0]) == 2
    refused("grant_forbidden", rig.dev.memory_list, D.GRANT_WRITE, B, space)
    # another private space of the same participant: a different memory owner
    other = rig.space(A)
    assert rig.dev.memory_list(ALL, A, other) == ([], 0)
    refused("memory_not_found", rig.dev.memory_read, ALL, A, other, text_id)
    # pages follow the cursor
    page, nxt = rig.dev.memory_list(ALL, A, space, limit=1)
    assert len(page) == 1 and nxt == 1
    assert rig.dev.memory_list(ALL, A, space, cursor=nxt)[0] == rows[1:]
    refused("cursor_invalid", rig.dev.memory_list, ALL, A, space, cursor=3)


def test_recall_ranks_by_cosine_and_skips_the_input_itself(rig: Rig) -> None:
    space, conv = setup(rig, "room")
    rig.do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("read", "write"))
    texts = {"north": [1.0, 0.0, 0.0], "east": [0.0, 1.0, 0.0], "mixed": [0.7, 0.7, 0.0]}
    ops = {}
    for text, vec in texts.items():
        inp = rig.input(A, conv, text=text)
        rig.journal.save()
        rig.dev.memory_retain(inp.op_id, vec)
        ops[text] = inp.op_id
    rig.journal.save()
    got = rig.dev.memory_recall(B, space, [0.9, 0.1, 0.0], limit=2)
    assert [r.source for r, _ in got] == [ops["north"], ops["mixed"]]
    assert got[0][1] == pytest.approx(0.9 / np.hypot(0.9, 0.1), rel=1e-5)
    assert got[0][0].room == space and got[0][0].scope == "room"
    got = rig.dev.memory_recall(A, space, [1.0, 0.0, 0.0], limit=8, exclude=ops["north"])
    assert [r.source for r, _ in got] == [ops["mixed"], ops["east"]]
    assert rig.dev.memory_recall(C, space, [1.0, 0.0, 0.0]) == []
    assert rig.dev.memory_recall(A, space, [1.0, 0.0]) == []         # other dim: no match
    refused("embedding_invalid", rig.dev.memory_recall, A, space, [])


def test_recovery_rebuilds_memory_and_never_repeats_it(rig: Rig) -> None:
    space, conv = setup(rig)
    done = rig.input(A, conv, text="first")
    rig.journal.save()
    rig.dev.memory_retain(done.op_id, VEC)
    rig.dev.complete(done.op_id, "succeeded", b"ok")
    open_ = rig.input(A, conv, text="second, unfinished")
    rig.journal.save()
    rig.dev.memory_retain(open_.op_id, [1.0, 2.0, 3.0, 4.0])
    rig.journal.save()
    _j, dev2, _keep = recover_from(bytes(rig.journal.file))
    try:
        assert dev2.memory_list(ALL, A, space) == rig.dev.memory_list(ALL, A, space)
        assert dev2.usage().memory == 4
        assert dev2.receipt(ALL, A, open_.op_id).status == "interrupted"
        refused("memory_retained", dev2.memory_retain, open_.op_id, VEC)
        got = dev2.memory_read(ALL, A, space, memory_id(3))
        assert got == rig.dev.memory_read(ALL, A, space, memory_id(3))
        # a new retention continues the object numbering
        seq = dev2.participant(ALL, A).next_sequence or 0
        nxt = dev2.submit(ALL, A, D.Request(D.Kind.INPUT, L, "98" * 16, seq,
                                            conversation=conv, text="third", model="m"))
        _j.save()
        assert dev2.memory_retain(nxt.op_id, VEC)[0].object == memory_id(5)
    finally:
        dev2.close()


# ---- mode 2: the recorded mode and the interpretation ----------------------------------

NOTE = b"Alice keeps the key: 42."
NOTE_VEC = [0.0, 1.0, 0.0, 0.5]


def test_mode_2_records_its_mode_and_retains_one_interpretation(rig: Rig) -> None:
    """docs/formats/device.md, "Mode 2": the mode the runtime chose is in both rows;
    the interpretation is a second MEMORY transfer (interpretation row + embedding),
    once, only for a live input recorded with mode 2."""
    space, conv = setup(rig)
    inp = rig.input(A, conv, text="the key is 42")
    rig.journal.save()
    refused("retention_mode_invalid", rig.dev.memory_retain, inp.op_id, VEC, 3)
    refused("retention_mode_invalid", rig.dev.memory_interpret, inp.op_id, NOTE, NOTE_VEC)
    rows = rig.dev.memory_retain(inp.op_id, VEC, 2)
    assert [(r.kind, r.mode) for r in rows] == [("text", 2), ("embedding", 2)]
    refused("text_invalid", rig.dev.memory_interpret, inp.op_id, b"", NOTE_VEC)
    refused("text_invalid", rig.dev.memory_interpret, inp.op_id, b"\xff", NOTE_VEC)
    refused("embedding_invalid", rig.dev.memory_interpret, inp.op_id, NOTE, [])
    note, emb = rig.dev.memory_interpret(inp.op_id, NOTE, NOTE_VEC)
    assert (note.kind, note.mode, note.origin, note.source, note.byte_length) == \
        ("interpretation", 2, "retained", inp.op_id, len(NOTE))
    assert (note.object, emb.object) == (memory_id(3), memory_id(4))
    assert (emb.kind, emb.source, emb.dim, emb.mode) == ("embedding", note.object, 4, 2)
    assert (note.owner, note.actor, note.conversation) == (space, A, conv)
    refused("memory_retained", rig.dev.memory_interpret, inp.op_id, NOTE, NOTE_VEC)
    rig.journal.save()
    data = [t for t in JournalReader(bytes(rig.journal.file)) if t.kind == XFER_MEMORY][1].data
    assert data[:8] == bytes([1, 2, 0, 0, 0, 0, 0, 0]) and len(data) == 264 + len(NOTE) + 16
    assert (data[8 + 24], data[8 + 26], data[136 + 24], data[136 + 26]) == (3, 2, 2, 2)
    assert data[264:264 + len(NOTE)] == NOTE
    # recall ranks interpretation rows too; the input itself is excluded
    got = rig.dev.memory_recall(A, space, NOTE_VEC)
    assert [r.kind for r, _ in got] == ["interpretation", "text"]
    assert rig.dev.memory_recall(A, space, NOTE_VEC, exclude=inp.op_id) == []
    # a mode 1 input has no interpretation; an ended one takes none
    one = rig.input(A, conv, text="plain")
    two = rig.input(A, conv, text="ends first")
    rig.journal.save()
    assert {r.mode for r in rig.dev.memory_retain(one.op_id, VEC)} == {1}
    refused("retention_mode_invalid", rig.dev.memory_interpret, one.op_id, NOTE, NOTE_VEC)
    rig.dev.memory_retain(two.op_id, VEC, 2)
    rig.dev.complete(two.op_id, "cancelled")
    refused("already_terminal", rig.dev.memory_interpret, two.op_id, NOTE, NOTE_VEC)
    # a publication of an interpretation is an unsupported source kind
    dest = rig.space(A, "room")
    refused("publication_unsupported", rig.do, A, D.Kind.PUBLISH, space=dest,
            object=note.object, source_version=1)
    assert rig.dev.usage().memory == 8


def test_recovery_replays_the_recorded_mode_and_never_repeats_an_interpretation(
        rig: Rig) -> None:
    space, conv = setup(rig)
    done = rig.input(A, conv, text="interpreted, unfinished")
    bare = rig.input(A, conv, text="retained in mode 2, not interpreted yet")
    rig.journal.save()
    rig.dev.memory_retain(done.op_id, VEC, 2)
    rig.dev.memory_interpret(done.op_id, NOTE, NOTE_VEC)
    rig.dev.memory_retain(bare.op_id, VEC, 2)
    rig.journal.save()
    file = bytes(rig.journal.file)
    _j, dev2, _keep = recover_from(file)
    try:
        assert dev2.memory_list(ALL, A, space) == rig.dev.memory_list(ALL, A, space)
        assert [r.mode for r in dev2.memory_list(ALL, A, space)[0]] == [2] * 6
        for op in (done.op_id, bare.op_id):   # interrupted: never interpreted (again)
            assert dev2.receipt(ALL, A, op).status == "interrupted"
        refused("memory_retained", dev2.memory_interpret, done.op_id, NOTE, NOTE_VEC)
        refused("already_terminal", dev2.memory_interpret, bare.op_id, NOTE, NOTE_VEC)
    finally:
        dev2.close()
    # the recorded mode is what recovery checks: a retention recorded with mode 1 cannot
    # be followed by an interpretation (the transfer fails closed)
    def replayed(flip: bool) -> bytes:
        j = Journal()
        for t in JournalReader(file):
            data = bytearray(t.data)
            if flip and t.kind == XFER_MEMORY and data[8 + 24] == 1 and \
                    data[8 + 64:8 + 80] == bytes.fromhex(done.op_id):
                data[8 + 26] = data[136 + 26] = 1
            if t.kind in (2, 5, XFER_MEMORY):
                native.check(lib.aotx_journal_enqueue(j.handle, t.kind, bytes(data), len(data),
                                                      ffi.new("uint64_t *")))
        j.save()
        return bytes(j.file)

    _j, dev3, _keep = recover_from(replayed(False))
    assert dev3.usage().memory == 6
    dev3.close()
    refused("recovery_damage", recover_from, replayed(True))


def _memory_journal(text: str = "keep") -> tuple[bytes, int, int]:
    """A saved journal ending in one memory transfer: (file, its first record, parts)."""
    rig = Rig()
    _, conv = setup(rig)
    inp = rig.input(A, conv, text=text)
    rig.journal.save()
    rig.dev.memory_retain(inp.op_id, [0.1] * 384)
    rig.journal.save()
    t = next(t for t in JournalReader(bytes(rig.journal.file)) if t.kind == XFER_MEMORY)
    file = bytes(rig.journal.file)
    rig.dev.close()
    return file, t.first_record, -(-len(t.data) // 160)


def test_a_damaged_memory_transfer_fails_closed() -> None:
    file, _, _ = _memory_journal()
    payload = bytearray(next(t for t in JournalReader(file) if t.kind == XFER_MEMORY).data)
    payload[8 + 25] ^= 1                                  # the text row's scope
    j = Journal()
    # replay the same admissions, then the damaged memory transfer
    for t in JournalReader(file):
        if t.kind in (2, 5):
            native.check(lib.aotx_journal_enqueue(j.handle, t.kind, t.data, len(t.data),
                                                  ffi.new("uint64_t *")))
    native.check(lib.aotx_journal_enqueue(j.handle, XFER_MEMORY, bytes(payload), len(payload),
                                          ffi.new("uint64_t *")))
    j.save()
    err = refused("recovery_damage", recover_from, bytes(j.file))
    assert err.fields["record"] > 0


def test_a_partial_memory_transfer_is_never_published() -> None:
    """A torn tail inside the memory transfer: the rows are not rebuilt and the input
    reads interrupted (its memory input is never repeated)."""
    file, first, parts = _memory_journal("x" * 2000)
    assert parts > 2
    torn = file[:64 + (first + parts - 1) * 192]          # its last part missing
    _j, dev, _keep = recover_from(torn)
    try:
        assert dev.usage().memory == 0
        space = dev.spaces(ALL, A)[0][0].id
        assert dev.memory_list(ALL, A, space) == ([], 0)
    finally:
        dev.close()


# ---- the visibility matrix (property) ----------------------------------------------

PEOPLE = (A, B, C)
RIGHTS = st.sampled_from([None, (), ("read",), ("write",), ("read", "write"),
                          ("read", "write", "manage"), ("manage",)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes=st.lists(st.sampled_from(["private", "room", "instance"]), min_size=1,
                       max_size=3),
       rows=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), RIGHTS), max_size=6),
       grants=st.lists(st.integers(0, 7), min_size=3, max_size=3),
       owners=st.lists(st.integers(0, 2), min_size=3, max_size=3),
       modes=st.lists(st.sampled_from([1, 2]), min_size=3, max_size=3))
def test_memory_visibility_matrix(scopes: list[str], rows: list[tuple[int, int, object]],
                                  grants: list[int], owners: list[int],
                                  modes: list[int]) -> None:
    """participants x spaces x scopes x rights x grants (x retention modes: a mode 2
    interpretation is memory of the space like its text): a reader lists a space's memory
    iff its resolved right (member row, else owner / instance implicit) and its current
    grant both hold read; no right at all hides the space; each space lists only its own
    rows (one participant owning two private spaces sees two memory owners)."""
    rig = Rig()
    try:
        rig.register(*PEOPLE)
        spaces = []
        for i, scope in enumerate(scopes):
            owner = PEOPLE[owners[i]]
            sp = rig.space(owner, scope)
            conv = rig.conversation(owner, sp)
            inp = rig.input(owner, conv, text=f"memory of space {i}")
            rig.journal.save()
            rig.dev.memory_retain(inp.op_id, [1.0, float(i)], modes[i])
            if modes[i] == 2:
                rig.dev.memory_interpret(inp.op_id, f"note on space {i}".encode(), [1.0, 0.5])
            spaces.append((sp, owner, scope))
        explicit: dict[tuple[int, int], int] = {}
        for s, p, perms in rows:
            if s >= len(spaces) or perms is None:
                continue
            sp, owner, _ = spaces[s]
            if PEOPLE[p] == owner:
                continue
            rig.do(owner, D.Kind.MEMBER_SET, space=sp, participant=PEOPLE[p],
                   permissions=perms)
            explicit[(s, p)] = D.rights_mask(perms)  # type: ignore[arg-type]
        rig.journal.save()
        for s, (sp, owner, scope) in enumerate(spaces):
            for p, who in enumerate(PEOPLE):
                if (s, p) in explicit:
                    resolved = explicit[(s, p)]
                elif who == owner:
                    resolved = 7
                else:
                    resolved = 3 if scope == "instance" else 0
                g = grants[p]
                try:
                    got, _ = rig.dev.memory_list(g, who, sp)
                except errors.AotxError as exc:
                    code = exc.native or exc.code
                    if not g & D.GRANT_READ:
                        assert code == "grant_forbidden"
                    elif resolved == 0:
                        assert code == "space_not_found"
                    else:
                        assert code == "forbidden" and not resolved & g & 1
                    continue
                assert g & D.GRANT_READ and resolved & g & 1
                mode = modes[s]
                assert len(got) == 2 * mode and {r.owner for r in got} == {sp}
                assert all(r.scope == scope and r.mode == mode for r in got)
                recalled = rig.dev.memory_recall(who, sp, [1.0, 0.0])
                assert len(recalled) == (mode if resolved & 1 else 0)
    finally:
        rig.dev.close()


# ---- capacity (a small build) --------------------------------------------------------

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, "tests")
    from aotx_trio.native import lib as native
    from aotx_trio.native import device as D
    from test_device import A, Rig, refused
    assert native.capacities()["memory"] == 4
    rig = Rig()
    rig.register(A)
    conv = rig.conversation(A, rig.space(A))
    one = rig.input(A, conv, text="one")
    two = rig.input(A, conv, text="two")          # 2 x 2 rows promised: the table is full
    refused("memory_full", rig.input, A, conv, text="three")
    rig.journal.save()
    rig.dev.memory_retain(one.op_id, [1.0])
    refused("memory_full", rig.input, A, conv, text="three")
    rig.dev.complete(two.op_id, "failed")         # its promise ends with it
    three = rig.input(A, conv, text="three")
    rig.journal.save()
    rig.dev.memory_retain(three.op_id, [1.0])
    refused("memory_full", rig.input, A, conv, text="four")
    try:
        rig.input(A, conv, text="four")
    except Exception as exc:
        assert exc.code == "capacity_exhausted" and exc.fields["table"] == "memory", exc
    print("CHILD-OK")
""")


@pytest.fixture(scope="module")
def memory_build() -> Path:
    out = ROOT / "build" / "dev-device-memory"
    env = {**os.environ, "AOTX_MAX_MEMORY": "4"}
    subprocess.run([sys.executable, "build.py", "--only", "device,journal,common", "--out",
                    str(out)], cwd=ROOT, env=env, check=True, capture_output=True, timeout=240)
    return out


def test_memory_full_is_refused_at_admission(memory_build: Path) -> None:
    env = {**os.environ, "AOTX_NATIVE_DIR": str(memory_build)}
    proc = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CHILD-OK" in proc.stdout


# ---- publication ----------------------------------------------------------------------


def test_publication_copies_text_and_embedding_into_the_destination(rig: Rig) -> None:
    rig.register(A, B)
    mine = rig.space(A)                                  # private
    conv = rig.conversation(A, mine)
    inp = rig.input(A, conv, text="publish me")
    rig.journal.save()
    text, emb = rig.dev.memory_retain(inp.op_id, VEC)
    room = rig.space(A, "room")
    rig.do(A, D.Kind.MEMBER_SET, space=room, participant=B, permissions=("read",))
    rig.journal.save()
    # refusals, each changing nothing
    before = rig.dev.usage()
    refused("version_conflict", rig.do, A, D.Kind.PUBLISH, space=room, object=text.object,
            source_version=2)
    refused("publication_unsupported", rig.do, A, D.Kind.PUBLISH, space=room,
            object=emb.object, source_version=1)
    refused("memory_not_found", rig.do, A, D.Kind.PUBLISH, space=room, object="77" * 16,
            source_version=1)
    # B may read the room but has no manage right there: forbidden
    refused("forbidden", rig.do, B, D.Kind.PUBLISH, space=room, object=text.object,
            source_version=1)
    # B manages its own room but cannot see A's private memory: not found
    b_room = rig.space(B, "room")
    refused("memory_not_found", rig.do, B, D.Kind.PUBLISH, space=b_room, object=text.object,
            source_version=1)
    before = rig.dev.usage()
    assert rig.dev.usage() == before
    # not visible in the room before the publication
    assert rig.dev.memory_list(ALL, B, room) == ([], 0)
    receipt = rig.do(A, D.Kind.PUBLISH, space=room, object=text.object, source_version=1)
    assert receipt.status == "succeeded" and receipt.resource_id == room
    result = rig.dev.result(ALL, A, receipt.op_id)[0].decode()
    assert result == (f'{{"space":"spc-{L}-{room}","objects":["mem-{L}-{memory_id(3)}",'
                      f'"mem-{L}-{memory_id(4)}"],"source":"mem-{L}-{text.object}",'
                      f'"source_version":"1"}}')
    assert rig.dev.memory_list(ALL, B, room) == ([], 0)          # not saved yet
    rig.journal.save()
    rows, _ = rig.dev.memory_list(ALL, B, room)
    assert [(r.kind, r.origin, r.scope, r.owner, r.room) for r in rows] == [
        ("text", "published", "room", room, room), ("embedding", "published", "room", room,
                                                    room)]
    assert rows[0].source == text.object and rows[1].source == rows[0].object
    assert rows[0].actor == A and rows[0].admission_number == receipt.admission_number
    assert rig.dev.memory_read(ALL, B, room, rows[0].object)[1] == b"publish me"
    assert rig.dev.memory_read(ALL, B, room, rows[1].object)[1] == \
        rig.dev.memory_read(ALL, A, mine, emb.object)[1]
    # the originals keep their scope: B still cannot read the private space
    refused("space_not_found", rig.dev.memory_list, ALL, B, mine)
    assert [r.scope for r in rig.dev.memory_list(ALL, A, mine)[0]] == ["private", "private"]
    # recall in the room finds the copy
    assert [r.object for r, _ in rig.dev.memory_recall(B, room, VEC)] == [rows[0].object]
    # the admission record defines it all: recovery rebuilds the copies alike
    _j, dev2, _k = recover_from(bytes(rig.journal.file))
    try:
        assert dev2.memory_list(ALL, B, room) == rig.dev.memory_list(ALL, B, room)
        assert dev2.memory_read(ALL, B, room, rows[0].object)[1] == b"publish me"
    finally:
        dev2.close()


def test_publication_canonical_bytes_round_trip() -> None:
    req = D.Request(D.Kind.PUBLISH, L, "11" * 16, 9, space="22" * 16, object="33" * 16,
                    source_version=7)
    data = D.encode_canonical(req)
    assert len(data) == 48 + 40 and data[1] == 8
    assert data[48:64] == bytes.fromhex("22" * 16) and data[64:80] == bytes.fromhex("33" * 16)
    assert struct.unpack_from("<Q", data, 80)[0] == 7
    assert D.decode_canonical(data) == req
