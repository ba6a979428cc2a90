"""The journal's Python face: typed wrappers of ``csrc/journal/aotx_journal.h``.

:class:`Journal` is the encoder and pending queue (enqueue, drain, ack, nack,
save state); :class:`SaveState` and :class:`SaveId` are a save's state and identity
(the device's receipts carry them too); :class:`JournalReader` verifies a whole
journal file and yields its complete transfers; :func:`read_journal` /
:func:`recover_journal` wrap the reader for callers that only want the transfers and
``valid_end``.
Byte layout: ``docs/formats/journal.md``.  Errors go through
:func:`aotx_trio.native.lib.check`; a damaged or foreign file raises with the
byte offset in ``exc.fields["offset"]`` and in the message.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aotx_trio.native.lib import check, ffi, lib

RECORD_SIZE = 192
PART_DATA = 160
FILE_HEADER = 64
TICK_RECORDS = 16
MAX_TRANSFER = 65535 * PART_DATA

XFER_BOOT = 1
XFER_ADMISSION = 2
XFER_LEASE = 3
XFER_OUTPUT = 4
XFER_COMPLETION = 5
XFER_RETIREMENT = 6
XFER_MEMORY = 7

HOLD_FILE_CAP = 1
HOLD_DISK = 2
HOLD_PENDING = 4

# Journal.run's reasons for returning (csrc/journal/aotx_journal.h, aotx_journal_run)
RUN_INTERRUPTED = 1
RUN_IDLE = 2
RUN_FAILED = 3
RUN_FLOOR = 4

DEFAULT_MAX_PENDING = 4 << 20

#: what a reader verifies: a journal file's bytes, each at its file offset (a checkpoint
#: boot's snapshot is an anonymous map holding only the header and the suffix)
Image = bytes | bytearray | memoryview | mmap.mmap


class Spans(Protocol):
    """A journal file's length and byte spans by offset (``bytes``, or the emitter's
    ``FileView`` that reads only the spans asked for)."""

    def __len__(self) -> int: ...

    def __getitem__(self, key: slice, /) -> bytes: ...


def record_offset(index: int) -> int:
    """File offset of record ``index``."""
    return FILE_HEADER + RECORD_SIZE * index


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of ``data``, continuing ``crc``."""
    return int(lib.aotx_crc32c(crc, data, len(data)))


def sha256(data: bytes) -> bytes:
    """SHA-256 (the library's own FIPS 180-4 implementation)."""
    out = ffi.new("uint8_t[32]")
    lib.aotx_sha256(data, len(data), out)
    return bytes(out)


@dataclass(frozen=True)
class JournalParams:
    lineage: bytes = bytes(16)
    file_incarnation: int = 0
    file_cap_bytes: int = 0  # 0 = no cap
    max_pending_bytes: int = DEFAULT_MAX_PENDING

    def __post_init__(self) -> None:
        if len(self.lineage) != 16:
            raise ValueError(f"lineage must be 16 bytes, got {len(self.lineage)}")


@dataclass(frozen=True)
class SaveState:
    """The journal's save state when read (``aotx_save_state``): what a receipt carries
    of it (``aotx_receipt_view``) and :func:`~aotx_trio.runtime.render.render_save`
    shows; :meth:`Journal.save_state` reads it whole (:class:`JournalState`)."""

    saved_records: int              # records [0, saved_records) are fsynced
    pending_bytes: int              # encoded bytes not yet saved (in flight included)
    file_incarnation: int
    generation: int                 # +1 at every successful ack, continued across boots
    boot: int                       # boot number (count of boot transfers)
    commit_digest: bytes            # 32 bytes: the chained digest over every saved record
    disk_error: int                 # errno of the last failed write or fsync, 0 if none since
    hold: int                       # HOLD_* bits


@dataclass(frozen=True)
class JournalState(SaveState):
    """The whole ``aotx_save_state``: the :class:`SaveState` and the queue's position."""

    next_record: int                # the index the next enqueued record gets
    in_flight_records: int          # drained, not yet acked


@dataclass(frozen=True)
class SaveId:
    """One save (ack): the save that acknowledged an admission, frozen once it is saved
    and rebuilt alike by recovery (docs/formats/journal.md, "Save identity")."""

    file_incarnation: int
    generation: int
    boot: int
    commit_records: int             # records the commit digest covers
    commit_digest: bytes            # 32 bytes: the chained digest after them

    @classmethod
    def of(cls, c: Any) -> SaveId:
        """The native ``aotx_save_id`` ``c``."""
        return cls(file_incarnation=int(c.file_incarnation), generation=int(c.generation),
                   boot=int(c.boot), commit_records=int(c.commit_records),
                   commit_digest=bytes(c.commit_digest))


@dataclass(frozen=True)
class Transfer:
    kind: int
    data: bytes
    first_record: int

    @property
    def records(self) -> int:
        return max(1, -(-len(self.data) // PART_DATA))

    @property
    def last_record(self) -> int:
        return self.first_record + self.records - 1


@dataclass(frozen=True)
class Anchor:
    """A journal position a checkpoint is tied to (``aotx_journal_anchor``,
    docs/formats/checkpoint.md): the first ``records`` records, the chained digest
    before and after the last of them, their boot transfers and the save
    generation stamped on the last one."""

    file_incarnation: int
    records: int
    boot: int
    generation: int
    prev_digest: bytes
    digest: bytes

    @classmethod
    def of(cls, c: Any) -> Anchor:
        return cls(int(c.file_incarnation), int(c.records), int(c.boot), int(c.generation),
                   bytes(c.prev_digest), bytes(c.digest))

    def native(self) -> Any:
        c = ffi.new("aotx_journal_anchor *")
        c.file_incarnation = self.file_incarnation
        c.records = self.records
        c.boot = self.boot
        c.generation = self.generation
        c.prev_digest = self.prev_digest
        c.digest = self.digest
        return c


_TICK_LOG = int(lib.AOTX_JOURNAL_TICK_LOG)


def _ns(seconds: float) -> int:
    return max(0, round(seconds * 1e9))


@dataclass(frozen=True)
class RunResult:
    """Why :meth:`Journal.run` returned (``RUN_*``), the ticks it acked (the last at
    ``last_ack_s``, ``time.monotonic``'s clock), and per reason: the records a failed
    tick left in flight with its errno (``RUN_FAILED``), the free-space estimate under
    the floor (``RUN_FLOOR``)."""

    reason: int
    ticks: int
    last_ack_s: float
    first_record: int
    records: int
    err: int
    free_bytes: int


class Journal:
    """The native journal: encoder, bounded pending queue, save acknowledgement."""

    def __init__(self, params: JournalParams | None = None) -> None:
        params = params or JournalParams()
        p = ffi.new("aotx_journal_params *")
        lib.aotx_journal_default_params(p)
        p.file_cap_bytes = params.file_cap_bytes
        p.max_pending_bytes = params.max_pending_bytes
        p.file_incarnation = params.file_incarnation
        ffi.memmove(p.lineage, params.lineage, 16)
        out = ffi.new("aotx_journal **")
        check(lib.aotx_journal_new(p, out), "aotx_journal_new")
        self._j: Any = ffi.gc(out[0], lib.aotx_journal_free)
        self._buf: Any = ffi.new("uint8_t[]", RECORD_SIZE * TICK_RECORDS)
        self._u64: Any = ffi.new("uint64_t *")
        # drain's own out-parameter: the emitter may drain on its thread while the
        # device enqueues on the trio thread (the native calls share one mutex)
        self._first: Any = ffi.new("uint64_t *")
        # tick's own buffer and out-parameters (only the emitter's thread ticks)
        self._tick_buf: Any = ffi.new("uint8_t[]", RECORD_SIZE * TICK_RECORDS)
        self._tick_first: Any = ffi.new("uint64_t *")
        self._tick_records: Any = ffi.new("uint32_t *")
        self._tick_errno: Any = ffi.new("int *")
        self._tick_ns: Any = ffi.new("uint64_t *")
        # take_ticks' own (the trio thread's) log buffers
        self._log_tick: Any = ffi.new("uint64_t[]", _TICK_LOG)
        self._log_fsync: Any = ffi.new("uint64_t[]", _TICK_LOG)
        self._u64_take: Any = ffi.new("uint64_t *")

    @property
    def handle(self) -> Any:
        """The ``aotx_journal *`` (for the device, which borrows it)."""
        return self._j

    def header(self) -> bytes:
        buf = ffi.new("uint8_t[64]")
        check(int(lib.aotx_journal_header_encode(self._j, buf, 64)), ok_positive=True)
        return bytes(buf)

    def enqueue(self, kind: int, data: bytes) -> int:
        """Queue one transfer; returns the index of its last record."""
        check(lib.aotx_journal_enqueue(self._j, kind, data, len(data), self._u64),
              f"enqueue kind {kind}, {len(data)} bytes", kind=kind, length=len(data))
        return int(self._u64[0])

    def begin_boot(self) -> int:
        check(lib.aotx_journal_begin_boot(self._j, self._u64), "begin_boot")
        return int(self._u64[0])

    def drain(self, max_records: int = TICK_RECORDS) -> tuple[int, bytes] | None:
        """Up to ``max_records`` queued records now in flight: (first index, bytes)."""
        if not 0 < max_records <= TICK_RECORDS:
            raise ValueError(f"max_records must be 1..{TICK_RECORDS}")
        n = int(lib.aotx_journal_drain(self._j, self._buf, RECORD_SIZE * TICK_RECORDS,
                                       max_records, self._first))
        check(n, "drain", ok_positive=True)
        if n == 0:
            return None
        return int(self._first[0]), bytes(ffi.buffer(self._buf, n))

    def tick(self, fd: int, max_records: int = TICK_RECORDS) -> tuple[int, int, int, float]:
        """One whole tick in one native call (``aotx_journal_tick``: drain, pwrite, fsync,
        ack; the GIL is released once): (first index, records saved, errno, fsync
        seconds).  errno > 0: the pwrite or fsync failed and the records stay in flight
        (nack them, as after a failed write of one's own); 0 records and errno 0:
        nothing was pending."""
        if not 0 < max_records <= TICK_RECORDS:
            raise ValueError(f"max_records must be 1..{TICK_RECORDS}")
        check(lib.aotx_journal_tick(self._j, fd, self._tick_buf, RECORD_SIZE * TICK_RECORDS,
                                    max_records, self._tick_first, self._tick_records,
                                    self._tick_errno, self._tick_ns), "tick")
        return (int(self._tick_first[0]), int(self._tick_records[0]), int(self._tick_errno[0]),
                int(self._tick_ns[0]) / 1e9)

    def run(self, fd: int, *, notify_fd: int = -1, max_records: int = TICK_RECORDS,
            spacing_s: float = 0.0, idle_s: float = 0.0, wait_s: float = 0.0,
            min_free_bytes: int = 0, stat_every_s: float = 0.005) -> RunResult:
        """The emitter's loop in one native call (``aotx_journal_run``: blocks, without the
        GIL, tick after tick until it has a reason to return; see the header).  Only one
        thread runs it at a time."""
        if not 0 < max_records <= TICK_RECORDS:
            raise ValueError(f"max_records must be 1..{TICK_RECORDS}")
        p = ffi.new("aotx_journal_run_params *")
        p.fd, p.notify_fd, p.max_records = fd, notify_fd, max_records
        p.spacing_ns, p.idle_ns = _ns(spacing_s), _ns(idle_s)
        p.wait_ns, p.min_free_bytes, p.stat_every_ns = _ns(wait_s), min_free_bytes, \
            _ns(stat_every_s)
        out = ffi.new("aotx_journal_run_result *")
        check(lib.aotx_journal_run(self._j, p, out), "run")
        return RunResult(reason=int(out.reason), ticks=int(out.ticks),
                         last_ack_s=int(out.last_ack_ns) / 1e9,
                         first_record=int(out.first_record), records=int(out.records),
                         err=int(out.err), free_bytes=int(out.free_bytes))

    def interrupt(self) -> None:
        """Make a running :meth:`run` return (``RUN_INTERRUPTED``) before its next tick
        (or the next call, if none runs)."""
        lib.aotx_journal_interrupt(self._j)

    def take_ticks(self) -> tuple[int, list[tuple[float, float]]]:
        """(saved records now, [(tick seconds, fsync seconds)] of the ticks :meth:`run`
        acked since the last call, oldest first)."""
        n = int(lib.aotx_journal_take_ticks(self._j, self._log_tick, self._log_fsync,
                                            _TICK_LOG, self._u64_take))
        saved = int(self._u64_take[0])
        if not n:
            return saved, []
        ticks, fsyncs = self._log_tick, self._log_fsync
        return saved, [(ticks[i] / 1e9, fsyncs[i] / 1e9) for i in range(n)]

    def ack(self) -> None:
        check(lib.aotx_journal_ack(self._j), "ack")

    def nack(self, err: int) -> None:
        check(lib.aotx_journal_nack(self._j, err), "nack")

    def set_hold(self, bits: int, on: bool) -> None:
        lib.aotx_journal_set_hold(self._j, bits, 1 if on else 0)

    def set_file_cap(self, file_cap_bytes: int) -> None:
        lib.aotx_journal_set_file_cap(self._j, file_cap_bytes)

    def save_state(self) -> JournalState:
        s = ffi.new("aotx_save_state *")
        lib.aotx_journal_save_state(self._j, s)
        return JournalState(
            next_record=int(s.next_record), saved_records=int(s.saved_records),
            in_flight_records=int(s.in_flight_records), pending_bytes=int(s.pending_bytes),
            file_incarnation=int(s.file_incarnation), generation=int(s.generation),
            boot=int(s.boot), commit_digest=bytes(s.commit_digest),
            disk_error=int(s.disk_error), hold=int(s.hold))

    def save_of(self, record: int) -> SaveId | None:
        """The save that wrote ``record`` (a transfer's last part), or None while it is
        unsaved; raises ``journal_state`` once the ring no longer holds it."""
        out = ffi.new("aotx_save_id *")
        rc = int(lib.aotx_journal_save_of(self._j, record, out))
        if rc == lib.AOTX_R_JOURNAL_NOTHING:
            return None
        check(rc, f"save_of record {record}", record=record)
        return SaveId.of(out)

    def retain(self, from_record: int) -> None:
        """Keep saved records from ``from_record`` on readable by :meth:`save_of`."""
        lib.aotx_journal_retain(self._j, from_record)

    def saved_anchor(self) -> Anchor | None:
        """The saved position, or None while a record is not saved yet (or none is)."""
        c = ffi.new("aotx_journal_anchor *")
        if lib.aotx_journal_saved_anchor(self._j, c) != 0:
            return None
        return Anchor.of(c)

    def resume(self, reader: JournalReader) -> None:
        """Continue the file ``reader`` read to its end (index, digest, boot, generation)."""
        check(lib.aotx_journal_resume(self._j, reader.handle), "resume")


class JournalReader:
    """Verifies a journal image and yields its complete transfers, in order.

    Iteration ends at the end of the file or at a torn tail (``valid_end`` then
    names where the file must be truncated); damage anywhere else raises
    ``JournalDamage`` (or the foreign-file error) naming the byte offset.
    """

    def __init__(self, image: Image, expected_lineage: bytes | None = None,
                 *, source: str = "journal") -> None:
        self._image = image
        self._cbuf: Any = ffi.from_buffer(image)
        self.source = source
        out = ffi.new("aotx_journal_reader **")
        check(lib.aotx_journal_reader_new(self._cbuf, len(image), out), "reader_new")
        self._r: Any = ffi.gc(out[0], lib.aotx_journal_reader_free)
        if expected_lineage is not None:
            if len(expected_lineage) != 16:
                raise ValueError("expected_lineage must be 16 bytes")
            lib.aotx_journal_reader_expect_lineage(self._r, expected_lineage)
        self.finished = False

    def release(self) -> None:
        """Free the native reader and let go of the image's buffer now (an image that
        is a map can then be closed); the reader is unusable after."""
        r, self._r = self._r, ffi.NULL
        ffi.gc(r, None)   # no second free by the collector
        lib.aotx_journal_reader_free(r)
        ffi.release(self._cbuf)

    @property
    def handle(self) -> Any:
        """The ``aotx_journal_reader *`` (for the device's replay)."""
        return self._r

    @property
    def digest(self) -> bytes:
        """The chained digest after the last complete transfer read so far."""
        out = ffi.new("uint8_t[32]")
        lib.aotx_journal_reader_digest(self._r, out)
        return bytes(out)

    def _raise(self, rc: int) -> None:
        off = int(lib.aotx_journal_reader_error_offset(self._r))
        check(rc, f"{self.source}: at byte offset {off}", offset=off)

    def check_header(self) -> None:
        rc = int(lib.aotx_journal_reader_header_status(self._r))
        if rc != 0:
            self._raise(rc)

    def next(self) -> Transfer | None:
        kind = ffi.new("uint8_t *")
        data = ffi.new("uint8_t **")
        length = ffi.new("uint32_t *")
        first = ffi.new("uint64_t *")
        rc = int(lib.aotx_journal_reader_next(self._r, kind, data, length, first))
        if rc < 0:
            self._raise(rc)
        if rc == 0:
            self.finished = True
            return None
        return Transfer(int(kind[0]), bytes(ffi.buffer(data[0], length[0])), int(first[0]))

    def __iter__(self) -> Iterator[Transfer]:
        while (t := self.next()) is not None:
            yield t

    @property
    def valid_end(self) -> int:
        return int(lib.aotx_journal_reader_valid_end(self._r))

    @property
    def incarnation(self) -> int:
        return int(lib.aotx_journal_reader_incarnation(self._r))

    @property
    def lineage(self) -> bytes:
        out = ffi.new("uint8_t[16]")
        lib.aotx_journal_reader_lineage(self._r, out)
        return bytes(out)

    @property
    def boot(self) -> int:
        return int(lib.aotx_journal_reader_boot(self._r))

    def anchor(self) -> Anchor:
        """The position after the transfers read so far."""
        c = ffi.new("aotx_journal_anchor *")
        rc = int(lib.aotx_journal_reader_anchor(self._r, c))
        if rc != 0:
            self._raise(rc)
        return Anchor.of(c)

    def seek(self, anchor: Anchor, *, check_prefix: bool = True) -> None:
        """Before the first transfer: continue after ``anchor.records`` records
        (aotx_journal_reader_seek; a checkpoint holds their state); ``check_prefix``:
        each of those records' CRC-32C and index first."""
        rc = int(lib.aotx_journal_reader_seek(self._r, anchor.native(), int(check_prefix)))
        if rc != 0:
            self._raise(rc)


def _image(path_or_bytes: str | os.PathLike[str] | bytes) -> tuple[bytes, str]:
    if isinstance(path_or_bytes, bytes | bytearray | memoryview):
        return bytes(path_or_bytes), "journal"
    p = Path(path_or_bytes)
    return p.read_bytes(), str(p)


def read_journal(path_or_bytes: str | os.PathLike[str] | bytes,
                 expected_lineage: bytes | None = None) -> Generator[Transfer, None, int]:
    """Yield every complete transfer; the generator's return value is ``valid_end``."""
    image, source = _image(path_or_bytes)
    reader = JournalReader(image, expected_lineage, source=source)
    yield from reader
    return reader.valid_end


@dataclass(frozen=True)
class Recovered:
    transfers: list[Transfer]
    valid_end: int
    size: int
    incarnation: int
    lineage: bytes
    boot: int

    @property
    def torn_bytes(self) -> int:
        return self.size - self.valid_end


def recover_journal(path_or_bytes: str | os.PathLike[str] | bytes,
                    expected_lineage: bytes | None = None) -> Recovered:
    """Read a whole journal: its transfers, ``valid_end`` and header facts."""
    image, source = _image(path_or_bytes)
    reader = JournalReader(image, expected_lineage, source=source)
    transfers = list(reader)
    return Recovered(transfers, reader.valid_end, len(image), reader.incarnation,
                     reader.lineage, reader.boot)
