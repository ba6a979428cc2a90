"""A boot from a checkpoint copies and replays only the suffix (issue 8, item 9): the
journal's header, the checkpoint's last record and the records after it, into a
private snapshot (never a live map of the file), the prefix CRC-checked through a
read-only map (never copied), with the torn-tail quarantine, the watermark check and
fail-closed damage refusals kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from _gateway_env import make_runtime_file
from test_checkpoint import LIN, _state, _write

from aotx_trio import errors
from aotx_trio.native.journal import FILE_HEADER, RECORD_SIZE, Anchor, record_offset
from aotx_trio.runtime import checkpoint
from aotx_trio.runtime.journal_file import JOURNAL_NAME, FileOps, JournalFile, open_journal_file
from aotx_trio.runtime.watermark import WatermarkWriter, read_watermark

pytestmark = pytest.mark.timeout(300)


class CountingOps(FileOps):
    """Real file I/O that records every span read; a whole-file read fails the test."""

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def read_all(self, fd: int) -> bytes:
        raise AssertionError("a checkpoint boot read the whole journal")

    def read_into(self, fd: int, buf: memoryview, offset: int) -> None:
        self.spans.append((offset, len(buf)))
        super().read_into(fd, buf, offset)


def _journal(tmp_path: Path, prefix: int = 40, suffix: int = 6) -> tuple[Path, Path, Anchor]:
    """A journal whose checkpoint covers ``prefix`` mutations, then ``suffix`` more
    written without the runtime file (so the checkpoint stays where it was)."""
    rt = make_runtime_file(tmp_path / "rt")
    j = tmp_path / "j"
    trio.run(_write, j, rt, 1, prefix)
    trio.run(_write, j, None, prefix + 1, suffix)
    info = checkpoint.parse_section(checkpoint.read_section(rt) or b"")
    return j, rt, info.anchor


def _open(j: Path, rt: Path, ops: FileOps | None = None) -> JournalFile:
    info = checkpoint.parse_section(checkpoint.read_section(rt) or b"")
    return open_journal_file(j, LIN, resume=False, ops=ops,
                             position=checkpoint.journal_position(info, LIN, str(j)))


def test_a_checkpoint_boot_reads_only_the_header_and_the_suffix(tmp_path: Path) -> None:
    j, rt, anchor = _journal(tmp_path)
    size = (j / JOURNAL_NAME).stat().st_size
    first = record_offset(anchor.records - 1)
    assert first > 20 * RECORD_SIZE and size > first   # a real prefix and a real suffix
    ops = CountingOps()
    jf = _open(j, rt, ops)
    try:
        assert jf.start == anchor and jf.truncated_bytes == 0
        for off, n in ops.spans:
            assert off + n <= FILE_HEADER or off >= first, (off, n)
        # the header twice at most (check + snapshot), the last record twice, the suffix once
        assert sum(n for _, n in ops.spans) <= 2 * FILE_HEADER + RECORD_SIZE + (size - first)
        replay = list(jf.replay_reader(LIN))
    finally:
        jf.close()
    full = open_journal_file(j, LIN, resume=False)
    try:
        after = [t for t in full.transfers if t.first_record >= anchor.records]
    finally:
        full.close()
    assert after and jf.transfers == after == replay
    # and the device's state from checkpoint + suffix is the full replay's
    ck, full_state = trio.run(_state, j, rt), trio.run(_state, j, None)
    assert ck[0] == anchor.records and full_state[0] == 0
    assert ck[2:] == full_state[2:]


def test_the_snapshot_is_not_a_live_view_of_the_file(tmp_path: Path) -> None:
    """Bytes written to the file after the open (the emitter rewriting unacknowledged
    records in place) never reach the device's replay of what was verified."""
    j, rt, anchor = _journal(tmp_path)
    jf = _open(j, rt)
    try:
        first = record_offset(anchor.records)
        os.pwrite(jf.fd, b"\xa5" * (os.fstat(jf.fd).st_size - first), first)
        assert list(jf.replay_reader(LIN)) == jf.transfers and jf.transfers
    finally:
        jf.close()


def test_a_torn_tail_after_the_checkpoint_is_quarantined_and_truncated(tmp_path: Path) -> None:
    j, rt, anchor = _journal(tmp_path)
    path = j / JOURNAL_NAME
    size = path.stat().st_size
    junk = bytes(range(256))[:RECORD_SIZE + 77]
    with path.open("ab") as f:
        f.write(junk)
    jf = _open(j, rt)
    try:
        assert jf.start == anchor and jf.truncated_bytes == len(junk)
        assert len(jf.image) == size and list(jf.replay_reader(LIN)) == jf.transfers
    finally:
        jf.close()
    assert path.stat().st_size == size
    kept = list((j / "quarantine").iterdir())
    assert len(kept) == 1 and kept[0].read_bytes() == junk
    assert kept[0].name.startswith(f"torn-{size}-")
    start, *_ = trio.run(_state, j, rt)   # the runtime boots on it, from the checkpoint
    assert start == anchor.records


def test_damage_in_the_suffix_refuses_and_truncates_nothing(tmp_path: Path) -> None:
    j, rt, anchor = _journal(tmp_path)
    path = j / JOURNAL_NAME
    raw = bytearray(path.read_bytes())
    off = record_offset(anchor.records) + 60
    raw[off] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(errors.JournalDamage) as exc:
        _open(j, rt).close()
    assert exc.value.fields["offset"] == record_offset(anchor.records)
    assert path.read_bytes() == bytes(raw) and not (j / "quarantine").exists()


def test_acknowledged_records_missing_after_the_checkpoint_refuse(tmp_path: Path) -> None:
    """The commit watermark still guards the suffix: a cut that drops acknowledged
    records is damage, not a torn tail (nothing truncated)."""
    j, rt, anchor = _journal(tmp_path)
    path = j / JOURNAL_NAME
    full = open_journal_file(j, LIN)   # resumed: its save state is the file's end
    s = full.journal.save_state()
    full.close()
    WatermarkWriter(j, s.file_incarnation).write(s.generation, s.saved_records,
                                                 s.commit_digest)
    mark = read_watermark(j, s.file_incarnation)
    records = (path.stat().st_size - FILE_HEADER) // RECORD_SIZE
    assert mark is not None and mark.saved_records == records > anchor.records
    cut = record_offset(records - 1) + 100    # inside the last acknowledged record
    os.truncate(path, cut)
    with pytest.raises(errors.JournalDamage):
        _open(j, rt).close()
    assert path.stat().st_size == cut and not (j / "quarantine").exists()


def test_prefix_damage_still_refuses_a_checkpoint_boot(tmp_path: Path) -> None:
    """The prefix is CRC-checked through a map (not copied): damage there fails closed
    with the record's offset, as a full read would."""
    j, rt, anchor = _journal(tmp_path)
    path = j / JOURNAL_NAME
    raw = bytearray(path.read_bytes())
    off = record_offset(anchor.records // 2) + 50
    raw[off] ^= 1
    path.write_bytes(bytes(raw))
    ops = CountingOps()
    with pytest.raises(errors.JournalDamage) as exc:
        _open(j, rt, ops).close()
    assert exc.value.fields["offset"] == record_offset(anchor.records // 2)
    assert path.read_bytes() == bytes(raw) and not (j / "quarantine").exists()
    with pytest.raises(errors.JournalDamage):   # and a full replay refuses as ever
        open_journal_file(j, LIN, resume=False).close()
