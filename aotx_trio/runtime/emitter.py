"""The journal file and its tick emitter.

:func:`open_journal_file` creates a journal file (header written to a
temporary file, fsynced, renamed, folder fsynced) or opens one, verifies every
record (from a checkpoint: only those after it, read into a private snapshot),
truncates a torn tail (and fsyncs), and returns a :class:`JournalFile`
whose :class:`~aotx_trio.native.journal.Journal` continues the file.  Damage before
the tail raises ``JournalDamage`` naming the byte offset: the runtime refuses
to start.

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
file operations swapped or patched: :meth:`FileOps.watch`).  Otherwise (the
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

Every file operation goes through a :class:`FileOps` object, so tests can
inject faults at the I/O edge.  Byte layout: ``docs/formats/journal.md``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import heapq
import itertools
import logging
import math
import mmap
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio._fs import flock_nb, fsync_dir
from aotx_trio.native.journal import (
    FILE_HEADER,
    HOLD_DISK,
    RECORD_SIZE,
    RUN_FAILED,
    RUN_FLOOR,
    RUN_IDLE,
    TICK_RECORDS,
    Anchor,
    Image,
    Journal,
    JournalParams,
    JournalReader,
    Spans,
    Transfer,
    record_offset,
)
from aotx_trio.runtime.stats import Histogram
from aotx_trio.runtime.watermark import WatermarkWriter, read_watermark

log = logging.getLogger(__name__)

JOURNAL_NAME = "journal.aotxj"
LOCK_NAME = "journal.lock"
QUARANTINE = "quarantine"
COMMIT_DELAY_S = 0.05     # idle this long after a save before the watermark records it
TICK_SPACING_S = 0.001    # the thread loop's ticks start at least this far apart
FLOOR_STAT_S = 0.005      # the native loop's statvfs for the disk floor: at most this often
NATIVE_WAIT_S = 1.0       # the native loop comes back this often when nothing happens


class FileOps:
    """The file operations the journal performs (subclass to inject faults).

    ``in_thread``: the emitter runs writes and fsyncs in a worker thread
    (``trio.to_thread.run_sync``); an in-memory fake sets it False.
    """

    in_thread = True

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute, then tell the watchers (an emitter whose native loop must
        look at its file operations again: a test patches ``fsync`` on the instance)."""
        object.__setattr__(self, name, value)
        for changed in self.__dict__.get("_watchers", ()):
            changed()

    def watch(self, changed: Callable[[], None]) -> None:
        """Call ``changed()`` after every attribute set on this object."""
        self.__dict__.setdefault("_watchers", []).append(changed)

    def unwatch(self, changed: Callable[[], None]) -> None:
        watchers = self.__dict__.get("_watchers", [])
        if changed in watchers:
            watchers.remove(changed)

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def read_all(self, fd: int) -> bytes:
        size = os.fstat(fd).st_size
        chunks: list[bytes] = []
        offset = 0
        while offset < size:
            b = os.pread(fd, min(size - offset, 1 << 24), offset)
            if not b:
                break
            chunks.append(b)
            offset += len(b)
        return b"".join(chunks)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def read_into(self, fd: int, buf: memoryview, offset: int) -> None:
        """Fill ``buf`` with the file's bytes from ``offset`` (EIO when the file ends first)."""
        done = 0
        while done < len(buf):
            n = os.preadv(fd, [buf[done:]], offset + done)
            if n <= 0:
                raise OSError(errno.EIO, f"journal ends at byte {offset + done} while reading")
            done += n

    def rename(self, src: str, dst: str) -> None:
        os.rename(src, dst)

    def free_bytes(self, path: str) -> int:
        """Bytes an unprivileged writer may still use on ``path``'s file system."""
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_all(ops: FileOps, fd: int, data: bytes | bytearray | memoryview, offset: int) -> int:
    """pwrite all of ``data`` at ``offset`` (continuing short writes); returns calls made."""
    view = memoryview(data)
    calls = 0
    while view:
        n = ops.pwrite(fd, view, offset)
        calls += 1
        if n <= 0:
            raise OSError(errno.EIO, f"pwrite wrote {n} bytes at offset {offset}")
        view = view[n:]
        offset += n
    return calls


def lock_journal_dir(directory: str | os.PathLike[str]) -> int:
    """Take the journal folder's exclusive lock (``flock`` on ``journal.lock``) and return
    its descriptor; it is held until that descriptor is closed (the process's life).

    Taken before anything in the folder is read, so a second runtime on the same folder
    refuses with ``journal_locked`` and touches nothing (the lock file only holds the
    owner's pid, for the message)."""
    path = Path(directory) / LOCK_NAME
    fd = flock_nb(path, shared=False, create=True)
    if fd is None:
        try:
            owner = path.read_text(encoding="ascii", errors="replace").strip() or "unknown"
        except OSError:
            owner = "unknown"
        raise errors.ConfigError(
            f"journal folder {directory} is in use by another runtime (pid {owner} holds "
            f"{path}); refusing to start", code="journal_locked", path=str(path))
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


@dataclass
class JournalFile:
    """An open, verified journal file and the journal continuing it."""

    path: Path
    fd: int
    journal: Journal
    image: Image                 # the file's bytes up to valid_end (for the device's replay);
                                 # from a checkpoint: only its header, last record and suffix
    transfers: list[Transfer]
    created: bool
    truncated_bytes: int         # torn tail removed at open
    ops: FileOps = field(default_factory=FileOps)
    lock_fd: int = -1            # the folder's lock (lock_journal_dir), released by close()
    start: Anchor | None = None  # a checkpoint's position: records before it are not read

    def replay_reader(self, expected_lineage: bytes | None = None) -> JournalReader:
        """A fresh reader over the verified bytes (for a replay that resumes the journal),
        after ``start`` when a checkpoint holds the records before it."""
        reader = JournalReader(self.image, expected_lineage, source=str(self.path))
        if self.start is not None:   # open_journal_file checked the prefix of these bytes
            reader.seek(self.start, check_prefix=False)
        return reader

    def close(self) -> None:
        if self.fd >= 0:
            self.ops.close(self.fd)
            self.fd = -1
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def _create(directory: Path, path: Path, header: bytes, ops: FileOps) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)      # a leftover of a crash (or a planted link: never followed)
    fd = ops.open(str(tmp), os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY, 0o600)
    try:
        write_all(ops, fd, header, 0)
        ops.fsync(fd)
    finally:
        ops.close(fd)
    ops.rename(str(tmp), str(path))
    ops.fsync_dir(str(directory))


def open_journal_file(directory: str | os.PathLike[str], lineage: bytes, *,
                      params: JournalParams | None = None, ops: FileOps | None = None,
                      name: str = JOURNAL_NAME, resume: bool = True,
                      position: Callable[[Spans], Anchor | None] | None = None) -> JournalFile:
    """Lock ``directory`` (:func:`lock_journal_dir`), then create or open
    ``directory/name``; verify, truncate a torn tail, continue it.

    Blocking (run it with ``trio.to_thread.run_sync``).  With ``resume=False``
    the returned journal is fresh and the caller resumes it through
    ``replay_reader()`` (the device's recovery does).  Raises
    ``JournalDamage`` / the foreign-file error naming the byte offset.
    ``position`` (a checkpoint's check, runtime/checkpoint.py) gets a
    :class:`FileView` of the file and returns where reading starts (None: from the
    first record); then only the header, the checkpoint's last record and the records
    after it are read into memory (:func:`read_suffix`), and the records before it are
    CRC-checked through a read-only map (:func:`check_prefix`): no copy of the prefix,
    no replay of it.
    """
    ops = ops or FileOps()
    d = Path(directory)
    path = d / name
    base = replace(params or JournalParams(), lineage=lineage)
    lock_fd = lock_journal_dir(d)
    try:
        return _open_locked(d, path, lineage, base, ops, resume, lock_fd, position)
    except BaseException:
        os.close(lock_fd)
        raise


def check_watermark(directory: Path, path: Path, reader: JournalReader) -> None:
    """Refuse (``JournalDamage``, nothing truncated) a journal whose verified records end
    before the acknowledged ones the commit watermark names, or whose digest there is
    not the acknowledged one: that is damage to saved data, not a torn tail."""
    mark = read_watermark(directory, reader.incarnation)
    if mark is None:
        return
    records = (reader.valid_end - FILE_HEADER) // RECORD_SIZE
    if mark.saved_records > records:
        raise errors.JournalDamage(
            f"{path}: at byte offset {reader.valid_end}: records {records}.."
            f"{mark.saved_records - 1} were acknowledged (journal.commit, generation "
            f"{mark.generation}) but do not verify; refusing to start, nothing truncated",
            offset=reader.valid_end, record=records)
    if mark.saved_records == records and mark.commit_digest != reader.digest:
        raise errors.JournalDamage(
            f"{path}: at byte offset {reader.valid_end}: the commit digest of the "
            f"{records} records is not the acknowledged one (journal.commit); refusing "
            "to start", offset=reader.valid_end, record=records)


def quarantine_tail(directory: Path, image: Image, valid_end: int) -> Path:
    """Keep the bytes a torn-tail truncation drops: ``quarantine/torn-<offset>-<unix s>.aotxj``
    in the journal folder, fsynced (with its folder) before the journal is truncated."""
    folder = directory / QUARANTINE
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / f"torn-{valid_end}-{int(time.time())}.aotxj"
    n = 0
    while target.exists():
        n += 1
        target = folder / f"torn-{valid_end}-{int(time.time())}-{n}.aotxj"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        write_all(FileOps(), fd, image[valid_end:], 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(folder)
    fsync_dir(directory)
    return target


class FileView:
    """The journal file read by offset: its length and the spans asked for, as bytes.

    What a checkpoint's position check (runtime/checkpoint.py) reads instead of the whole
    file: the header's incarnation and the checkpoint's last record."""

    def __init__(self, ops: FileOps, fd: int, size: int) -> None:
        self.ops, self.fd, self.size = ops, fd, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: slice, /) -> bytes:
        start, stop, step = key.indices(self.size)
        if step != 1:
            raise ValueError("FileView reads contiguous spans")
        buf = bytearray(max(0, stop - start))
        self.ops.read_into(self.fd, memoryview(buf), start)
        return bytes(buf)


def read_suffix(ops: FileOps, fd: int, size: int, start: int) -> mmap.mmap:
    """A private snapshot of the file for a replay from a checkpoint: the header and every
    byte from ``start`` (the checkpoint's last record) to ``size``, each at its own offset
    in anonymous memory the file's size.  The bytes between are never read (they stay
    zero pages: the checkpoint holds their state), so this costs O(suffix), not O(file).
    Anonymous, not a map of the file: the emitter's later writes never show through."""
    image = mmap.mmap(-1, size)
    view = memoryview(image)
    try:
        ops.read_into(fd, view[:FILE_HEADER], 0)
        ops.read_into(fd, view[start:size], start)
    finally:
        view.release()
    return image


def check_prefix(fd: int, start: Anchor, lineage: bytes, source: str) -> None:
    """Every record before a checkpoint's end: its CRC-32C, type, class and index, and the
    last one chained to the checkpoint's digest (``aotx_journal_reader_seek``), damage
    raising ``JournalDamage`` at that record as a full read would.  Read through a
    read-only map of the prefix, unmapped before this returns (no copy of it is kept,
    and nothing written to the file later can reach it); the emitter only ever writes
    after the checkpoint's records."""
    with mmap.mmap(fd, record_offset(start.records), access=mmap.ACCESS_READ) as prefix:
        reader = JournalReader(prefix, expected_lineage=lineage, source=source)
        try:
            reader.seek(start)
        finally:
            reader.release()


def _open_locked(d: Path, path: Path, lineage: bytes, base: JournalParams, ops: FileOps,
                 resume: bool, lock_fd: int,
                 position: Callable[[Spans], Anchor | None] | None = None) -> JournalFile:
    created = False
    if not path.exists():
        incarnation = secrets.randbits(64)
        header = Journal(replace(base, file_incarnation=incarnation)).header()
        _create(d, path, header, ops)
        created = True
    fd = ops.open(str(path), os.O_RDWR)
    try:
        start: Anchor | None = None
        image: Image
        asked = False   # position consulted on the file's spans (not on its bytes)
        if position is not None:
            size = ops.size(fd)
            if size >= FILE_HEADER:
                asked, start = True, position(FileView(ops, fd, size))
        if start is not None:   # from the checkpoint: read its last record and the suffix
            check_prefix(fd, start, lineage, str(path))
            image = read_suffix(ops, fd, size, record_offset(start.records - 1))
            reader = JournalReader(image, expected_lineage=lineage, source=str(path))
            reader.seek(start, check_prefix=False)   # checked on the map above
        else:
            data = ops.read_all(fd)
            image = data
            reader = JournalReader(image, expected_lineage=lineage, source=str(path))
            start = position(data) if position is not None and not asked else None
            if start is not None:
                reader.seek(start)   # every prefix record's CRC-32C and index checked
        transfers = list(reader)
        valid_end = reader.valid_end
        check_watermark(d, path, reader)
        truncated = len(image) - valid_end
        if truncated:
            kept = quarantine_tail(d, image, valid_end)
            log.warning("%s: torn tail of %d bytes after offset %d truncated (kept in %s)",
                        path, truncated, valid_end, kept)
            ops.ftruncate(fd, valid_end)
            ops.fsync(fd)
            image = memoryview(image)[:valid_end]   # no copy of the (unread) prefix
        journal = Journal(replace(base, file_incarnation=reader.incarnation))
        if resume:
            journal.resume(reader)
    except BaseException:
        ops.close(fd)
        raise
    return JournalFile(path, fd, journal, image, transfers, created, truncated, ops, lock_fd,
                       start)


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
