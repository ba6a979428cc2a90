"""``aotx repair``: the operator's explicit repair of a journal the runtime refuses.

A runtime refuses to start on damage to acknowledged data (``journal_damage``
naming a byte offset, docs/reliability.md) and never truncates such a file
itself.  When the operator decides to give up what follows the damage, this
command does it, and only when told the offset (the one the refusal named), so
nothing is dropped by accident:

1. take the journal folder's lock (refused, touching nothing, while a runtime
   holds it: ``journal_locked``);
2. read the file up to ``--at`` and keep its complete transfers: the repaired
   file ends at the last one that ends at or before ``--at`` (damage *before*
   ``--at`` is refused again, naming its own offset: repair there);
3. copy every byte from that end on into ``<journal>/quarantine/repair-<end>-<unix
   s>.aotxj`` (``O_EXCL | O_NOFOLLOW``, fsynced with its folder: the quarantine
   :func:`~aotx_trio.runtime.journal_file.quarantine` that keeps a torn tail cut at
   open too) *before* the journal is truncated and fsynced: the bytes set aside are
   kept, never lost;
4. lower the commit watermark (``journal.commit``) to the records kept, with the
   kept prefix's digest, so the next start accepts the file.

Every acknowledged operation in the quarantined bytes is gone from the service
after the repair (that is what the operator chose); the file says so.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from aotx_trio import errors
from aotx_trio.native.journal import FILE_HEADER, RECORD_SIZE, JournalReader
from aotx_trio.runtime.journal_file import JOURNAL_NAME, lock_journal_dir, quarantine
from aotx_trio.runtime.watermark import WatermarkWriter, read_watermark


@dataclass(frozen=True)
class Repaired:
    path: Path
    valid_end: int          # the repaired file's size
    kept_records: int
    quarantined: Path
    quarantined_bytes: int


def repair(directory: str | os.PathLike[str], at: int) -> Repaired:
    """Set aside everything from the last complete transfer at or before byte ``at``
    of ``directory``'s journal (see the module doc)."""
    d = Path(directory)
    path = d / JOURNAL_NAME
    lock_fd = lock_journal_dir(d)
    try:
        image = path.read_bytes()
        if at < FILE_HEADER or at > len(image) or (at - FILE_HEADER) % RECORD_SIZE:
            raise errors.InvalidInput(
                f"--at {at} is not a record offset of {path} (64 + 192 * n, at most "
                f"{len(image)})", field="at")
        reader = JournalReader(image[:at], source=str(path))
        reader.check_header()
        for _ in reader:                       # damage before `at` raises here
            pass
        end = reader.valid_end
        mark = read_watermark(d, reader.incarnation)
        quarantined = quarantine(d, "repair", image[end:], end)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.ftruncate(fd, end)
            os.fsync(fd)
        finally:
            os.close(fd)
        records = (end - FILE_HEADER) // RECORD_SIZE
        if mark is not None and mark.saved_records > records:
            WatermarkWriter(d, reader.incarnation).write(mark.generation, records,
                                                         reader.digest)
        return Repaired(path, end, records, quarantined, len(image) - end)
    finally:
        os.close(lock_fd)


def main(args: argparse.Namespace) -> int:
    out = repair(args.journal, args.at)
    print(f"aotx repair: {out.path} now ends at byte {out.valid_end} ({out.kept_records} "
          f"records); {out.quarantined_bytes} bytes set aside in {out.quarantined}. "
          "Acknowledged operations in those bytes are gone from the service. A runtime "
          "file checkpoint of the longer journal is refused at boot (checkpoint_mismatch): "
          f"rebuild it with `aotx pack --runtime FILE --checkpoint {args.journal} "
          "--full-replay`.")
    return 0
