"""The journal file's lifecycle: its file operations, lock, creation, opening and quarantine.

:func:`open_journal_file` takes the journal folder's lock (:func:`lock_journal_dir`),
creates a journal file (header written to a temporary file, fsynced, renamed, folder
fsynced) or opens one, verifies every record (from a checkpoint: only those after it,
read into a private snapshot, :func:`read_suffix`, the prefix CRC-checked through a
read-only map, :func:`check_prefix`), checks the commit watermark
(:func:`check_watermark`), sets a torn tail aside (:func:`quarantine`) and truncates it
(and fsyncs), and returns a :class:`JournalFile` whose
:class:`~aotx_trio.native.journal.Journal` continues the file.  Damage before the tail
raises ``JournalDamage`` naming the byte offset: the runtime refuses to start.

Every file operation goes through a :class:`FileOps` object, so tests can inject
faults at the I/O edge; the emitter (runtime/emitter.py) writes and fsyncs through the
same object.  :func:`quarantine` is also ``aotx repair``'s (runtime/repair.py).  Byte
layout: ``docs/formats/journal.md``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import mmap
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from aotx_trio import errors
from aotx_trio._fs import flock_nb, fsync_dir
from aotx_trio.native.journal import (
    FILE_HEADER,
    RECORD_SIZE,
    Anchor,
    Image,
    Journal,
    JournalParams,
    JournalReader,
    Spans,
    Transfer,
    record_offset,
)
from aotx_trio.runtime.watermark import read_watermark

log = logging.getLogger(__name__)

JOURNAL_NAME = "journal.aotxj"
LOCK_NAME = "journal.lock"
QUARANTINE = "quarantine"


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


@contextlib.contextmanager
def journal_dir_locked(directory: str | os.PathLike[str]) -> Iterator[int]:
    """:func:`lock_journal_dir` for the block (the folder is created if missing): a
    caller that writes other files before it opens the journal (``aotx serve``'s
    gateway.json and grant file) takes the lock first, so a refused second start
    changes nothing, and hands the descriptor to :func:`open_journal_file`
    (``held_lock``)."""
    Path(directory).mkdir(parents=True, exist_ok=True)
    fd = lock_journal_dir(directory)
    try:
        yield fd
    finally:
        os.close(fd)


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
                      position: Callable[[Spans], Anchor | None] | None = None,
                      held_lock: int | None = None) -> JournalFile:
    """Lock ``directory`` (:func:`lock_journal_dir`; ``held_lock``: the caller holds
    it already, :func:`journal_dir_locked`, and releases it), then create or open
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
    lock_fd = lock_journal_dir(d) if held_lock is None else -1
    try:
        return _open_locked(d, path, lineage, base, ops, resume, lock_fd, position)
    except BaseException:
        if lock_fd >= 0:
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


def quarantine(directory: Path, kind: str, data: bytes | bytearray | memoryview,
               offset: int) -> Path:
    """Keep bytes a truncation of the journal drops: ``quarantine/<kind>-<offset>-<unix
    s>.aotxj`` in the journal folder (``torn``: a torn tail cut at open; ``repair``: what
    ``aotx repair`` sets aside), created ``O_EXCL | O_NOFOLLOW`` and fsynced with its
    folder before the caller truncates the journal."""
    folder = directory / QUARANTINE
    folder.mkdir(mode=0o700, exist_ok=True)
    stamp = int(time.time())
    target, n = folder / f"{kind}-{offset}-{stamp}.aotxj", 0
    while target.exists():
        n += 1
        target = folder / f"{kind}-{offset}-{stamp}-{n}.aotxj"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o600)
    try:
        write_all(FileOps(), fd, data, 0)
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
            kept = quarantine(d, "torn", image[valid_end:], valid_end)
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
