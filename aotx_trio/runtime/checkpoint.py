"""State checkpoints in the runtime file (docs/formats/checkpoint.md).

A checkpoint is the device's state tables (``csrc/device/device_checkpoint.c`` encodes and
parses them) tied to a journal position (:class:`~aotx_trio.native.journal.Anchor`).  It
lives after the runtime file's extents; the header's ``checkpoint_offset`` /
``checkpoint_length`` point at the current one (docs/formats/ccir.md).

::

    write_section     append-or-reuse + fsync, then flip the 128-byte header (fsync),
                      then cut what lies past the new end: the models (mapped in
                      place) and the current checkpoint are never written over
    read_section      the current section's bytes (None without one)
    parse_section     header + SHA-256 trailer, in Python, for precise refusals
    journal_position  the boot's check against the journal bytes: lineage,
                      incarnation, length, the record it ends at and the chained
                      digest there; returns where reading starts
    save_on_shutdown  flush the journal, checkpoint at its saved end (boot.py)
    pack_checkpoint   ``aotx pack --checkpoint JOURNAL_DIR``: offline, on a stopped
                      runtime's journal

The journal is never truncated by any of this: it keeps its complete audit prefix.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotx_trio import errors
from aotx_trio._fs import flock_nb
from aotx_trio.native.device import Device
from aotx_trio.native.journal import (
    FILE_HEADER,
    RECORD_SIZE,
    TICK_RECORDS,
    Anchor,
    Journal,
    JournalParams,
    JournalReader,
    Spans,
    record_offset,
)
from aotx_trio.runtime import ccir
from aotx_trio.runtime.emitter import Emitter
from aotx_trio.runtime.journal_file import (
    JOURNAL_NAME,
    FileOps,
    check_watermark,
    lock_journal_dir,
    write_all,
)

log = logging.getLogger("aotx.checkpoint")

MAGIC = b"AOTXCKPT"
VERSION = 1
HEADER = 192
TRAILER = 32
#: magic, version, header_length, section_length, table_count, reserved, lineage,
#: incarnation, records, boot, generation, admissions, reserved, prev_digest, digest,
#: reserved[32]
_HEADER = struct.Struct("<8sIIQII16sQQQQQQ32s32s32s")
assert _HEADER.size == HEADER
_FLAG_LAST = 2


@dataclass(frozen=True)
class SectionInfo:
    """What a checkpoint section's header says (checked against its trailer)."""

    lineage: bytes
    anchor: Anchor
    admissions: int
    length: int


def _damaged(message: str, reason: str, offset: int) -> errors.CheckpointInvalid:
    return errors.CheckpointInvalid(f"{message} (at checkpoint byte {offset}); refusing "
                                    "to start", code="checkpoint_damaged", reason=reason,
                                    offset=offset)


def _mismatch(message: str, reason: str, **fields: Any) -> errors.CheckpointInvalid:
    return errors.CheckpointInvalid(f"{message}; refusing to start", code="checkpoint_mismatch",
                                    reason=reason, **fields)


def parse_section(section: bytes) -> SectionInfo:
    """The header of a checkpoint section whose SHA-256 trailer verifies."""
    if len(section) < HEADER + TRAILER or section[:8] != MAGIC:
        raise _damaged("the runtime file's checkpoint has no checkpoint magic", "magic", 0)
    (_m, version, header_len, length, tables, res0, lineage, incarnation, records, boot,
     generation, admissions, res1, prev, digest, res2) = _HEADER.unpack_from(section)
    if version != VERSION:
        raise _damaged(f"checkpoint format version {version} is not {VERSION} (written by "
                       "another build)", "version", 8)
    if header_len != HEADER:
        raise _damaged(f"checkpoint header length {header_len} is not {HEADER}", "header", 12)
    if length != len(section):
        raise _damaged(f"checkpoint says {length} bytes but holds {len(section)}", "length", 16)
    if hashlib.sha256(section[:-TRAILER]).digest() != section[-TRAILER:]:
        raise _damaged("checkpoint SHA-256 mismatch", "checksum", len(section) - TRAILER)
    if res0 or res1 or any(res2) or records == 0:
        raise _damaged("checkpoint header has nonzero reserved bytes or no records",
                       "header", 28)
    del tables
    return SectionInfo(lineage, Anchor(incarnation, records, boot, generation, prev, digest),
                       admissions, length)


# --------------------------------------------------------------------------- the runtime file


def read_section(path: Path) -> bytes | None:
    """The current checkpoint section of a runtime file, or None (read under a shared
    ``lockf``: a checkpoint write by another runtime on the same file waits)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.lockf(fd, fcntl.LOCK_SH)
        size = os.fstat(fd).st_size
        header = ccir._parse_header(os.pread(fd, ccir.HEADER_SIZE, 0), size)
        if not header.checkpoint_length:
            return None
        data = os.pread(fd, header.checkpoint_length, header.checkpoint_offset)
    finally:
        os.close(fd)
    if len(data) != header.checkpoint_length:
        raise _damaged("the runtime file ends inside its checkpoint", "truncated", len(data))
    return data


def _put_header(fd: int, h: ccir.Header, *, required: int, file_length: int, offset: int,
                length: int) -> None:
    raw = ccir.encode_header(required=required, optional=h.profile.optional,
                             lineage=h.lineage, count=h.component_count,
                             file_length=file_length, table_crc=h.table_crc32c,
                             checkpoint_offset=offset, checkpoint_length=length)
    if os.pwrite(fd, raw, 0) != ccir.HEADER_SIZE:
        raise OSError(errno.EIO, "short runtime file header write")
    os.fsync(fd)


def write_section(path: Path, section: bytes) -> int:
    """Make ``section`` the runtime file's checkpoint; returns its offset.

    1. first time only: set the ``checkpoint`` profile bit (header rewrite, fsync), so a
       crash that leaves bytes past ``file_length`` is readable;
    2. write the section where it overlaps neither the extents nor the current
       checkpoint (the free room before the current one when it fits, else after it),
       fsync;
    3. rewrite the header (one 128-byte ``pwrite`` inside the first sector, with its
       own CRC) to point at it, fsync;
    4. cut the file after it (the old checkpoint, when it lay after), fsync.

    A crash before 3 leaves the old header: the old checkpoint, untouched.  The mapped
    model extents are never written.  Runs under an exclusive ``lockf`` (independent
    of the runtime's ``flock``), so two runtimes on one file cannot interleave.
    """
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        size = os.fstat(fd).st_size
        h = ccir._parse_header(os.pread(fd, ccir.HEADER_SIZE, 0), size)
        comps = ccir._parse_table(os.pread(fd, h.component_count * ccir.ENTRY_SIZE,
                                           h.table_offset), h)
        base = ccir.align_up(max([h.table_end, *(c.offset + c.length for c in comps)]))
        required = h.profile.required | ccir.PROFILE_CHECKPOINT
        if required != h.profile.required:
            _put_header(fd, h, required=required, file_length=h.file_length,
                        offset=h.checkpoint_offset, length=h.checkpoint_length)
        cur, cur_len = h.checkpoint_offset, h.checkpoint_length
        if cur_len and cur > base and len(section) <= cur - base:
            at = base
        elif cur_len:
            at = ccir.align_up(cur + cur_len)
        else:
            at = base
        if at >= h.file_length and size > at:
            os.ftruncate(fd, at)   # an unfinished write's leftovers
        write_all(FileOps(), fd, section, at)
        os.fsync(fd)
        end = at + len(section)
        _put_header(fd, h, required=required, file_length=end, offset=at, length=len(section))
        if os.fstat(fd).st_size > end:
            os.ftruncate(fd, end)
            os.fsync(fd)
        return at
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- the journal


def journal_position(info: SectionInfo, lineage: bytes, source: str,
                     ) -> Callable[[Spans], Anchor | None]:
    """The check :func:`~aotx_trio.runtime.journal_file.open_journal_file` runs on the
    journal (its bytes, or a ``FileView`` that reads only the header's incarnation and
    the checkpoint's last record): where reading starts, or a refusal naming what does
    not match.

    A journal with no records yet (a new folder) starts a new history and reads from
    its first record: the checkpoint, of another journal, is kept until this runtime's
    first clean shutdown replaces it (docs/decisions.md)."""

    def check(image: Spans) -> Anchor | None:
        a = info.anchor
        if info.lineage != lineage:
            raise _mismatch(f"the checkpoint is of lineage {info.lineage.hex()}, the runtime "
                            f"file of {lineage.hex()}", "lineage")
        records = max(0, (len(image) - FILE_HEADER) // RECORD_SIZE)
        if records == 0:
            log.warning("%s: a new journal; the runtime file's checkpoint (journal "
                        "incarnation %016x, %d records) is not used", source,
                        a.file_incarnation, a.records)
            return None
        incarnation = int.from_bytes(image[32:40], "little")
        if incarnation != a.file_incarnation:
            raise _mismatch(f"{source}: the checkpoint is of journal incarnation "
                            f"{a.file_incarnation:016x}, this journal is {incarnation:016x}",
                            "incarnation", expected=f"{a.file_incarnation:016x}",
                            found=f"{incarnation:016x}")
        if records < a.records:
            raise _mismatch(f"{source}: the journal has {records} records, the checkpoint "
                            f"covers {a.records}", "journal_short", records=records,
                            checkpoint_records=a.records)
        rec = image[record_offset(a.records - 1):record_offset(a.records)]
        generation = int.from_bytes(rec[22:28], "little")
        if hashlib.sha256(a.prev_digest + rec).digest() != a.digest or \
                not rec[3] & _FLAG_LAST or generation != a.generation:
            raise _mismatch(f"{source}: at byte offset {record_offset(a.records - 1)}: "
                            f"record {a.records - 1} does not chain to the checkpoint's "
                            "digest", "digest", offset=record_offset(a.records - 1),
                            record=a.records - 1)
        return a

    return check


def flush_journal(emitter: Emitter) -> bool:
    """Write and fsync every queued record now (the emitter task has stopped); False
    when a write fails (the records stay queued; nothing is checkpointed)."""
    j = emitter.journal
    if j.save_state().in_flight_records:   # a tick's outcome unknown: never ack over it
        log.warning("journal records in flight at shutdown; no checkpoint written")
        return False
    while (drained := j.drain(TICK_RECORDS)) is not None:
        first, data = drained
        try:
            write_all(emitter.ops, emitter.fd, data, record_offset(first))
            emitter.ops.fsync(emitter.fd)
        except OSError as exc:
            j.nack(exc.errno or errno.EIO)
            log.warning("journal flush at shutdown failed: %s; no checkpoint written", exc)
            return False
        j.ack()
    return True


def save_on_shutdown(device: Device, emitter: Emitter, runtime_file: Path) -> Anchor | None:
    """The clean-shutdown checkpoint: flush, then the state at the journal's saved end
    into the runtime file.  None (logged) when the journal cannot be flushed."""
    if not flush_journal(emitter):
        return None
    anchor = emitter.journal.saved_anchor()
    if anchor is None:
        log.warning("journal has unsaved records at shutdown; no checkpoint written")
        return None
    section = device.checkpoint(anchor)
    at = write_section(runtime_file, section)
    log.info("checkpoint of %d records (%d bytes) written at byte %d of %s", anchor.records,
             len(section), at, runtime_file)
    return anchor


# --------------------------------------------------------------------------- offline


@dataclass(frozen=True)
class PackResult:
    anchor: Anchor
    section_bytes: int
    replayed_from: int       # the record replay started at (0: the whole journal)


def pack_checkpoint(runtime: Path, journal_dir: Path, *, full: bool = False) -> PackResult:
    """``aotx pack --runtime F --checkpoint JOURNAL_DIR``: the state of a stopped
    runtime's journal into its runtime file.  Refuses (``journal_locked``,
    ``runtime_in_use``) while a runtime holds either; never writes the journal.
    Starts from the file's current checkpoint when it matches this journal (``full``:
    replay and verify every record instead); one that does not match is replaced."""
    journal_path = journal_dir / JOURNAL_NAME
    if not journal_path.is_file():
        raise errors.InvalidInput(f"--checkpoint {journal_dir}: no {JOURNAL_NAME} there",
                                  code="journal_missing", field="checkpoint")
    lock = flock_nb(runtime, shared=False)
    if lock is None:
        raise errors.ConfigError(f"--runtime {runtime}: in use by a running runtime (aotx "
                                 "boot or aotx serve); stop it first", code="runtime_in_use",
                                 field="runtime")
    try:
        jlock = lock_journal_dir(journal_dir)
        try:
            return _pack_locked(runtime, journal_dir, journal_path, full)
        finally:
            os.close(jlock)
    finally:
        os.close(lock)


def _pack_locked(runtime: Path, journal_dir: Path, journal_path: Path,
                 full: bool) -> PackResult:
    rf = ccir.RuntimeFile.open(runtime)
    if not rf.shared:
        raise errors.UnsupportedProfile(f"{runtime} lacks the shared profile",
                                        code="shared_profile_missing", field="runtime")
    lineage = rf.header.lineage
    image = journal_path.read_bytes()
    reader = JournalReader(image, lineage, source=str(journal_path))
    reader.check_header()
    device = Device(Journal(JournalParams(lineage=lineage,
                                          file_incarnation=reader.incarnation)), lineage.hex())
    try:
        device.recover_offline()
        start = None if full else _usable_checkpoint(runtime, lineage, str(journal_path), image)
        if start is not None:
            section, anchor = start
            device.load_checkpoint(section)
            reader.seek(anchor)
        device.recover(reader)
        check_watermark(journal_dir, journal_path, reader)
        anchor = reader.anchor()
        section = device.checkpoint(anchor)
    finally:
        device.close()
    write_section(runtime, section)
    return PackResult(anchor, len(section), start[1].records if start else 0)


def _usable_checkpoint(runtime: Path, lineage: bytes, source: str,
                       image: bytes) -> tuple[bytes, Anchor] | None:
    try:
        section = read_section(runtime)
        if section is None:
            return None
        anchor = journal_position(parse_section(section), lineage, source)(image)
    except errors.CheckpointInvalid as exc:
        log.warning("the runtime file's checkpoint is not used (%s); replaying the whole "
                    "journal", exc.message)
        return None
    return (section, anchor) if anchor is not None else None
