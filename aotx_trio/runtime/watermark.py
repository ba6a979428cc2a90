"""The journal's commit watermark: ``<journal>/journal.commit``.

A small file beside the journal that says how many records were acknowledged
(saved) when the emitter last went idle, with the save's generation and commit
digest.  It is what tells a damaged last save from a torn tail: recovery
refuses to drop a record the watermark says was acknowledged.  It is written
outside the record stream (record indices stay as the producer made them), in
one of two 128-byte slots taken in turn, so a torn write of one slot leaves
the other.  Byte layout: docs/formats/journal.md, "Commit watermark".
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

from aotx_trio._fs import fsync_dir
from aotx_trio.native.journal import crc32c

NAME = "journal.commit"
MAGIC = b"AOTXCMIT"
VERSION = 1
SLOT = 128
_FIELDS = struct.Struct("<8sIIQQQQ32s")   # magic .. digest: 80 bytes, then zeros, CRC at 124


@dataclass(frozen=True)
class Watermark:
    file_incarnation: int
    sequence: int          # slot write counter (the higher valid slot wins)
    generation: int        # the acknowledged save's generation
    saved_records: int     # records acknowledged: [0, saved_records)
    commit_digest: bytes   # D(saved_records)


def encode(w: Watermark) -> bytes:
    head = _FIELDS.pack(MAGIC, VERSION, 0, w.file_incarnation, w.sequence, w.generation,
                        w.saved_records, w.commit_digest)
    body = head + bytes(124 - len(head))
    return body + struct.pack("<I", crc32c(body))


def decode(slot: bytes) -> Watermark | None:
    """The slot's watermark, or None when it is empty, torn or not one."""
    if len(slot) != SLOT or struct.unpack_from("<I", slot, 124)[0] != crc32c(slot[:124]):
        return None
    magic, version, _, inc, seq, gen, saved, digest = _FIELDS.unpack_from(slot)
    if magic != MAGIC or version != VERSION or seq == 0:
        return None
    return Watermark(inc, seq, gen, saved, digest)


def read_watermark(directory: str | os.PathLike[str], file_incarnation: int) -> Watermark | None:
    """The newest valid watermark of the journal file with this incarnation (a watermark
    of another journal file, e.g. one an operator replaced, is ignored)."""
    try:
        data = (Path(directory) / NAME).read_bytes()
    except FileNotFoundError:
        return None
    found = [w for w in (decode(data[i * SLOT:(i + 1) * SLOT]) for i in range(2))
             if w is not None and w.file_incarnation == file_incarnation]
    return max(found, key=lambda w: w.sequence, default=None)


class WatermarkWriter:
    """Writes watermarks into the two slots in turn (open, pwrite, fsync, close each)."""

    def __init__(self, directory: str | os.PathLike[str], file_incarnation: int) -> None:
        self.directory = Path(directory)
        self.file_incarnation = file_incarnation
        last = read_watermark(directory, file_incarnation)
        self.sequence = last.sequence if last else 0
        self.saved_records = last.saved_records if last else 0

    def write(self, generation: int, saved_records: int, commit_digest: bytes) -> None:
        """Blocking: record that ``[0, saved_records)`` is acknowledged."""
        path = self.directory / NAME
        created = not path.exists()
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            w = Watermark(self.file_incarnation, self.sequence + 1, generation, saved_records,
                          commit_digest)
            if os.pwrite(fd, encode(w), SLOT * (w.sequence % 2)) != SLOT:
                raise OSError(f"{path}: short write")
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self.directory)
        self.sequence = w.sequence
        self.saved_records = saved_records
