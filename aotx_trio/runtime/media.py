"""Media bytes: stored content-addressed (sha256), owned by their uploaders, durably.

``POST /media`` lands here (the ``media.put`` service call).  The layout, in
the runtime's journal folder::

    media/blobs/<sha256>                  the bytes, exactly as uploaded
    media/owners/<sha256>/<participant>   {"type", "content_type", "bytes"} (JSON)

Both files are written with :func:`aotx_trio._fs.atomic_file` (temp file,
fsync, rename, folder fsync), blob first, so an owner record never names
bytes that are not on disk; the call answers only once both are durable.
The same bytes uploaded by two participants are stored once and owned by
both; a participant's input may reference only media it owns (anything else
is ``media_not_found``, the same answer as for bytes nobody uploaded: another
participant's sha256 reveals nothing).  An owner's record is never rewritten: the
same bytes again under another ``Content-Type`` are 409 ``media_type_conflict``
(naming the stored one).  The type must be on
:data:`aotx_trio.vocab.MEDIA_CONTENT_TYPES` (422 ``media_type_invalid``).  Puts are
serialised (one lock): they are rare, and two uploads of one blob must not share a
temp file.

The journal's disk floor (``limits.journal_min_free_bytes``) holds for media too: before
a new blob is written, the file system must keep ``min_free_bytes`` free after it (the
blob rounded up to whole blocks, plus a block for each file and folder the put may
create), else 429 ``journal_hold`` (hold ``disk``) and nothing is stored, so an upload
never takes the disk below the records the floor protects.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from aotx_trio import errors
from aotx_trio._fs import atomic_file, atomic_write_text, fsync_dir
from aotx_trio.vocab import MEDIA_TYPE_RULE, media_content_type


@dataclass(frozen=True)
class Media:
    sha256: str
    type: str                    # image | audio
    content_type: str
    bytes: int


def free_bytes(path: str) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def block_size(path: str) -> int:
    """The allocation unit of ``path``'s file system."""
    return max(1, os.statvfs(path).f_frsize)


#: files and folders a put may create besides the blob (owner folder, owner record and
#: each one's temp file), a block each
_PUT_EXTRA_BLOCKS = 4


class MediaStore:
    def __init__(self, folder: str | os.PathLike[str], *, min_free_bytes: int = 0,
                 free: Callable[[str], int] = free_bytes) -> None:
        self.folder = Path(folder)
        self.min_free_bytes = min_free_bytes   # the journal's disk floor (0: none)
        self._free = free
        self._lock = trio.Lock()

    def check_floor(self, size: int) -> None:
        """429 ``journal_hold`` (hold ``disk``) unless the file system keeps
        ``min_free_bytes`` free after a put of a new ``size``-byte blob."""
        if self.min_free_bytes <= 0:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        where = str(self.folder)
        block = block_size(where)
        need = -(-size // block) * block + _PUT_EXTRA_BLOCKS * block
        try:
            free = self._free(where)
        except OSError as exc:   # cannot tell: refuse rather than risk the floor
            raise errors.JournalHold(f"the media folder's free space is unknown ({exc}); "
                                     "retry later", hold=["disk"], retry_after=1) from None
        if free - need < self.min_free_bytes:
            raise errors.JournalHold(
                f"storing {size} bytes would leave under the disk floor of "
                f"{self.min_free_bytes} free bytes; retry later", hold=["disk"],
                retry_after=1)

    def _blob(self, sha: str) -> Path:
        return self.folder / "blobs" / sha

    def _owner(self, sha: str, owner: str) -> Path:
        return self.folder / "owners" / sha / owner

    async def put(self, owner: str, content_type: str, data: bytes) -> tuple[Media, bool]:
        """Store ``data`` for ``owner`` (a participant key); (the media, created: False
        when this owner had it already)."""
        top = media_content_type(content_type)
        if top is None:
            raise errors.InvalidInput(MEDIA_TYPE_RULE, code="media_type_invalid",
                                      field="Content-Type")
        media = Media(hashlib.sha256(data).hexdigest(), top.partition("/")[0], top, len(data))
        async with self._lock:
            return await trio.to_thread.run_sync(self._put, owner, media, data)

    def _put(self, owner: str, media: Media, data: bytes) -> tuple[Media, bool]:
        had = self.owned(owner, media.sha256)
        if had is not None:   # the owner's record stands: one type per owner and bytes
            if had.content_type != media.content_type:
                raise errors.Conflict(
                    f"these bytes were uploaded as {had.content_type}, not "
                    f"{media.content_type}", code="media_type_conflict",
                    content_type=had.content_type, sha256=media.sha256)
            return had, False
        blob = self._blob(media.sha256)
        self.check_floor(0 if blob.exists() else media.bytes)   # the owner record's too
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(blob, mode=0o600) as out:
                out.write(data)
        record = self._owner(media.sha256, owner)
        if not record.parent.exists():
            record.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(record.parent.parent)
        atomic_write_text(record, json.dumps({"type": media.type,
                                              "content_type": media.content_type,
                                              "bytes": media.bytes}), mode=0o600)
        return media, True

    def owned(self, owner: str, sha: str) -> Media | None:
        """The media ``owner`` uploaded with this sha256, or None."""
        try:
            meta = json.loads(self._owner(sha, owner).read_text("utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Media(sha, str(meta["type"]), str(meta["content_type"]), int(meta["bytes"]))
