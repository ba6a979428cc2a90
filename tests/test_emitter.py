"""aotx_trio.runtime.emitter: tick emitter, group commit, fault sweeps at the I/O edge.

The fault sweep runs a fixed tick sequence once to count its I/O operations,
then for every operation index N injects EIO, ENOSPC, a short write or an
fsync failure, once or forever, and recovers from the bytes a crash would
leave (the fsynced "durable" image and the page-cache image).  The fake file
models a failed fsync the way Linux may: the unsynced pages are dropped.  So
an emitter that retried the fsync without rewriting would lose acked data.
"""

from __future__ import annotations

import collections
import errno
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
import trio.testing

from aotx_trio import errors
from aotx_trio.native.journal import (
    FILE_HEADER,
    HOLD_DISK,
    HOLD_FILE_CAP,
    RECORD_SIZE,
    RUN_FAILED,
    RUN_FLOOR,
    RUN_IDLE,
    RUN_INTERRUPTED,
    XFER_ADMISSION,
    XFER_BOOT,
    XFER_OUTPUT,
    Journal,
    JournalParams,
    JournalReader,
    recover_journal,
)
from aotx_trio.runtime.emitter import Emitter
from aotx_trio.runtime.journal_file import JOURNAL_NAME, FileOps, open_journal_file

LINEAGE = b"emitter-lineage!"


@dataclass
class FakeFile(FileOps):
    """An in-memory journal file with injectable faults.

    ``cache`` is what reads see; ``durable`` what survives power loss (the
    bytes as of the last successful fsync).  ``fault(op_index, op)`` returns
    the fault to inject into operation ``op_index`` ("pwrite"/"fsync") or None.
    """

    cache: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    fault: Callable[[int, str], str | None] = lambda n, op: None
    ops: int = 0
    events: list[tuple[str, int, int, bool]] = field(default_factory=list)
    in_thread = False

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        n = self.ops
        self.ops += 1
        f = self.fault(n, "pwrite")
        if f in ("eio", "enospc"):
            self.events.append(("pwrite", offset, 0, False))
            code = errno.EIO if f == "eio" else errno.ENOSPC
            raise OSError(code, os.strerror(code))
        length = len(data) if f != "short" else max(1, len(data) // 2)
        if len(self.cache) < offset:
            self.cache.extend(bytes(offset - len(self.cache)))
        self.cache[offset:offset + length] = bytes(data[:length])
        self.events.append(("pwrite", offset, length, True))
        return length

    def fsync(self, fd: int) -> None:
        n = self.ops
        self.ops += 1
        f = self.fault(n, "fsync")
        if f in ("eio", "enospc", "fsync"):
            self.events.append(("fsync", 0, 0, False))
            self.cache = bytearray(self.durable)   # dirty pages dropped
            code = errno.ENOSPC if f == "enospc" else errno.EIO
            raise OSError(code, os.strerror(code))
        self.events.append(("fsync", 0, 0, True))
        self.durable = bytes(self.cache)


class ThreadedFile(FakeFile):
    """The fake file as blocking operations: the emitter runs its loop in its thread."""

    in_thread = True


def fresh() -> tuple[Journal, FakeFile]:
    j = Journal(JournalParams(lineage=LINEAGE, file_incarnation=42))
    f = FakeFile()
    f.cache = bytearray(j.header())
    f.durable = bytes(f.cache)
    return j, f


WAVES: list[list[tuple[int, bytes]]] = [
    [(XFER_ADMISSION, b"a1" * 5), (XFER_OUTPUT, bytes(range(250)) * 4),
     (XFER_ADMISSION, bytes(3000))],
    [(XFER_ADMISSION, b"b1"), (XFER_OUTPUT, bytes((i * 5) & 0xFF for i in range(8192)))],
]


@dataclass
class Outcome:
    enqueued: list[tuple[int, bytes]] = field(default_factory=list)
    acked: list[int] = field(default_factory=list)    # positions in enqueued
    refused: int = 0


async def workload(emitter: Emitter, out: Outcome) -> None:
    """Two waves of transfers, each waited for by its own task (group commit)."""
    for wave in WAVES:
        lasts: list[tuple[int, int]] = []
        for kind, data in wave:
            try:
                last = emitter.journal.enqueue(kind, data)
            except errors.JournalHold:
                out.refused += 1
                continue
            out.enqueued.append((kind, data))
            lasts.append((len(out.enqueued) - 1, last))
        emitter.wake()

        async def waiter(pos: int, last: int) -> None:
            await emitter.wait_saved(last)
            out.acked.append(pos)

        with trio.move_on_after(120):
            async with trio.open_nursery() as n:
                for pos, last in lasts:
                    n.start_soon(waiter, pos, last)


async def run_sequence(fault: Callable[[int, str], str | None], *, threaded: bool = False,
                       ) -> tuple[Emitter, FakeFile, Outcome]:
    j, f = fresh()
    if threaded:   # the same fake, as blocking operations: the emitter's thread loop
        f = ThreadedFile(cache=f.cache, durable=f.durable)
    f.fault = fault
    emitter = Emitter(j, 3, ops=f, backoff_initial=0.005 if threaded else 0.05)
    out = Outcome()
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        await workload(emitter, out)
        n.cancel_scope.cancel()
    return emitter, f, out


def check_recovery(image: bytes, out: Outcome, saved_records: int | None) -> int:
    """The image holds a prefix of the enqueued transfers, every acked one, each once."""
    rec = recover_journal(image, LINEAGE)
    got = [(t.kind, t.data) for t in rec.transfers if t.kind != XFER_BOOT]
    assert got == out.enqueued[:len(got)]
    assert all(pos < len(got) for pos in out.acked), (out.acked, len(got))
    if saved_records is not None:   # nothing acked that was not made durable, byte for byte
        end = FILE_HEADER + RECORD_SIZE * saved_records
        assert len(image) >= end and image[:end] == BASELINE_IMAGE[:end]
    # the recovered file continues
    r = JournalReader(image[:rec.valid_end], LINEAGE)
    list(r)
    j2 = Journal(JournalParams(lineage=LINEAGE))
    j2.resume(r)
    last = j2.enqueue(XFER_ADMISSION, b"after")
    assert last == (rec.valid_end - FILE_HEADER) // RECORD_SIZE + 1
    return len(got)


def check_rewrites(f: FakeFile) -> int:
    """After every failed fsync, the lost bytes are pwritten again before the next good fsync."""
    dirty: list[tuple[int, int]] = []
    lost: bytearray | None = None
    failures = 0
    for op, off, length, ok in f.events:
        if op == "pwrite" and ok:
            dirty.append((off, length))
            if lost is not None:
                lost[off:off + length] = bytes(length)
        elif op == "fsync" and not ok:
            failures += 1
            mask = bytearray(max((o + n for o, n in dirty), default=0)) if lost is None else lost
            for o, n in dirty:
                if len(mask) < o + n:
                    mask.extend(bytes(o + n - len(mask)))
                mask[o:o + n] = b"\x01" * n
            lost, dirty = mask, []
        elif op == "fsync" and ok:
            assert lost is None or not any(lost), "fsync ok before the lost bytes were rewritten"
            lost, dirty = None, []
    return failures


async def test_baseline_sequence() -> None:
    emitter, f, out = await run_sequence(lambda n, op: None)
    assert len(out.acked) == 5 and out.refused == 0
    records = 1 + 1 + 7 + 19 + 1 + 52
    assert f.durable == bytes(f.cache) and len(f.durable) == FILE_HEADER + RECORD_SIZE * records
    assert check_recovery(f.durable, out, emitter.saved_records) == 5
    assert emitter.saved_records == records and emitter.failures == 0
    s = emitter.journal.save_state()
    assert s.generation == emitter.ticks == f.ops // 2
    # at most 16 records per tick
    assert all(n <= 16 * RECORD_SIZE for op, _, n, _ in f.events if op == "pwrite")


def baseline() -> tuple[int, bytes]:
    async def main() -> tuple[int, bytes]:
        _, f, _ = await run_sequence(lambda n, op: None)
        return f.ops, f.durable
    return trio.run(main)


BASELINE_OPS, BASELINE_IMAGE = baseline()


@pytest.mark.parametrize("forever", [False, True], ids=["once", "forever"])
@pytest.mark.parametrize("kind", ["eio", "enospc", "short", "fsync"])
async def test_fault_sweep(kind: str, forever: bool, autojump_clock: trio.testing.MockClock,
                           ) -> None:
    eligible = {"eio": ("pwrite", "fsync"), "enospc": ("pwrite", "fsync"),
                "short": ("pwrite",), "fsync": ("fsync",)}[kind]
    injected_any = 0
    for target in range(BASELINE_OPS):
        fired: list[int] = []

        def fault(n: int, op: str, target: int = target, fired: list[int] = fired) -> str | None:
            if op not in eligible or n < target or (fired and not forever):
                return None
            fired.append(n)
            return kind

        emitter, f, out = await run_sequence(fault)
        if not fired:
            continue
        injected_any += 1
        # what survives power loss, and what survives a process crash
        n_durable = check_recovery(f.durable, out, emitter.saved_records)
        check_recovery(bytes(f.cache), out, None)
        rewrites_checked = check_rewrites(f)
        s = emitter.journal.save_state()
        if not forever or kind == "short":
            # the fault is behind us: everything was saved, the hold cleared
            assert n_durable == len(out.enqueued) == 5 and sorted(out.acked) == list(range(5))
            assert s.hold == 0 and s.disk_error == 0 and s.saved_records == s.next_record
            if kind != "short":
                assert emitter.failures == 1
        else:
            # stuck: the journal holds, reports the errno, and accepted nothing unsaved
            assert emitter.failures >= 2
            assert s.hold & HOLD_DISK
            assert s.disk_error == {"eio": errno.EIO, "enospc": errno.ENOSPC,
                                    "fsync": errno.EIO}[kind]
            assert s.saved_records < s.next_record
            assert len(out.acked) <= n_durable < 5 or out.refused > 0
        if kind in ("fsync", "eio", "enospc") and any(
                op == "fsync" and not ok for op, _, _, ok in f.events):
            assert rewrites_checked >= 1
    assert injected_any > 0


async def test_fsync_failure_rewrites_before_ack(autojump_clock: trio.testing.MockClock) -> None:
    """Count pwrites: the records of a failed fsync are written twice, then acked."""
    emitter, f, out = await run_sequence(lambda n, op: "fsync" if n == 1 else None)
    writes = [(o, n) for op, o, n, ok in f.events if op == "pwrite" and ok]
    assert writes[0] == writes[1] == (FILE_HEADER, 16 * RECORD_SIZE)
    ops = [(op, ok) for op, _, _, ok in f.events][:4]
    assert ops == [("pwrite", True), ("fsync", False), ("pwrite", True), ("fsync", True)]
    assert len(out.acked) == 5 and check_recovery(f.durable, out, emitter.saved_records) == 5


async def test_enospc_holds_then_clears(autojump_clock: trio.testing.MockClock) -> None:
    j, f = fresh()
    space = {"full": True}
    f.fault = lambda n, op: "enospc" if space["full"] and op == "pwrite" else None
    emitter = Emitter(j, 3, ops=f)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        last = j.enqueue(XFER_ADMISSION, b"x")
        emitter.wake()
        await trio.sleep(5)
        s = j.save_state()
        assert s.hold == HOLD_DISK and s.disk_error == errno.ENOSPC and s.saved_records == 0
        with pytest.raises(errors.JournalHold):
            j.enqueue(XFER_ADMISSION, b"y")
        assert j.save_state().next_record == last + 1
        space["full"] = False
        with trio.fail_after(10):
            await emitter.wait_saved(last)
        s = j.save_state()
        assert s.hold == 0 and s.disk_error == 0
        j.enqueue(XFER_ADMISSION, b"y")
        n.cancel_scope.cancel()


async def test_file_cap_hold_until_raised(autojump_clock: trio.testing.MockClock) -> None:
    j = Journal(JournalParams(lineage=LINEAGE, file_cap_bytes=FILE_HEADER + 3 * RECORD_SIZE))
    f = FakeFile(cache=bytearray(j.header()))
    emitter = Emitter(j, 3, ops=f)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        last = j.enqueue(XFER_ADMISSION, b"1")
        emitter.wake()
        await emitter.wait_saved(last)
        with pytest.raises(errors.JournalHold):
            j.enqueue(XFER_ADMISSION, bytes(320))
        assert j.save_state().hold == HOLD_FILE_CAP
        with pytest.raises(errors.JournalHold):
            j.enqueue(XFER_ADMISSION, b"2")
        emitter.set_file_cap(0)
        last = j.enqueue(XFER_ADMISSION, bytes(320))
        emitter.wake()
        await emitter.wait_saved(last)
        n.cancel_scope.cancel()
    assert len(f.cache) == FILE_HEADER + 4 * RECORD_SIZE   # boot, "1", 2 parts


@dataclass
class FreeSpace(FakeFile):
    """A fake file on a file system with ``free`` bytes left (statvfs); writes use it up."""

    free: int = 1 << 40

    def free_bytes(self, path: str) -> int:
        return self.free

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        n = super().pwrite(fd, data, offset)
        self.free -= n
        return n


async def floor_holds_new_writes_but_saves_pending_ones(f: FreeSpace,
                                                      recheck_s: float) -> None:
    """Under the disk floor the pending record is still saved and new writes hold (before
    any fails); with space again the recheck releases the hold (either loop)."""
    j = Journal(JournalParams(lineage=LINEAGE))
    f.cache = bytearray(j.header())
    f.durable = bytes(f.cache)
    emitter = Emitter(j, 3, ops=f, directory="/nowhere", min_free_bytes=10_000,
                      floor_recheck_s=recheck_s)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        last = j.enqueue(XFER_ADMISSION, b"admitted before the pressure")
        f.free = 10_000 + 100                          # under the floor once this tick writes
        emitter.wake()
        with trio.fail_after(5):
            await emitter.wait_saved(last)             # the pending record is still saved
        s = j.save_state()
        assert s.hold == HOLD_DISK and s.disk_error == 0 and emitter.floor_hold
        with pytest.raises(errors.JournalHold):        # new writes hold, before any fails
            j.enqueue(XFER_ADMISSION, b"refused")
        assert j.save_state().next_record == last + 1
        assert recover_journal(f.durable).transfers[-1].data == b"admitted before the pressure"
        f.free = 1 << 30                               # space again: the recheck releases
        with trio.fail_after(5):
            while j.save_state().hold or emitter.floor_hold:
                await trio.sleep(0.01)
        last = j.enqueue(XFER_ADMISSION, b"after")
        emitter.wake()
        with trio.fail_after(5):
            await emitter.wait_saved(last)
        n.cancel_scope.cancel()
    assert [t.data for t in recover_journal(f.durable).transfers if t.kind != XFER_BOOT] == [
        b"admitted before the pressure", b"after"]


async def test_disk_floor_holds_new_writes_but_saves_pending_ones(
        autojump_clock: trio.testing.MockClock) -> None:
    await floor_holds_new_writes_but_saves_pending_ones(FreeSpace(), 0.5)


async def test_disk_floor_over_the_real_free_space_holds_from_the_start(
        tmp_path: Path) -> None:
    jf = open_journal_file(tmp_path, LINEAGE)
    try:
        free = FileOps().free_bytes(str(tmp_path))
        emitter = Emitter.for_file(jf, min_free_bytes=free + (1 << 40))
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            assert jf.journal.save_state().hold == HOLD_DISK
            with pytest.raises(errors.JournalHold):
                jf.journal.enqueue(XFER_ADMISSION, b"x")
            emitter.min_free_bytes = 0                 # the operator lowered the floor
            assert not emitter.check_floor()
            assert jf.journal.save_state().hold == 0
            n.cancel_scope.cancel()
    finally:
        jf.close()


async def test_disk_floor_keeps_a_disk_error_hold(autojump_clock: trio.testing.MockClock,
                                                  ) -> None:
    j = Journal(JournalParams(lineage=LINEAGE))
    f = FreeSpace(cache=bytearray(j.header()))
    f.fault = lambda n, op: "eio" if op == "pwrite" else None
    emitter = Emitter(j, 3, ops=f, directory="/nowhere", min_free_bytes=1)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        j.enqueue(XFER_ADMISSION, b"x")
        emitter.wake()
        await trio.sleep(1)
        assert emitter.last_error is not None         # the write failed: disk hold
        f.free = 0
        assert emitter.check_floor()
        f.free = 1 << 30
        assert not emitter.check_floor()
        assert j.save_state().hold == HOLD_DISK        # the failed write still waits
        n.cancel_scope.cancel()


async def test_group_commit_many_waiters_one_fsync() -> None:
    j, f = fresh()
    emitter = Emitter(j, 3, ops=f)
    done: list[int] = []

    async def producer(i: int) -> None:
        last = j.enqueue(XFER_ADMISSION, b"p%d" % i)
        emitter.wake()
        await emitter.wait_saved(last)
        done.append(i)

    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        async with trio.open_nursery() as p:
            for i in range(15):
                p.start_soon(producer, i)
        n.cancel_scope.cancel()
    assert sorted(done) == list(range(15))
    fsyncs = [e for e in f.events if e[0] == "fsync"]
    assert len(fsyncs) <= 2 < len(done)        # 16 records (boot + 15) in at most 2 ticks


async def test_wait_saved_with_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    """A timed wait answers True once saved, False once its timeout passed first (woken
    by run's one expirer at its deadline, whatever the order of the deadlines); woken
    entries leave the deadline heap as saves come; without run, a wait times out
    alone."""
    j, f = fresh()
    space = {"full": True}
    f.fault = lambda n, op: "enospc" if space["full"] and op == "pwrite" else None
    emitter = Emitter(j, 3, ops=f, backoff_initial=0.5, backoff_max=0.5)
    last = j.enqueue(XFER_ADMISSION, b"x")
    start = trio.current_time()
    assert await emitter.wait_saved(last, 2.0) is False    # run is not up
    assert trio.current_time() - start == pytest.approx(2.0)
    woke: dict[float, float] = {}

    async def timed(timeout: float) -> None:
        t0 = trio.current_time()
        assert await emitter.wait_saved(last, timeout) is False
        woke[timeout] = trio.current_time() - t0

    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        emitter.wake()
        async with trio.open_nursery() as w:
            for timeout in (5.0, 1.0, 3.0):   # a later waiter with an earlier deadline
                w.start_soon(timed, timeout)
                await trio.sleep(0)
        assert woke == {t: pytest.approx(t) for t in (5.0, 1.0, 3.0)}
        assert emitter.saved_records <= last
        space["full"] = False
        assert await emitter.wait_saved(last, 30.0) is True
        assert emitter.saved_records > last
        nxt = j.enqueue(XFER_ADMISSION, b"y")
        emitter.wake()
        assert await emitter.wait_saved(nxt, 30.0) is True
        assert emitter._deadlines == []       # saved waiters left the heap at once
        assert await emitter.wait_saved(nxt, 0.0) is True   # saved: no wait at all
        n.cancel_scope.cancel()


async def test_cancel_during_backoff_is_not_swallowed(
        autojump_clock: trio.testing.MockClock) -> None:
    j, f = fresh()
    f.fault = lambda n, op: "eio"
    emitter = Emitter(j, 3, ops=f, backoff_initial=1.0, backoff_max=1.0)
    with trio.move_on_after(30) as scope:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            j.enqueue(XFER_ADMISSION, b"x")
            emitter.wake()
    assert scope.cancelled_caught
    assert 20 <= emitter.failures <= 32           # retried about once a second
    assert j.save_state().in_flight_records == 0  # nothing left dangling in flight


async def test_real_file_create_reopen_continue(tmp_path: Path) -> None:
    jf = await trio.to_thread.run_sync(open_journal_file, tmp_path, LINEAGE)
    assert jf.created and (tmp_path / JOURNAL_NAME).stat().st_size == FILE_HEADER
    assert not (tmp_path / (JOURNAL_NAME + ".tmp")).exists()
    emitter = Emitter.for_file(jf)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        lasts = [jf.journal.enqueue(XFER_OUTPUT, bytes([i]) * (100 * i)) for i in range(1, 8)]
        emitter.wake()
        await emitter.wait_saved(lasts[-1])
        await emitter.flush()
        n.cancel_scope.cancel()
    s1 = jf.journal.save_state()
    jf.close()
    jf2 = await trio.to_thread.run_sync(open_journal_file, tmp_path, LINEAGE)
    try:
        assert not jf2.created and jf2.truncated_bytes == 0
        assert [t.data for t in jf2.transfers[1:]] == [bytes([i]) * (100 * i) for i in range(1, 8)]
        s2 = jf2.journal.save_state()
        assert s2.next_record == s1.next_record and s2.commit_digest == s1.commit_digest
        assert s2.file_incarnation == s1.file_incarnation and s2.generation >= s1.generation
        assert jf2.journal.begin_boot() == s1.next_record and jf2.journal.save_state().boot == 2
    finally:
        jf2.close()


class RecordingOps(FileOps):
    """The real file operations, with a log of their names."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        self.log.append("open" + (".tmp" if path.endswith(".tmp") else ""))
        return super().open(path, flags, mode)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self.log.append("pwrite")
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        self.log.append("fsync")
        super().fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        self.log.append(f"ftruncate {length}")
        super().ftruncate(fd, length)

    def rename(self, src: str, dst: str) -> None:
        self.log.append("rename")
        super().rename(src, dst)

    def fsync_dir(self, path: str) -> None:
        self.log.append("fsync_dir")
        super().fsync_dir(path)


def test_create_is_durable_and_torn_tail_truncation_is_fsynced(tmp_path: Path) -> None:
    ops = RecordingOps()
    jf = open_journal_file(tmp_path, LINEAGE, ops=ops)
    jf.close()
    assert ops.log == ["open.tmp", "pwrite", "fsync", "rename", "fsync_dir", "open"]
    path = tmp_path / JOURNAL_NAME
    with path.open("ab") as f:
        f.write(bytes(100))                      # a torn partial record
    ops.log.clear()
    jf = open_journal_file(tmp_path, LINEAGE, ops=ops)
    jf.close()
    assert ops.log == ["open", f"ftruncate {FILE_HEADER}", "fsync"]
    assert path.stat().st_size == FILE_HEADER


def test_the_journal_folder_lock_is_exclusive(tmp_path: Path) -> None:
    jf = open_journal_file(tmp_path, LINEAGE)
    try:
        with pytest.raises(errors.ConfigError) as info:
            open_journal_file(tmp_path, LINEAGE)
        assert info.value.code == "journal_locked"
        assert f"pid {os.getpid()}" in info.value.message
    finally:
        jf.close()
    again = open_journal_file(tmp_path, LINEAGE)   # released by close()
    again.close()


async def test_idle_emitter_writes_the_commit_watermark_that_guards_the_last_save(
        tmp_path: Path) -> None:
    from aotx_trio.runtime.watermark import read_watermark

    jf = open_journal_file(tmp_path, LINEAGE)
    emitter = Emitter.for_file(jf, commit_delay_s=0.01)
    try:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            last = jf.journal.enqueue(XFER_ADMISSION, b"acknowledged")
            emitter.wake()
            await emitter.wait_saved(last)
            with trio.fail_after(5):
                while emitter.watermarks == 0:
                    await trio.sleep(0.01)
            n.cancel_scope.cancel()
        s = jf.journal.save_state()
        mark = read_watermark(tmp_path, s.file_incarnation)
        assert mark is not None and mark.saved_records == s.saved_records == last + 1
        assert mark.commit_digest == s.commit_digest and mark.generation == s.generation
    finally:
        jf.close()
    path = tmp_path / JOURNAL_NAME
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01                 # the last, acknowledged record: not a torn tail
    path.write_bytes(bytes(data))
    with pytest.raises(errors.JournalDamage) as info:
        open_journal_file(tmp_path, LINEAGE)
    assert info.value.fields["offset"] == FILE_HEADER + RECORD_SIZE * last
    assert path.read_bytes() == bytes(data)


# --------------------------------------------------------------------------- thread loop


@pytest.mark.parametrize("kind", ["eio", "enospc", "short", "fsync"])
@pytest.mark.parametrize("at", range(6))
async def test_thread_loop_faults_rewrite_before_the_next_fsync(kind: str, at: int) -> None:
    """The thread loop (blocking file operations) under one fault at the I/O operation
    ``at``: every transfer is saved once, nothing acked that is not durable, and the
    bytes a failed fsync dropped are written again before the next good one."""
    emitter, f, out = await run_sequence(
        lambda n, op: kind if n == at and (kind != "fsync" or op == "fsync") else None,
        threaded=True)
    # a transfer enqueued while the failed write holds the journal is refused (429 in the
    # API); whether one was depends on when the thread drained: every other is saved
    assert len(out.acked) == len(out.enqueued) == 5 - out.refused >= 3
    # (no byte-for-byte check against the trio loop's baseline: each record carries the
    # generation of the save that wrote it, and the thread's ticks fall where they fall)
    assert check_recovery(f.durable, out, None) == len(out.enqueued)
    saved = recover_journal(f.durable[:FILE_HEADER + RECORD_SIZE * emitter.saved_records],
                            LINEAGE)   # every acked record is durable and verifies
    assert saved.valid_end == FILE_HEADER + RECORD_SIZE * emitter.saved_records
    check_rewrites(f)
    assert emitter.failures == (1 if kind != "short" and (kind != "fsync" or any(
        op == "fsync" and not ok for op, _, _, ok in f.events)) else 0)
    assert all(length <= 16 * RECORD_SIZE for op, _, length, _ in f.events if op == "pwrite")
    assert emitter.journal.save_state().in_flight_records == 0


def produced(tag: bytes, i: int, k: int) -> bytes:
    """Producer ``i``'s ``k``-th transfer (sizes from one record to several)."""
    return (tag + b"%d-%d" % (i, k)) * (1 + k * 40)


async def twenty_producers(j: Journal, emitter: Emitter, tag: bytes, timeout: float
                           ) -> list[int]:
    """20 tasks, each enqueueing its 5 transfers one after another and waiting for each
    save; every one finishes within ``timeout``.  The save count each saw, in order."""
    seen: list[int] = []
    done: list[int] = []

    async def producer(i: int) -> None:
        for k in range(5):
            last = j.enqueue(XFER_ADMISSION, produced(tag, i, k))
            emitter.wake()
            await emitter.wait_saved(last)
            assert emitter.saved_records > last
            seen.append(emitter.saved_records)
        done.append(i)

    with trio.fail_after(timeout):
        async with trio.open_nursery() as p:
            for i in range(20):
                p.start_soon(producer, i)
    assert sorted(done) == list(range(20))
    return seen


async def test_thread_loop_group_commit_and_save_order() -> None:
    """Many waiters share the thread's fsyncs (at most 16 records a tick); each wakes once
    its own record is saved, and the save count only grows."""
    j, f = fresh()
    f = ThreadedFile(cache=f.cache, durable=f.durable)
    emitter = Emitter(j, 3, ops=f)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        seen = await twenty_producers(j, emitter, b"p", 30)
        n.cancel_scope.cancel()
    assert seen == sorted(seen)
    fsyncs = sum(1 for e in f.events if e[0] == "fsync")
    assert fsyncs == emitter.ticks < 100 and emitter.tick_seconds.count == fsyncs
    assert all(length <= 16 * RECORD_SIZE for op, _, length, _ in f.events if op == "pwrite")
    rec = recover_journal(f.durable, LINEAGE)
    assert len([t for t in rec.transfers if t.kind != XFER_BOOT]) == 100
    assert emitter.saved_records == j.save_state().saved_records


class SlowFsync(ThreadedFile):
    """Each fsync takes ``delay`` seconds (in the emitter's thread)."""

    delay = 0.3
    started = 0

    def fsync(self, fd: int) -> None:
        self.started += 1
        import time
        time.sleep(self.delay)
        super().fsync(fd)


async def test_thread_loop_stops_after_the_tick_in_flight() -> None:
    """Cancelled while its fsync runs, the emitter waits for it: the tick is acked (never
    left in flight), its waiter could see it, and nothing after it is written."""
    j, f0 = fresh()
    f = SlowFsync(cache=f0.cache, durable=f0.durable)
    emitter = Emitter(j, 3, ops=f)
    last = j.enqueue(XFER_ADMISSION, b"in flight at the cancel")
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        emitter.wake()
        with trio.fail_after(5):
            while f.started == 0:
                await trio.sleep(0.01)
        later = j.enqueue(XFER_ADMISSION, b"after the cancel")
        emitter.wake()
        n.cancel_scope.cancel()
    s = j.save_state()
    assert s.in_flight_records == 0 and s.saved_records == last + 1 <= later
    assert f.started == 1 and recover_journal(f.durable, LINEAGE).transfers[-1].data == \
        b"in flight at the cancel"


class BrokenFsync(ThreadedFile):
    def fsync(self, fd: int) -> None:
        raise RuntimeError("not an OSError")


async def test_thread_loop_error_reaches_trio_and_nacks() -> None:
    """An exception of the thread loop that is no OSError ends run with it (the records
    are nacked: their outcome is unknown, they are rewritten later)."""
    j, f0 = fresh()
    emitter = Emitter(j, 3, ops=BrokenFsync(cache=f0.cache, durable=f0.durable))
    j.enqueue(XFER_ADMISSION, b"x")
    with pytest.raises(BaseExceptionGroup) as info, trio.fail_after(5):
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            emitter.wake()
            await trio.sleep_forever()
    assert any(isinstance(e, RuntimeError) for e in info.value.exceptions
               ) or "not an OSError" in repr(info.value)
    s = j.save_state()
    assert s.in_flight_records == 0 and s.saved_records == 0 and s.disk_error != 0


@dataclass
class ThreadedFreeSpace(FreeSpace):
    in_thread = True


async def test_thread_loop_disk_floor_holds_new_writes_but_saves_pending_ones() -> None:
    await floor_holds_new_writes_but_saves_pending_ones(ThreadedFreeSpace(), 0.05)


class TimedFile(ThreadedFile):
    """Records when each fsync starts (time.monotonic)."""

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)   # type: ignore[arg-type]
        self.fsync_at: list[float] = []

    def fsync(self, fd: int) -> None:
        import time
        self.fsync_at.append(time.monotonic())
        super().fsync(fd)


async def test_thread_loop_spaces_back_to_back_ticks() -> None:
    """Ticks that follow each other start tick_spacing_s apart (records pile up into the
    next one meanwhile); a tick after an idle spell starts at once."""
    import time

    j, f0 = fresh()
    f = TimedFile(cache=f0.cache, durable=f0.durable)
    emitter = Emitter(j, 3, ops=f, tick_spacing_s=0.05)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)

        async def producer(i: int) -> None:
            for k in range(3):
                last = j.enqueue(XFER_ADMISSION, b"%d.%d" % (i, k))
                emitter.wake()
                await emitter.wait_saved(last)

        with trio.fail_after(20):
            async with trio.open_nursery() as p:
                for i in range(8):
                    p.start_soon(producer, i)
        gaps = [b - a for a, b in zip(f.fsync_at, f.fsync_at[1:], strict=False)]
        assert gaps and min(gaps) >= 0.045 and len(f.fsync_at) < 24
        await trio.sleep(0.2)   # idle, then one more: written without waiting
        last = j.enqueue(XFER_ADMISSION, b"after a pause")
        t0 = time.monotonic()
        emitter.wake()
        await emitter.wait_saved(last)
        assert time.monotonic() - t0 < 0.045
        n.cancel_scope.cancel()


# --------------------------------------------------------------------------- native tick


async def test_native_ticks_group_commit_on_a_real_file(tmp_path: Path) -> None:
    """With the plain file operations the thread loop makes every tick in one native call
    (aotx_journal_tick): the same group commit (<= 16 records a save), every waiter
    woken once its record is durable, the file recovers every transfer."""
    jf = open_journal_file(tmp_path, LINEAGE)
    emitter = Emitter.for_file(jf)
    assert emitter.native_ticks_possible()
    assert not Emitter(jf.journal, jf.fd, ops=ThreadedFile()).native_ticks_possible()
    patched = FileOps()
    patched.fsync = lambda fd: None   # type: ignore[method-assign]
    assert not Emitter(jf.journal, jf.fd, ops=patched).native_ticks_possible()
    j = jf.journal
    try:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            await twenty_producers(j, emitter, b"n", 60)
            n.cancel_scope.cancel()
        s = j.save_state()
        assert emitter.native_ticks == emitter.ticks > 0
        assert emitter.fsync_seconds.count == emitter.tick_seconds.count == emitter.ticks
        assert s.generation >= emitter.ticks and s.saved_records == emitter.saved_records
        assert s.in_flight_records == 0
    finally:
        jf.close()
    image = (tmp_path / JOURNAL_NAME).read_bytes()
    rec = recover_journal(image, LINEAGE)
    got = [t.data for t in rec.transfers if t.kind != XFER_BOOT]
    assert sorted(got) == sorted(produced(b"n", i, k) for i in range(20) for k in range(5))
    # every save (one generation stamp, bytes 22..27 of a record) holds <= 16 records
    stamps = collections.Counter(
        int.from_bytes(image[at + 22:at + 28], "little")
        for at in range(FILE_HEADER, len(image), RECORD_SIZE))
    assert len(stamps) >= emitter.ticks and max(stamps.values()) <= 16


async def test_native_tick_failed_write_is_nacked_then_rewritten(tmp_path: Path) -> None:
    """A native tick whose pwrite fails (here: a read-only descriptor) comes back as its
    errno; the records are nacked (journal hold, disk error), nothing is acknowledged,
    and once writes work again the same records are written and the waiter wakes."""
    jf = open_journal_file(tmp_path, LINEAGE)
    emitter = Emitter.for_file(jf, backoff_initial=0.01, backoff_max=0.02)
    good = jf.fd
    bad = os.open(tmp_path / JOURNAL_NAME, os.O_RDONLY)
    try:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            emitter.fd = bad
            last = jf.journal.enqueue(XFER_ADMISSION, b"written once it can be")
            emitter.wake()
            with trio.fail_after(10):
                while emitter.failures == 0:
                    await trio.sleep(0.005)
            s = jf.journal.save_state()
            assert s.disk_error == errno.EBADF and s.saved_records <= last
            assert isinstance(emitter.last_error, OSError)
            assert emitter.last_error.errno == errno.EBADF
            assert not await emitter.wait_saved(last, timeout=0.05)
            emitter.fd = good                        # the disk is back
            with trio.fail_after(10):
                assert await emitter.wait_saved(last)
            n.cancel_scope.cancel()
        s = jf.journal.save_state()
        assert s.disk_error == 0 and s.in_flight_records == 0 and emitter.last_error is None
    finally:
        os.close(bad)
        jf.close()
    rec = recover_journal((tmp_path / JOURNAL_NAME).read_bytes(), LINEAGE)
    assert [t.data for t in rec.transfers if t.kind != XFER_BOOT] == [b"written once it can be"]


def test_journal_tick_with_nothing_pending_and_bad_arguments(tmp_path: Path) -> None:
    j = Journal(JournalParams(lineage=LINEAGE))
    fd = os.open(tmp_path / "j", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        assert j.tick(fd)[1:] == (0, 0, 0.0)
        with pytest.raises(ValueError):
            j.tick(fd, 17)
        with pytest.raises(errors.AotxError):
            j.tick(-1)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- native loop


@pytest.mark.timeout(60)
def test_journal_run_ticks_until_idle_and_logs_each_tick(tmp_path: Path) -> None:
    """aotx_journal_run on a real file: every pending record saved in ticks of <= 16, each
    tick logged (take_ticks) and rung on the doorbell, then IDLE after idle_s."""
    jf = open_journal_file(tmp_path, LINEAGE)
    j = jf.journal
    bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    try:
        last = 0
        for i in range(40):
            last = j.enqueue(XFER_ADMISSION, b"r%d" % i)
        res = j.run(jf.fd, notify_fd=bell, max_records=16, idle_s=0.01, wait_s=0.5)
        assert res.reason == RUN_IDLE and res.ticks >= 3 and res.err == 0
        s = j.save_state()
        assert s.saved_records == last + 1 and s.in_flight_records == 0
        assert os.eventfd_read(bell) == res.ticks
        saved, times = j.take_ticks()
        assert saved == last + 1 and len(times) == res.ticks
        assert all(t >= f >= 0 for t, f in times)
        assert j.take_ticks() == (saved, [])
        # nothing pending: back after wait_s, no tick
        res = j.run(jf.fd, notify_fd=bell, wait_s=0.02)
        assert res.reason == RUN_IDLE and res.ticks == 0
    finally:
        os.close(bell)
        jf.close()
    rec = recover_journal((tmp_path / JOURNAL_NAME).read_bytes(), LINEAGE)
    assert [t.data for t in rec.transfers if t.kind != XFER_BOOT] == \
        [b"r%d" % i for i in range(40)]


@pytest.mark.timeout(60)
def test_journal_run_interrupt_floor_failure_and_bad_arguments(tmp_path: Path) -> None:
    """An interrupt ends a run that waits without a deadline; a floor over the free space
    returns FLOOR before anything is drained; a failed pwrite returns FAILED with the
    records in flight (the caller nacks); bad arguments are refused."""
    import threading

    jf = open_journal_file(tmp_path, LINEAGE)
    j = jf.journal
    try:
        j.run(jf.fd, idle_s=0.0, wait_s=0.05)   # nothing pending: back after wait_s
        out: list[object] = []
        t = threading.Thread(target=lambda: out.append(j.run(jf.fd, wait_s=0.0)))
        t.start()
        import time
        time.sleep(0.05)
        assert not out   # waiting for records, no deadline
        j.interrupt()
        t.join(5)
        assert out and getattr(out[0], "reason", None) == RUN_INTERRUPTED
        before = j.save_state()
        last = j.enqueue(XFER_ADMISSION, b"held back by the floor")
        free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
        res = j.run(jf.fd, min_free_bytes=free + (1 << 40), wait_s=0.5)
        assert res.reason == RUN_FLOOR and res.ticks == 0 and res.free_bytes < free + (1 << 40)
        s = j.save_state()
        assert s.saved_records == before.saved_records and s.in_flight_records == 0
        bad = os.open(tmp_path / JOURNAL_NAME, os.O_RDONLY)
        try:
            res = j.run(bad, wait_s=0.5)
        finally:
            os.close(bad)
        assert res.reason == RUN_FAILED and res.err == errno.EBADF
        assert res.first_record <= last < res.first_record + res.records
        assert j.save_state().in_flight_records == res.records
        j.nack(res.err)
        res = j.run(jf.fd, min_free_bytes=1, idle_s=0.0)   # a floor that is met
        assert res.reason == RUN_IDLE and res.ticks == 1
        assert j.save_state().saved_records == last + 1
        with pytest.raises(ValueError):
            j.run(jf.fd, max_records=17)
        with pytest.raises(errors.AotxError):
            j.run(-1)
    finally:
        jf.close()


async def test_native_loop_floor_holds_before_writing_new_records(tmp_path: Path) -> None:
    """The emitter's native loop on a real file under a disk floor it cannot meet: the
    hold is set (new enqueues refused) and the records admitted before are still saved
    (by the Python steps, which check the floor every tick while it holds)."""
    jf = open_journal_file(tmp_path, LINEAGE)
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    emitter = Emitter.for_file(jf, min_free_bytes=free + (1 << 40), floor_recheck_s=0.05,
                               watermark=False)
    j = jf.journal
    try:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            assert emitter.floor_hold   # run's first check
            with trio.fail_after(10):
                while j.save_state().next_record > emitter.saved_records:
                    await trio.sleep(0.01)   # the boot record: still saved
            assert j.save_state().hold & HOLD_DISK
            with pytest.raises(errors.JournalHold):
                j.enqueue(XFER_ADMISSION, b"refused")
            emitter.min_free_bytes = 1   # room again: the recheck releases the hold
            with trio.fail_after(10):
                while emitter.floor_hold:
                    await trio.sleep(0.01)
            last = j.enqueue(XFER_ADMISSION, b"after the floor")
            emitter.wake()
            with trio.fail_after(10):
                assert await emitter.wait_saved(last)
            n.cancel_scope.cancel()
        assert emitter.native_ticks >= 1   # back on the native loop
    finally:
        jf.close()


async def test_native_loop_gives_way_to_patched_file_operations(tmp_path: Path) -> None:
    """Patching fsync on the running emitter's file operations (or swapping them) makes
    the native loop return: the next tick goes through the patched Python call."""
    jf = open_journal_file(tmp_path, LINEAGE)
    emitter = Emitter.for_file(jf, watermark=False)
    j = jf.journal
    calls: list[int] = []
    real = jf.ops.fsync
    try:
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            last = j.enqueue(XFER_ADMISSION, b"native")
            emitter.wake()
            with trio.fail_after(10):
                await emitter.wait_saved(last)
            native = emitter.native_ticks
            assert native >= 1 and emitter.native_run_possible()

            def counted(fd: int) -> None:
                calls.append(fd)
                real(fd)

            jf.ops.fsync = counted   # type: ignore[method-assign]
            assert not emitter.native_run_possible()
            last = j.enqueue(XFER_ADMISSION, b"through the patch")
            emitter.wake()
            with trio.fail_after(10):
                await emitter.wait_saved(last)
            assert calls and emitter.native_ticks == native
            jf.ops.fsync = real   # type: ignore[method-assign]
            n.cancel_scope.cancel()
    finally:
        jf.close()
