"""The journal's tick emitter: it makes enqueued records durable.

The journal file it writes is opened by
:func:`~aotx_trio.runtime.journal_file.open_journal_file` (runtime/journal_file.py:
the file's operations, lock, creation, verification and quarantine).

:class:`Emitter` makes records durable::

    loop: wait until records are pending (Emitter.wake())
          drain <= 16 records -> disk floor check -> pwrite at their offsets -> fsync -> ack
          on OSError: nack(errno) (journal holds), back off, then drain the
          same records again and REWRITE them before the next fsync.

With blocking file operations (``FileOps.in_thread``: the real file) that loop runs
in one long-lived worker thread, tick after tick, and hands each save to trio with
``TrioToken.run_sync_soon`` (which wakes its waiters): a tick never waits for a turn
of the (busy) trio loop, neither to start its write nor to see its fsync's result.
The journal's native calls it makes (drain, ack, nack, hold) take the journal's own
mutex.  Back-to-back ticks start at least ``tick_spacing_s`` (1 ms) apart: with a
fast fsync an eager loop wrote a tick per mutation or two, and every tick costs the
trio thread a hand-off (the callback, and the thread taking the GIL six times); a
tick after an idle spell starts at once.  With in-memory file operations (the tests'
fakes) the loop is a trio task (:meth:`Emitter.tick`); both run the same steps with
the same rules.  With the plain file operations (no pwrite, fsync or free_bytes of a
subclass, none patched on the instance) the thread runs the whole loop in one native
call, ``aotx_journal_run`` (:meth:`Journal.run`): it waits for records on a condition
variable the journal's enqueue signals, spaces and makes the ticks (drain, pwrite,
fsync, ack), checks the disk floor, logs each tick's times and rings an eventfd that
one trio task reads (:meth:`Emitter._ring`: it takes the saves and wakes the waiters),
all without the GIL, so the busy trio thread is not made to hand it over at every
step of every tick.  It comes back to Python only for a failed write or fsync (its
errno, the records still in flight: nacked as above), a floor under the limit, an
idle spell (the commit watermark) or an interrupt (stop, or the file descriptor or
file operations swapped or patched:
:meth:`~aotx_trio.runtime.journal_file.FileOps.watch`).  Otherwise (the
fault-injecting subclasses of the tests) the thread makes the Python steps, each
tick in one native call (``aotx_journal_tick``) when pwrite and fsync are plain.

Under ``min_free_bytes`` of free space (statvfs of the journal folder) the
emitter sets the disk hold, so new enqueues are refused before a write can
fail, and keeps writing the records already admitted.  The native loop's check
calls fstatvfs at most every ``floor_stat_s`` (5 ms) and counts the bytes it wrote
since; a check that would fail always calls it again first.

An fsync failure is never retried into "success": after a failed fsync the
records are written again before the next fsync.  ``wait_saved(i)`` returns
once record ``i`` is saved; many waiters share one fsync (group commit).

Every file operation goes through a
:class:`~aotx_trio.runtime.journal_file.FileOps` object, so tests can inject faults at
the I/O edge.  Byte layout: ``docs/formats/journal.md``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import itertools
import logging
import math
import os
import threading
import time
from typing import Any

import trio

from aotx_trio.native.journal import (
    HOLD_DISK,
    RECORD_SIZE,
    RUN_FAILED,
    RUN_FLOOR,
    RUN_IDLE,
    TICK_RECORDS,
    Journal,
    record_offset,
)
from aotx_trio.runtime.journal_file import FileOps, JournalFile, write_all
from aotx_trio.runtime.stats import Histogram
from aotx_trio.runtime.watermark import WatermarkWriter

log = logging.getLogger(__name__)

COMMIT_DELAY_S = 0.05     # idle this long after a save before the watermark records it
TICK_SPACING_S = 0.001    # the thread loop's ticks start at least this far apart
FLOOR_STAT_S = 0.005      # the native loop's statvfs for the disk floor: at most this often
NATIVE_WAIT_S = 1.0       # the native loop comes back this often when nothing happens


class Emitter:
    """The tick emitter: drain <= 16 records, write, fsync, ack (see module doc)."""

    def __init__(self, journal: Journal, fd: int, *, ops: FileOps | None = None,
                 tick_records: int = TICK_RECORDS, backoff_initial: float = 0.05,
                 backoff_max: float = 2.0, directory: str | os.PathLike[str] | None = None,
                 min_free_bytes: int = 0, floor_recheck_s: float = 1.0,
                 watermark: WatermarkWriter | None = None,
                 commit_delay_s: float = COMMIT_DELAY_S,
                 tick_spacing_s: float = TICK_SPACING_S,
                 floor_stat_s: float = FLOOR_STAT_S) -> None:
        if not 0 < tick_records <= TICK_RECORDS:
            raise ValueError(f"tick_records must be 1..{TICK_RECORDS}")
        self.journal = journal
        self._fd = fd
        self._ops: FileOps | None = None
        self.ops = ops or FileOps()
        self.tick_records = tick_records
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # disk floor: below min_free_bytes free on `directory`'s file system, new
        # enqueues hold (hold bit 1) while the pending records are still written
        self.directory = None if directory is None else str(directory)
        self.min_free_bytes = min_free_bytes
        self.floor_recheck_s = floor_recheck_s
        self.floor_stat_s = floor_stat_s   # the native loop's statvfs interval
        self.floor_hold = False
        # idle this long after a save: record it in the commit watermark, so recovery
        # never reads a damaged acknowledged record as a torn tail (watermark.py)
        self.watermark = watermark
        self.commit_delay_s = commit_delay_s
        # the thread loop starts a tick at most this often (module doc)
        self.tick_spacing_s = tick_spacing_s
        self._commit_at: float | None = None
        self.watermarks = 0
        self.saved_records = journal.save_state().saved_records
        self.ticks = 0
        self.native_ticks = 0   # of them, ticks made in one native call (thread loop)
        # ticks are counted by the worker thread and, for the native loop's, by the trio
        # thread (_take_native): one lock so that no increment is lost between them
        self._count_lock = threading.Lock()
        self.failures = 0
        # wall-clock seconds of each saved tick (drain to ack) and of its fsync alone
        self.tick_seconds = Histogram()
        self.fsync_seconds = Histogram()
        self.last_error: OSError | None = None
        self._wake = trio.Event()
        # (record index, tie-break, event) of each waiter, a min-heap: a save wakes only
        # the waiters whose record it saved, not every waiter on every tick
        self._waiters: list[tuple[int, int, trio.Event]] = []
        self._waiter_ids = itertools.count()
        # (deadline, tie-break, event) of each waiter with a timeout, a min-heap: one
        # task (run's) wakes the waiters whose deadline passed, so a wait with a timeout
        # costs no cancel scope of its own; entries already woken are dropped as saves
        # come (the earliest deadlines are the earliest waiters)
        self._deadlines: list[tuple[float, int, trio.Event]] = []
        self._expirer_until = math.inf   # the deadline the expirer sleeps to
        self._expirer_wake = trio.Event()
        self._expiring = False           # run's expirer is up
        # the worker thread's loop (ops.in_thread): woken by wake() through _kick
        self._cv = threading.Condition(threading.Lock())
        self._kicked = True              # records may be pending (checked at its start)
        self._stopping = False
        # acked by the thread, not yet seen by trio: the save count and each tick's times;
        # _notifying while a _saved callback is scheduled and has not started
        self._thread_saved = 0
        self._tick_times: collections.deque[tuple[float, float]] = collections.deque()
        self._notifying = False
        # the native loop's doorbell (an eventfd the trio side reads; -1: none)
        self._bell = -1

    @property
    def fd(self) -> int:
        return self._fd

    @fd.setter
    def fd(self, fd: int) -> None:   # a native loop in flight writes the new one next tick
        self._fd = fd
        self.journal.interrupt()

    @property
    def ops(self) -> FileOps:
        assert self._ops is not None
        return self._ops

    @ops.setter
    def ops(self, ops: FileOps) -> None:
        # swapped (or patched: FileOps.watch) while running: a native loop in flight
        # returns before its next tick, and the thread asks again how to tick
        if self._ops is not None:
            self._ops.unwatch(self.journal.interrupt)
        self._ops = ops
        ops.watch(self.journal.interrupt)
        self.journal.interrupt()

    @classmethod
    def for_file(cls, jf: JournalFile, *, tick_records: int = TICK_RECORDS,
                 backoff_initial: float = 0.05, backoff_max: float = 2.0,
                 min_free_bytes: int = 0, floor_recheck_s: float = 1.0,
                 watermark: bool = True, commit_delay_s: float = COMMIT_DELAY_S) -> Emitter:
        mark = WatermarkWriter(jf.path.parent, jf.journal.save_state().file_incarnation) \
            if watermark else None
        return cls(jf.journal, jf.fd, ops=jf.ops, tick_records=tick_records,
                   backoff_initial=backoff_initial, backoff_max=backoff_max,
                   directory=jf.path.parent, min_free_bytes=min_free_bytes,
                   floor_recheck_s=floor_recheck_s, watermark=mark,
                   commit_delay_s=commit_delay_s)

    def check_floor(self, writing: int = 0) -> bool:
        """Hold new enqueues while the file system has under ``min_free_bytes`` free
        (after ``writing`` more bytes); release the hold once it has again (unless a
        failed write still waits for its rewrite).  True while held."""
        if self.directory is None or self.min_free_bytes <= 0:
            low = False
        else:
            try:
                low = self.ops.free_bytes(self.directory) < self.min_free_bytes + writing
            except OSError as exc:   # cannot tell: hold rather than risk a failing write
                log.warning("journal folder %s: statvfs failed: %s", self.directory, exc)
                low = True
        if low:
            if not self.floor_hold:
                log.warning("journal folder %s: free space under %d bytes: holding new "
                            "writes", self.directory, self.min_free_bytes)
            self.journal.set_hold(HOLD_DISK, True)
        elif self.floor_hold:
            log.info("journal folder %s: free space back over %d bytes", self.directory,
                     self.min_free_bytes)
            # ends the floor's hold; a failed write's stays until its rewrite is acked
            self.journal.set_hold(HOLD_DISK, False)
        self.floor_hold = low
        return low

    def wake(self) -> None:
        """Records were enqueued (call from the trio thread)."""
        self._wake.set()
        if not self._kicked:   # set: the thread has yet to drain, and drains these too
            with self._cv:
                self._kicked = True
                self._cv.notify()

    def set_file_cap(self, file_cap_bytes: int) -> None:
        """Raise (or set) the file cap; clears the file-cap hold."""
        self.journal.set_file_cap(file_cap_bytes)

    def _pending(self) -> bool:
        s = self.journal.save_state()
        return s.next_record > s.saved_records + s.in_flight_records

    async def wait_saved(self, record_index: int, timeout: float = math.inf) -> bool:
        """Return once ``record_index`` is saved (saved_records > record_index): True;
        or once ``timeout`` seconds have passed first: False."""
        if self.saved_records > record_index:
            return True
        event = trio.Event()
        heapq.heappush(self._waiters, (record_index, next(self._waiter_ids), event))
        if timeout < math.inf:
            if not self._expiring:   # run is not up: no expirer, a scope of its own
                with trio.move_on_after(timeout):
                    await event.wait()
                return self.saved_records > record_index
            deadline = trio.current_time() + timeout
            heapq.heappush(self._deadlines, (deadline, next(self._waiter_ids), event))
            if deadline < self._expirer_until:
                self._expirer_wake.set()
        await event.wait()
        return self.saved_records > record_index

    def _wake_saved(self) -> None:
        while self._waiters and self._waiters[0][0] < self.saved_records:
            heapq.heappop(self._waiters)[2].set()
        while self._deadlines and self._deadlines[0][2].is_set():
            heapq.heappop(self._deadlines)

    async def _expire(self) -> None:
        """Wake each waiter whose timeout passed before its record was saved."""
        deadlines = self._deadlines
        while True:
            now = trio.current_time()
            while deadlines and (deadlines[0][2].is_set() or deadlines[0][0] <= now):
                heapq.heappop(deadlines)[2].set()
            self._expirer_until = deadlines[0][0] if deadlines else math.inf
            with trio.move_on_at(self._expirer_until):
                await self._expirer_wake.wait()
            self._expirer_wake = trio.Event()

    async def flush(self) -> None:
        """Wait until every record enqueued so far is saved."""
        last = self.journal.save_state().next_record - 1
        if last >= 0:
            self.wake()
            await self.wait_saved(last)

    def _write_and_sync(self, first: int, data: bytes) -> None:
        write_all(self.ops, self.fd, data, record_offset(first))
        start = time.perf_counter()
        self.ops.fsync(self.fd)
        self.fsync_seconds.observe(time.perf_counter() - start)

    async def tick(self) -> bool | None:
        """One drain/write/fsync/ack. None: nothing pending; True: saved; False: failed."""
        drained = self.journal.drain(self.tick_records)
        if drained is None:
            return None
        first, data = drained
        started = time.perf_counter()
        self.ticks += 1
        self.check_floor(len(data))
        try:
            if self.ops.in_thread:
                # not abandoned on cancel: the result (ack or nack) is always recorded
                await trio.to_thread.run_sync(self._write_and_sync, first, data)
            else:
                self._write_and_sync(first, data)
        except OSError as exc:
            self.failures += 1
            self.last_error = exc
            self.journal.nack(exc.errno or errno.EIO)
            log.warning("journal write of records %d..%d failed: %s (holding, will rewrite)",
                        first, first + len(data) // RECORD_SIZE - 1, exc)
            return False
        except BaseException:
            # outcome unknown (KeyboardInterrupt in the thread...): rewrite them later
            self.journal.nack(errno.ECANCELED)
            raise
        self.journal.ack()   # clears hold bit 1: the floor check sets it again if still low
        self.tick_seconds.observe(time.perf_counter() - started)
        self.saved_records = first + len(data) // RECORD_SIZE
        self.last_error = None
        if self.floor_hold:
            self.check_floor()
        if self.watermark is not None:
            self._commit_at = trio.current_time() + self.commit_delay_s
        self._wake_saved()
        return True

    async def _maybe_mark(self) -> None:
        """Idle since the last save for commit_delay_s: write the commit watermark."""
        mark = self.watermark
        if mark is None or self._commit_at is None or trio.current_time() < self._commit_at \
                or self._pending():
            return
        self._commit_at = None
        s = self.journal.save_state()
        if s.saved_records <= mark.saved_records:
            return
        try:
            if self.ops.in_thread:
                await trio.to_thread.run_sync(mark.write, s.generation, s.saved_records,
                                              s.commit_digest)
            else:
                mark.write(s.generation, s.saved_records, s.commit_digest)
            self.watermarks += 1
        except OSError as exc:   # the journal is fine; only the damage check is weaker
            log.warning("journal commit watermark not written: %s", exc)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expire)
            self._expiring = True
            try:
                if self.ops.in_thread:
                    await self._run_thread(task_status)
                else:
                    await self._run(task_status)
            finally:
                self._expiring = False
                nursery.cancel_scope.cancel()

    # -- the worker thread's loop (blocking file operations) ------------------------
    async def _run_thread(self, task_status: trio.TaskStatus[None]) -> None:
        """Run :meth:`_thread_loop` in a worker thread until cancelled; then stop it and
        wait for it (a tick in flight finishes: its ack or nack is always recorded)."""
        self.saved_records = self.journal.save_state().saved_records  # after any resume
        self.check_floor()
        token = trio.lowlevel.current_trio_token()
        ended = trio.Event()
        result: list[Any] = []

        def deliver(outcome: Any) -> None:
            def done() -> None:
                result.append(outcome)
                ended.set()
            token.run_sync_soon(done)

        with self._cv:
            self._stopping = False
        bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._bell = bell
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ring, bell)
                trio.lowlevel.start_thread_soon(lambda: self._thread_loop(token), deliver,
                                                name="aotx journal emitter")
                task_status.started()
                try:
                    await ended.wait()
                finally:
                    with self._cv:
                        self._stopping = True
                        self._cv.notify()
                    self.journal.interrupt()   # a native loop in flight returns
                    with trio.CancelScope(shield=True):
                        await ended.wait()
                    nursery.cancel_scope.cancel()
        finally:
            self._bell = -1
            if ended.is_set():   # the thread is done with the doorbell
                trio.lowlevel.notify_closing(bell)
                os.close(bell)
        self._take_native()   # the last ticks' counts and saves
        result[0].unwrap()   # the loop only returns when stopped: re-raise what it raised

    def _idle_wait(self, backoff: float | None) -> bool:
        """(worker thread) Wait for wake(), a due watermark or a floor recheck; or, given
        ``backoff``, that many seconds whatever wakes it.  False once stopping."""
        now = time.monotonic()
        if backoff is not None:
            until = now + backoff
        else:
            due = [now + self.floor_recheck_s] if self.floor_hold else []
            if self._commit_at is not None:
                due.append(self._commit_at)
            until = min(due) if due else math.inf
        with self._cv:
            while not self._stopping:
                if backoff is None and self._kicked:
                    self._kicked = False
                    return True
                left = until - time.monotonic()
                if left <= 0:
                    return True   # the caller looks at its reason
                self._cv.wait(None if left == math.inf else left)
            return False

    def _thread_loop(self, token: trio.lowlevel.TrioToken) -> None:
        """(worker thread) Drain -> floor check -> pwrite -> fsync -> ack, tick after tick
        while records are pending; each save handed to trio (:meth:`_saved`).  A failed
        write or fsync is a nack: back off, then the same records are drained again and
        rewritten before the next fsync."""
        backoff = self.backoff_initial
        last_start = -math.inf
        while not self._stopping:
            if self.native_run_possible():   # (asked each time: ops may be swapped)
                lost, first, records = self._native_loop()
                if lost is None:
                    if self.last_error is None:
                        backoff = self.backoff_initial
                    continue
                self._count_ticks(1)
                self._write_failed(lost, first, records)
                if not self._idle_wait(backoff):
                    return
                backoff = min(backoff * 2, self.backoff_max)
                continue
            spacing = last_start + self.tick_spacing_s - time.monotonic()
            if spacing > 0 and not self._idle_wait(spacing):
                return
            started = time.perf_counter()
            failed: OSError | None = None
            fsync_s = 0.0
            # (asked per tick: the file operations may be swapped while running)
            if self.native_ticks_possible():   # the whole tick in one native call
                self.check_floor(self.tick_records * RECORD_SIZE)
                first, records, err, fsync_s = self.journal.tick(self.fd, self.tick_records)
                if err:
                    failed = OSError(err, os.strerror(err))
                elif records:
                    self._count_ticks(0, 1)
            else:
                drained = self.journal.drain(self.tick_records)
                first, records = (0, 0) if drained is None else \
                    (drained[0], len(drained[1]) // RECORD_SIZE)
                if drained is not None:
                    self.check_floor(len(drained[1]))
                    try:
                        fsync_s = self._write_sync_timed(first, drained[1])
                    except OSError as exc:
                        failed = exc
                    except BaseException:
                        self.journal.nack(errno.ECANCELED)   # outcome unknown: rewrite later
                        raise
                    else:
                        self.journal.ack()   # clears hold bit 1 (the floor check resets it)
            if not records:
                if self.floor_hold:
                    self.check_floor()
                self._mark_if_due()
                if not self._idle_wait(None):
                    return
                continue
            last_start = time.monotonic()
            self._count_ticks(1)
            if failed is not None:
                self._write_failed(failed, first, records)
                if not self._idle_wait(backoff):
                    return
                backoff = min(backoff * 2, self.backoff_max)
                continue
            backoff = self.backoff_initial
            self.last_error = None
            if self.floor_hold:
                self.check_floor()
            if self.watermark is not None:
                self._commit_at = time.monotonic() + self.commit_delay_s
            self._thread_saved = first + records
            self._tick_times.append((time.perf_counter() - started, fsync_s))
            if not self._notifying:   # else the callback pending reads this save too
                self._notifying = True
                token.run_sync_soon(self._saved)

    def _count_ticks(self, n: int, native: int = 0) -> None:
        with self._count_lock:
            self.ticks += n
            self.native_ticks += native

    def _write_failed(self, exc: OSError, first: int, records: int) -> None:
        """(worker thread) A failed pwrite or fsync: count it and nack its records (they
        stay in flight and are written again before the next fsync)."""
        self.failures += 1
        self.last_error = exc
        self.journal.nack(exc.errno or errno.EIO)
        log.warning("journal write of records %d..%d failed: %s (holding, will rewrite)",
                    first, first + records - 1, exc)

    def native_ticks_possible(self) -> bool:
        """The thread loop ticks in one native call when the file operations are the
        plain ones (a subclass that overrides pwrite or fsync, or one patched on the
        instance, e.g. a test's fault injection, keeps the Python steps)."""
        ops = self.ops   # bound methods of FileOps itself (not a subclass's, not patched)
        return getattr(ops.pwrite, "__func__", None) is FileOps.pwrite and \
            getattr(ops.fsync, "__func__", None) is FileOps.fsync

    def native_run_possible(self) -> bool:
        """The thread runs its whole loop natively (:meth:`Journal.run`, the GIL given up
        until something needs Python) when it has a doorbell and every file operation
        a tick uses is the plain one (:meth:`native_ticks_possible`, and the disk
        floor's ``free_bytes``), and the floor does not hold."""
        return self._bell >= 0 and not self.floor_hold and self.native_ticks_possible() \
            and getattr(self.ops.free_bytes, "__func__", None) is FileOps.free_bytes

    def _native_loop(self) -> tuple[OSError | None, int, int]:
        """(worker thread) Run :meth:`Journal.run` once: (the error of a failed tick, its
        first record, its records), or (None, 0, 0).  Acked ticks are the trio side's
        to count (:meth:`_take_native`); here the watermark's clock starts, a floor
        under the limit holds (:meth:`check_floor`), an idle spell may mark."""
        floor = self.min_free_bytes if self.directory is not None else 0
        res = self.journal.run(
            self.fd, notify_fd=self._bell, max_records=self.tick_records,
            spacing_s=self.tick_spacing_s,
            idle_s=self.commit_delay_s if self.watermark is not None else NATIVE_WAIT_S,
            wait_s=NATIVE_WAIT_S, min_free_bytes=max(0, floor), stat_every_s=self.floor_stat_s)
        if res.ticks:
            self.last_error = None
            if self.watermark is not None:
                self._commit_at = res.last_ack_s + self.commit_delay_s
        if res.reason == RUN_FAILED:
            return OSError(res.err, os.strerror(res.err)), res.first_record, res.records
        if res.reason == RUN_FLOOR:
            self.check_floor(self.tick_records * RECORD_SIZE)
        elif res.reason == RUN_IDLE:
            self._mark_if_due()
        return None, 0, 0

    def _take_native(self) -> None:
        """(trio thread) The native loop acked ticks (its doorbell rang): count them, and
        wake the waiters of the records saved now."""
        saved, times = self.journal.take_ticks()
        for tick_s, fsync_s in times:
            self.tick_seconds.observe(tick_s)
            self.fsync_seconds.observe(fsync_s)
        self._count_ticks(len(times), len(times))
        if saved > self.saved_records:
            self.saved_records = saved
            self._wake_saved()

    async def _ring(self, bell: int) -> None:
        """(trio task) Take the native loop's saves each time its doorbell rings."""
        while True:
            await trio.lowlevel.wait_readable(bell)
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(bell)
            self._take_native()

    def _write_sync_timed(self, first: int, data: bytes) -> float:
        write_all(self.ops, self.fd, data, record_offset(first))
        start = time.perf_counter()
        self.ops.fsync(self.fd)
        return time.perf_counter() - start

    def _saved(self) -> None:
        """(trio thread) Ticks of the worker thread were acknowledged: wake their waiters.
        One call for however many ticks were acked before trio ran it (the thread
        schedules one only when none is pending; the flag is cleared before anything
        is read, so a tick acked meanwhile either is read here or schedules anew)."""
        self._notifying = False
        saved = self._thread_saved
        times = self._tick_times
        while times:
            tick_s, fsync_s = times.popleft()
            self.tick_seconds.observe(tick_s)
            self.fsync_seconds.observe(fsync_s)
        if saved > self.saved_records:
            self.saved_records = saved
            self._wake_saved()

    def _mark_if_due(self) -> None:
        """(worker thread) Idle since the last save for commit_delay_s: write the commit
        watermark (time.monotonic, as _thread_loop sets _commit_at)."""
        mark = self.watermark
        if mark is None or self._commit_at is None or time.monotonic() < self._commit_at:
            return
        self._commit_at = None   # the next save sets it again
        if self._pending():
            return
        s = self.journal.save_state()
        if s.saved_records <= mark.saved_records:
            return
        try:
            mark.write(s.generation, s.saved_records, s.commit_digest)
            self.watermarks += 1
        except OSError as exc:   # the journal is fine; only the damage check is weaker
            log.warning("journal commit watermark not written: %s", exc)

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        backoff = self.backoff_initial
        self.saved_records = self.journal.save_state().saved_records  # after any resume
        self.check_floor()
        task_status.started()
        while True:
            while not self._pending():
                # while the floor holds, look again now and then; a due watermark too
                deadline = trio.current_time() + self.floor_recheck_s if self.floor_hold \
                    else math.inf
                if self._commit_at is not None:
                    deadline = min(deadline, self._commit_at)
                with trio.move_on_at(deadline):
                    await self._wake.wait()
                    self._wake = trio.Event()
                if self.floor_hold:
                    self.check_floor()
                await self._maybe_mark()
            ok = await self.tick()
            if ok is False:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max)
            else:
                backoff = self.backoff_initial
                await trio.lowlevel.checkpoint()
