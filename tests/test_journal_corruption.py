"""Recovery fails closed: every single-byte flip and every truncation of a journal.

Each case runs the native reader (csrc/journal_reader.c) over a damaged copy
of a real journal image.  A flip must be refused with an offset inside the
damaged record, or -- only when nothing intact follows it -- end the journal
as a torn tail that drops exactly the damaged (last) transfer.  Every
truncation must end cleanly at the last complete transfer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aotx_trio import errors
from aotx_trio.journal import (
    FILE_HEADER,
    RECORD_SIZE,
    XFER_ADMISSION,
    XFER_COMPLETION,
    XFER_LEASE,
    XFER_OUTPUT,
    Journal,
    JournalParams,
    Transfer,
    recover_journal,
)
from aotx_trio.runtime.emitter import JOURNAL_NAME, open_journal_file

LINEAGE = bytes(range(1, 17))


def build_image() -> tuple[bytes, list[Transfer]]:
    """boot, admission (1 part), output (7 parts), completion (1), lease (3 parts, last)."""
    j = Journal(JournalParams(lineage=LINEAGE, file_incarnation=0xFEEDFACE))
    payloads = [(XFER_ADMISSION, b"admit:" + bytes(range(40))),
                (XFER_OUTPUT, bytes((i * 13) & 0xFF for i in range(1000))),
                (XFER_COMPLETION, b"done"),
                (XFER_LEASE, bytes((i * 7 + 3) & 0xFF for i in range(400)))]
    for kind, data in payloads:
        j.enqueue(kind, data)
    image = bytearray(j.header())
    while (d := j.drain()) is not None:
        image += d[1]
        j.ack()
    rec = recover_journal(bytes(image), LINEAGE)
    assert rec.valid_end == len(image)
    assert [(t.kind, t.data) for t in rec.transfers[1:]] == payloads
    return bytes(image), rec.transfers


IMAGE, TRANSFERS = build_image()


def transfer_end(t: Transfer) -> int:
    return FILE_HEADER + RECORD_SIZE * (t.last_record + 1)


def record_span(offset: int) -> tuple[int, int]:
    """[start, end) of the header or record holding byte ``offset``."""
    if offset < FILE_HEADER:
        return 0, FILE_HEADER
    i = (offset - FILE_HEADER) // RECORD_SIZE
    start = FILE_HEADER + RECORD_SIZE * i
    return start, start + RECORD_SIZE


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
    # Not refused: only legal as a torn tail dropping exactly the last transfer.
    last = TRANSFERS[-1]
    first_off = FILE_HEADER + RECORD_SIZE * last.first_record
    assert first_off <= offset, (offset, mask, "damage before the last transfer accepted")
    assert rec.valid_end == first_off, (offset, mask)
    assert rec.transfers == TRANSFERS[:-1], (offset, mask)
    return "torn"


def test_every_single_byte_flip_is_detected() -> None:
    outcomes = {"refused": 0, "torn": 0}
    for offset in range(len(IMAGE)):
        for mask in (0xFF, 0x01):
            outcomes[check_flip(offset, mask)] += 1
    assert sum(outcomes.values()) == 2 * len(IMAGE)
    # The last transfer has 3 parts: damage in its final part (nothing intact
    # after it) is a torn tail; everything else is refused.
    assert outcomes["torn"] == 2 * RECORD_SIZE
    assert outcomes["refused"] == 2 * (len(IMAGE) - RECORD_SIZE)


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


def test_torn_tail_is_truncated_at_open(tmp_path: Path) -> None:
    path = tmp_path / JOURNAL_NAME
    cut = len(IMAGE) - RECORD_SIZE - 5                # inside the last transfer
    path.write_bytes(IMAGE[:cut])
    jf = open_journal_file(tmp_path, LINEAGE)
    try:
        want_end = FILE_HEADER + RECORD_SIZE * TRANSFERS[-1].first_record
        assert jf.truncated_bytes == cut - want_end
        assert path.stat().st_size == want_end
        assert jf.transfers == TRANSFERS[:-1]
        s = jf.journal.save_state()
        assert s.next_record == TRANSFERS[-1].first_record and s.boot == 1
    finally:
        jf.close()


def test_foreign_lineage_refuses_to_start(tmp_path: Path) -> None:
    (tmp_path / JOURNAL_NAME).write_bytes(IMAGE)
    with pytest.raises(errors.AotxError) as ei:
        open_journal_file(tmp_path, bytes(16))
    assert ei.value.code == "journal_foreign" and ei.value.fields["offset"] == 16
