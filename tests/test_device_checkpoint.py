"""Device checkpoints (csrc/device/device_checkpoint.c): the section's bytes against the worked
example of docs/formats/checkpoint.md, refusal of every damaged byte, and the key
property: a device recovered from checkpoint + journal suffix reads exactly like one
recovered from the whole journal."""

from __future__ import annotations

import hashlib
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import example as hexample
from hypothesis import given, settings
from hypothesis import strategies as st

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native.journal import (
    Anchor,
    Journal,
    JournalParams,
    JournalReader,
    record_offset,
)
from aotx_trio.vocab import ALL_GRANTS

ROOT = Path(__file__).resolve().parent.parent
LINEAGE = bytes.fromhex("0123456789abcdef0123456789abcdef")
LIN = LINEAGE.hex()
INCARNATION = 0x1122334455667788
KEYS = [f"{i:02x}" * 16 for i in (0x11, 0x22, 0x33)]


class MemJournal:
    """A journal saved into memory: every save() drains, 'writes' and acks."""

    def __init__(self) -> None:
        self.journal = Journal(JournalParams(lineage=LINEAGE, file_incarnation=INCARNATION))
        self.image = bytearray(self.journal.header())
        self.journal.begin_boot()

    def save(self) -> None:
        while (drained := self.journal.drain(16)) is not None:
            first, data = drained
            assert len(self.image) == record_offset(first)
            self.image += data
            self.journal.ack()


def fresh_device() -> D.Device:
    return D.Device(Journal(JournalParams(lineage=LINEAGE, file_incarnation=INCARNATION)), LIN)


def recover_full(image: bytes) -> D.Device:
    dev = fresh_device()
    dev.recover(JournalReader(image, LINEAGE))
    return dev


def recover_from(section: bytes, image: bytes) -> D.Device:
    dev = fresh_device()
    anchor = dev.load_checkpoint(section)
    reader = JournalReader(image, LINEAGE)
    reader.seek(anchor)
    dev.recover(reader)
    return dev


# --------------------------------------------------------------------------- worked example


def example() -> tuple[bytes, bytes]:
    """docs/formats/checkpoint.md's example: one REGISTER, checkpointed."""
    mj = MemJournal()
    dev = D.Device(mj.journal, LIN)
    dev.submit(ALL_GRANTS, KEYS[0], D.Request(D.Kind.REGISTER, LIN, "01" * 16, 1))
    mj.save()
    anchor = mj.journal.saved_anchor()
    assert anchor is not None
    return dev.checkpoint(anchor), bytes(mj.image)


def doc_dump() -> bytes:
    """The hex dump of docs/formats/checkpoint.md's worked example."""
    text = (ROOT / "docs" / "formats" / "checkpoint.md").read_text()
    block = text.split("## Worked example", 1)[1].split("```")[1]
    out = bytearray()
    for line in block.splitlines():
        m = re.match(r"^([0-9a-f]{4}): ((?:[0-9a-f]{2} ?){1,16})", line)
        if m:
            assert int(m.group(1), 16) == len(out), line
            out += bytes.fromhex(m.group(2))
    return bytes(out)


def test_worked_example_of_the_format_doc() -> None:
    section, image = example()
    assert section == doc_dump()
    assert len(section) == 687
    h0 = hashlib.sha256(image[:64]).digest()
    chain = [h0]
    for i in range(3):
        chain.append(hashlib.sha256(chain[-1] + image[64 + 192 * i:64 + 192 * (i + 1)]).digest())
    assert section[96:128] == chain[2] and section[128:160] == chain[3]
    assert section[-32:] == hashlib.sha256(section[:-32]).digest()


def test_example_round_trips() -> None:
    section, image = example()
    dev = recover_from(section, image)
    assert dev.participant(ALL_GRANTS, KEYS[0]).next_sequence == 2
    assert dev.checkpoint(_anchor_of(section)) == section


def _anchor_of(section: bytes) -> Anchor:
    inc, records, boot, gen = struct.unpack_from("<QQQQ", section, 48)
    return Anchor(inc, records, boot, gen, section[96:128], section[128:160])


# --------------------------------------------------------------------------- damage


def test_every_damaged_byte_is_refused_and_leaves_the_device_failed() -> None:
    section, _image = example()
    for off in range(len(section)):
        bad = bytearray(section)
        bad[off] ^= 0x01
        dev = fresh_device()
        with pytest.raises(errors.AotxError) as exc:
            dev.load_checkpoint(bytes(bad))
        assert exc.value.native == "recovery_damage", off
        assert dev.usage().participants == 0
        with pytest.raises(errors.AotxError):
            dev.submit(ALL_GRANTS, KEYS[1], D.Request(D.Kind.REGISTER, LIN, "02" * 16, 1))


def test_a_truncated_section_is_refused() -> None:
    section, _image = example()
    for cut in (0, 10, 191, 300, len(section) - 1):
        with pytest.raises(errors.AotxError) as exc:
            fresh_device().load_checkpoint(section[:cut])
        assert exc.value.native == "recovery_damage"


def test_another_lineage_is_refused() -> None:
    section, _image = example()
    other = D.Device(Journal(JournalParams(lineage=bytes(range(16)))), bytes(range(16)).hex())
    with pytest.raises(errors.AotxError) as exc:
        other.load_checkpoint(section)
    assert exc.value.native == "lineage_mismatch"


def test_seek_refuses_a_position_the_journal_does_not_hold() -> None:
    section, image = example()
    anchor = _anchor_of(section)
    bad_digest = Anchor(anchor.file_incarnation, anchor.records, anchor.boot,
                        anchor.generation, anchor.prev_digest, bytes(32))
    with pytest.raises(errors.JournalDamage) as exc:
        JournalReader(image, LINEAGE).seek(bad_digest)
    assert exc.value.fields["offset"] == record_offset(anchor.records - 1)
    other = Anchor(anchor.file_incarnation + 1, *list(vars(anchor).values())[1:])
    with pytest.raises(errors.AotxError) as exc2:
        JournalReader(image, LINEAGE).seek(other)
    assert exc2.value.native == "journal_foreign"
    with pytest.raises(errors.AotxError) as exc3:
        JournalReader(image[:record_offset(anchor.records - 1)], LINEAGE).seek(anchor)
    assert exc3.value.native == "journal_state"


def test_a_device_with_unsaved_state_cannot_checkpoint() -> None:
    mj = MemJournal()
    dev = D.Device(mj.journal, LIN)
    dev.submit(ALL_GRANTS, KEYS[0], D.Request(D.Kind.REGISTER, LIN, "01" * 16, 1))
    mj.save()
    anchor = mj.journal.saved_anchor()
    assert anchor is not None
    dev.submit(ALL_GRANTS, KEYS[0], D.Request(D.Kind.SPACE_CREATE, LIN, "02" * 16, 2))
    assert mj.journal.saved_anchor() is None     # a record is queued
    with pytest.raises(errors.AotxError) as exc:
        dev.checkpoint(anchor)                   # the space lies past the anchor
    assert exc.value.native == "device_out_of_order"


# --------------------------------------------------------------------------- equivalence


@dataclass
class World:
    """A workload's bookkeeping: what exists, so random steps name real things."""

    mj: MemJournal = field(default_factory=MemJournal)
    seq: dict[str, int] = field(default_factory=dict)
    spaces: list[str] = field(default_factory=list)
    convs: list[str] = field(default_factory=list)
    inputs: list[tuple[str, str, int]] = field(default_factory=list)  # (actor, op id, seq)
    ops: list[tuple[str, str]] = field(default_factory=list)      # every admitted op
    memory: list[str] = field(default_factory=list)
    n: int = 0

    def __post_init__(self) -> None:
        self.dev = D.Device(self.mj.journal, LIN)

    def submit(self, actor: str, kind: D.Kind, **kw: object) -> D.Receipt | None:
        self.n += 1
        seq = self.seq.get(actor, 1)
        try:
            r = self.dev.submit(ALL_GRANTS, actor, D.Request(kind, LIN, f"{self.n:032x}", seq,
                                                             **kw))  # type: ignore[arg-type]
        except errors.AotxError:
            return None
        self.seq[actor] = seq + 1
        self.ops.append((actor, r.op_id))
        return r


STEP = st.tuples(st.sampled_from(["register", "space", "member", "conversation", "input",
                                  "complete", "cancel", "retire", "memory", "publish"]),
                 st.integers(0, 2), st.integers(0, 50), st.integers(0, 50))


def apply(w: World, step: tuple[str, int, int, int]) -> None:
    what, who, a, b = step
    actor = KEYS[who]
    if what == "register":
        w.submit(actor, D.Kind.REGISTER)
    elif what == "space":
        r = w.submit(actor, D.Kind.SPACE_CREATE, scope=("private", "room", "instance")[a % 3])
        if r:
            w.spaces.append(r.resource_id)
    elif what == "member" and w.spaces:
        perms = [("read",), ("read", "write"), ("read", "write", "manage")][b % 3]
        w.submit(actor, D.Kind.MEMBER_SET, space=w.spaces[a % len(w.spaces)],
                 participant=KEYS[b % 3], permissions=perms)
    elif what == "conversation" and w.spaces:
        r = w.submit(actor, D.Kind.CONVERSATION_CREATE, space=w.spaces[a % len(w.spaces)])
        if r:
            w.convs.append(r.resource_id)
    elif what == "input" and w.convs:
        r = w.submit(actor, D.Kind.INPUT, conversation=w.convs[a % len(w.convs)],
                     text="hello " * (b % 7) + str(b), model="tiny")
        if r:
            w.inputs.append((actor, r.op_id, w.seq[actor] - 1))
    elif what == "complete" and w.inputs:
        _actor, op, _seq = w.inputs[a % len(w.inputs)]
        w.mj.save()
        try:
            w.dev.start(op)
            status = ("succeeded", "failed", "cancelled")[b % 3]
            w.dev.complete(op, status, result=f"out {b} ".encode() * (b % 5),
                           input_tokens=a, output_tokens=b,
                           finish="stop" if status == "succeeded" else "none")
        except errors.AotxError:
            pass
    elif what == "cancel":   # mostly one of the actor's inputs, else a recent sequence
        mine = [seq for who_, _op, seq in w.inputs if who_ == actor]
        target = mine[a % len(mine)] if mine and b % 4 else max(1, w.seq.get(actor, 1) - 1 - a % 4)
        w.submit(actor, D.Kind.CANCEL, target_sequence=target)
    elif what == "retire":
        w.mj.save()
        floor = max(1, w.seq.get(actor, 1) - a % 3)
        w.submit(actor, D.Kind.RETIRE, retry_floor=floor)
    elif what == "memory" and w.inputs:
        _actor, op, _seq = w.inputs[a % len(w.inputs)]
        w.mj.save()
        try:
            rows = w.dev.memory_retain(op, [float((a + i) % 7) + 0.5 for i in range(8)])
        except errors.AotxError:
            return
        w.memory.extend(row.object for row in rows if row.kind == "text")
    elif what == "publish" and w.memory and w.spaces:
        w.submit(actor, D.Kind.PUBLISH, space=w.spaces[a % len(w.spaces)],
                 object=w.memory[b % len(w.memory)], source_version=1)
    w.mj.save()


def views(dev: D.Device, w: World) -> list[object]:
    """Every read view the device answers, in a fixed order (errors included)."""
    out: list[object] = [dev.usage()]

    def read(f: object, *args: object) -> object:
        try:
            return f(*args)  # type: ignore[operator]
        except errors.AotxError as exc:
            return ("error", exc.native)

    for actor in KEYS:
        for key in KEYS:
            out.append(read(dev.participant, ALL_GRANTS, actor, key))
        out.append(read(dev.spaces, ALL_GRANTS, actor))
        for sp in w.spaces:
            out += [read(dev.space, ALL_GRANTS, actor, sp),
                    read(dev.members, ALL_GRANTS, actor, sp),
                    read(dev.conversations, ALL_GRANTS, actor, sp),
                    read(dev.memory_list, ALL_GRANTS, actor, sp)]
            for obj in w.memory:
                out.append(read(dev.memory_read, ALL_GRANTS, actor, sp, obj))
        for conv in w.convs:
            out += [read(dev.conversation, ALL_GRANTS, actor, conv),
                    read(dev.conversation_inputs, ALL_GRANTS, actor, conv)]
        for _owner, op in w.ops:
            out += [read(dev.receipt, ALL_GRANTS, actor, op),
                    read(dev.result, ALL_GRANTS, actor, op)]
    for _owner, op in w.ops:
        out.append(read(dev.canonical, op))
    for conv in w.convs:
        out.append(read(dev.conversation_inputs, ALL_GRANTS, None, conv))
    return out


@settings(max_examples=40, deadline=None)
@given(st.lists(STEP, min_size=1, max_size=60), st.lists(STEP, max_size=60))
@hexample([("input", 0, 0, 3), ("cancel", 0, 0, 1), ("input", 1, 1, 2), ("complete", 0, 1, 4),
          ("memory", 0, 0, 0), ("publish", 0, 1, 0), ("retire", 0, 0, 0)],
         [("input", 2, 2, 5), ("cancel", 1, 0, 1), ("complete", 0, 0, 2)])
def test_checkpoint_plus_suffix_reads_exactly_like_the_whole_journal(
        before: list[tuple[str, int, int, int]], after: list[tuple[str, int, int, int]]) -> None:
    w = World()
    for who, key in enumerate(KEYS):   # up front, so random steps have things to act on
        w.submit(key, D.Kind.REGISTER)
        apply(w, ("space", who, who, 0))
        apply(w, ("conversation", who, who, 0))
    for step in before:
        apply(w, step)
    w.mj.save()
    anchor = w.mj.journal.saved_anchor()
    assert anchor is not None
    section = w.dev.checkpoint(anchor)
    for step in after:
        apply(w, step)
    w.mj.save()
    image = bytes(w.mj.image)
    full = recover_full(image)
    fast = recover_from(section, image)
    assert views(fast, w) == views(full, w)
    # and the live device agrees too, on what recovery does not change (no interrupt)
    assert full.usage() == fast.usage()


def test_seek_checks_the_crc_of_every_prefix_record() -> None:
    section, image = example()
    anchor = _anchor_of(section)
    for off in range(64, record_offset(anchor.records - 1)):   # records before the last
        bad = bytearray(image)
        bad[off] ^= 0x10
        with pytest.raises(errors.JournalDamage) as exc:
            JournalReader(bytes(bad), LINEAGE).seek(anchor)
        rec = (off - 64) // 192
        assert exc.value.fields["offset"] == record_offset(rec), off
        JournalReader(bytes(bad), LINEAGE).seek(anchor, check_prefix=False)  # not asked
