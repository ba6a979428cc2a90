"""Recovery fails closed: every single-byte flip and every truncation of a journal.

Each case runs the native reader (csrc/journal/journal_reader.c) over a damaged copy
of a real journal image written in three saves.  A flip must be refused with
an offset inside the damaged record, or -- only inside the last save, which
no later save confirmed -- end the journal as a torn tail that drops the
damaged transfer and everything after it.  With the emitter's commit
watermark (journal.commit) naming the last save as acknowledged, those flips
are refused too: no acknowledged record is ever dropped.  Every truncation
must end cleanly at the last complete transfer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aotx_trio import errors
from aotx_trio.native.journal import (
    FILE_HEADER,
    RECORD_SIZE,
    XFER_ADMISSION,
    XFER_COMPLETION,
    XFER_LEASE,
    XFER_OUTPUT,
    Journal,
    JournalParams,
    JournalReader,
    Transfer,
    recover_journal,
)
from aotx_trio.runtime.journal_file import JOURNAL_NAME, open_journal_file
from aotx_trio.runtime.watermark import WatermarkWriter

LINEAGE = bytes(range(1, 17))


def build_image() -> tuple[bytes, list[Transfer]]:
    """Save 1: boot, admission (1 part); save 2: output (7 parts); save 3: completion (1),
    lease (3 parts)."""
    j = Journal(JournalParams(lineage=LINEAGE, file_incarnation=0xFEEDFACE))
    payloads = [(XFER_ADMISSION, b"admit:" + bytes(range(40))),
                (XFER_OUTPUT, bytes((i * 13) & 0xFF for i in range(1000))),
                (XFER_COMPLETION, b"done"),
                (XFER_LEASE, bytes((i * 7 + 3) & 0xFF for i in range(400)))]
    for kind, data in payloads:
        j.enqueue(kind, data)
    image = bytearray(j.header())
    for n in (2, 7, 4):
        d = j.drain(n)
        assert d is not None
        image += d[1]
        j.ack()
    rec = recover_journal(bytes(image), LINEAGE)
    assert rec.valid_end == len(image)
    assert [(t.kind, t.data) for t in rec.transfers[1:]] == payloads
    return bytes(image), rec.transfers


IMAGE, TRANSFERS = build_image()
RECORDS = (len(IMAGE) - FILE_HEADER) // RECORD_SIZE      # 13
# Save 3 starts at record 9; a flip there is refused (see below), so torn tails start at 10.
LAST_SAVE_FIRST = 10


def transfer_end(t: Transfer) -> int:
    return FILE_HEADER + RECORD_SIZE * (t.last_record + 1)


def record_span(offset: int) -> tuple[int, int]:
    """[start, end) of the header or record holding byte ``offset``."""
    if offset < FILE_HEADER:
        return 0, FILE_HEADER
    i = (offset - FILE_HEADER) // RECORD_SIZE
    start = FILE_HEADER + RECORD_SIZE * i
    return start, start + RECORD_SIZE


def holding(index: int) -> Transfer:
    return next(t for t in TRANSFERS if t.first_record <= index <= t.last_record)


def check_flip(offset: int, mask: int) -> str:
    damaged = bytearray(IMAGE)
    damaged[offset] ^= mask
    lo, hi = record_span(offset)
    try:
        rec = recover_journal(bytes(damaged), LINEAGE)
    except (errors.JournalDamage, errors.FormatError) as exc:
        assert exc.code in ("journal_damage", "journal_foreign"), exc
        where = exc.fields["offset"]
        assert lo <= where < hi, (offset, mask, where)
        assert f"offset {where}" in str(exc)
        return "refused"
    # Not refused: only legal inside the last, unconfirmed save, as a torn tail that
    # drops the damaged transfer and everything after it.
    index = (offset - FILE_HEADER) // RECORD_SIZE
    assert index >= LAST_SAVE_FIRST, (offset, mask, "damage to a confirmed save accepted")
    hit = holding(index)
    assert rec.valid_end == FILE_HEADER + RECORD_SIZE * hit.first_record, (offset, mask)
    assert rec.transfers == TRANSFERS[:TRANSFERS.index(hit)], (offset, mask)
    return "torn"


def test_every_single_byte_flip_is_detected() -> None:
    outcomes = {"refused": 0, "torn": 0}
    for offset in range(len(IMAGE)):
        for mask in (0xFF, 0x01):
            outcomes[check_flip(offset, mask)] += 1
    assert sum(outcomes.values()) == 2 * len(IMAGE)
    # Only in the last save, which nothing after it confirmed, can a flip be a crash's
    # torn write; its first record is the one ambiguous case: a later intact record of a
    # later save than the one before it could mean either, so it is refused (fail closed).
    assert outcomes["torn"] == 2 * 3 * RECORD_SIZE
    assert outcomes["refused"] == 2 * (len(IMAGE) - 3 * RECORD_SIZE)


def _digest(image: bytes) -> bytes:
    r = JournalReader(image, LINEAGE)
    list(r)
    return r.digest


def test_the_commit_watermark_protects_the_last_save(tmp_path: Path) -> None:
    """With journal.commit naming every record as acknowledged, a flip in the last save
    refuses to start, naming the offset, and truncates nothing."""
    incarnation = recover_journal(IMAGE, LINEAGE).incarnation
    for index in range(LAST_SAVE_FIRST, RECORDS):
        folder = tmp_path / f"r{index}"
        folder.mkdir()
        WatermarkWriter(folder, incarnation).write(3, RECORDS, _digest(IMAGE))
        damaged = bytearray(IMAGE)
        damaged[FILE_HEADER + RECORD_SIZE * index + 40] ^= 0x04
        path = folder / JOURNAL_NAME
        path.write_bytes(bytes(damaged))
        with pytest.raises(errors.JournalDamage) as ei:
            open_journal_file(folder, LINEAGE)
        first = holding(index).first_record
        assert ei.value.fields["offset"] == FILE_HEADER + RECORD_SIZE * first
        assert "acknowledged" in str(ei.value) and "nothing truncated" in str(ei.value)
        assert path.read_bytes() == bytes(damaged)
        assert not (folder / "quarantine").exists()
    # the intact file agrees with its watermark: it opens
    folder = tmp_path / "good"
    folder.mkdir()
    writer = WatermarkWriter(folder, incarnation)
    writer.write(3, RECORDS, _digest(IMAGE))
    (folder / JOURNAL_NAME).write_bytes(IMAGE)
    open_journal_file(folder, LINEAGE).close()
    # the same count with another digest: not the file that was acknowledged
    writer.write(3, RECORDS, bytes(32))
    with pytest.raises(errors.JournalDamage):
        open_journal_file(folder, LINEAGE)
    # a watermark of another journal file (another incarnation) is ignored
    folder = tmp_path / "other"
    folder.mkdir()
    WatermarkWriter(folder, incarnation + 1).write(9, 99, bytes(32))
    (folder / JOURNAL_NAME).write_bytes(IMAGE)
    open_journal_file(folder, LINEAGE).close()


def test_every_truncation_ends_at_the_last_complete_transfer() -> None:
    ends = [transfer_end(t) for t in TRANSFERS]
    for length in range(FILE_HEADER, len(IMAGE) + 1):
        rec = recover_journal(IMAGE[:length], LINEAGE)
        complete = [t for t, e in zip(TRANSFERS, ends, strict=True) if e <= length]
        assert rec.transfers == complete, length
        assert rec.valid_end == (ends[len(complete) - 1] if complete else FILE_HEADER), length
    for length in range(FILE_HEADER):
        with pytest.raises(errors.AotxError) as ei:
            recover_journal(IMAGE[:length], LINEAGE)
        assert ei.value.code == "journal_foreign"


def test_zero_filled_tail_is_torn_not_damage() -> None:
    """A crash can leave zero-filled blocks after the last fsynced record."""
    rec = recover_journal(IMAGE + bytes(RECORD_SIZE * 3 + 17), LINEAGE)
    assert rec.transfers == TRANSFERS and rec.valid_end == len(IMAGE)


def test_damage_in_the_middle_refuses_to_start(tmp_path: Path) -> None:
    damaged = bytearray(IMAGE)
    bad = FILE_HEADER + RECORD_SIZE * 3 + 50      # inside the output transfer
    damaged[bad] ^= 0x40
    path = tmp_path / JOURNAL_NAME
    path.write_bytes(bytes(damaged))
    with pytest.raises(errors.JournalDamage) as ei:
        open_journal_file(tmp_path, LINEAGE)
    where = FILE_HEADER + RECORD_SIZE * 3
    assert ei.value.fields["offset"] == where
    assert f"at byte offset {where}" in str(ei.value) and str(path) in str(ei.value)
    assert path.read_bytes() == bytes(damaged)     # nothing truncated or rewritten


def test_torn_tail_is_truncated_at_open_and_kept_in_quarantine(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_NAME
    image, transfers = IMAGE, TRANSFERS
    cut = len(image) - RECORD_SIZE - 5                # inside the last transfer
    path.write_bytes(image[:cut])
    jf = open_journal_file(tmp_path, LINEAGE)
    try:
        want_end = FILE_HEADER + RECORD_SIZE * transfers[-1].first_record
        assert jf.truncated_bytes == cut - want_end
        assert path.stat().st_size == want_end
        assert jf.transfers == transfers[:-1]
        s = jf.journal.save_state()
        assert s.next_record == transfers[-1].first_record and s.boot == 1
    finally:
        jf.close()
    (kept,) = (tmp_path / "quarantine").iterdir()     # the dropped bytes, as they were
    assert kept.name.startswith(f"torn-{want_end}-") and kept.suffix == ".aotxj"
    assert kept.read_bytes() == image[want_end:cut]


def test_foreign_lineage_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(IMAGE)
    with pytest.raises(errors.AotxError) as ei:
        open_journal_file(tmp_path, bytes(16))
    assert ei.value.code == "journal_foreign" and ei.value.fields["offset"] == 16
