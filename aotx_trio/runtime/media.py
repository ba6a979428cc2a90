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
participant's sha256 reveals nothing).  Puts are serialised (one lock): they
are rare, and two uploads of one blob must not share a temp file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import trio

from aotx_trio import errors
from aotx_trio._fs import atomic_file, atomic_write_text, fsync_dir
from aotx_trio.vocab import media_kind


@dataclass(frozen=True)
class Media:
    sha256: str
    type: str                    # image | audio
    content_type: str
    bytes: int


def media_type(content_type: str) -> str:
    """``image`` or ``audio`` from a Content-Type (``image/png; x=y`` -> image), else a
    422 naming the header."""
    kind = media_kind(content_type)
    if kind is None:
        raise errors.InvalidInput("Content-Type must be image/* or audio/*",
                                  code="media_type_invalid", field="Content-Type")
    return kind


class MediaStore:
    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self._lock = trio.Lock()

    def _blob(self, sha: str) -> Path:
        return self.folder / "blobs" / sha

    def _owner(self, sha: str, owner: str) -> Path:
        return self.folder / "owners" / sha / owner

    async def put(self, owner: str, content_type: str, data: bytes) -> tuple[Media, bool]:
        """Store ``data`` for ``owner`` (a participant key); (the media, created: False
        when this owner had it already)."""
        kind = media_type(content_type)
        sha = hashlib.sha256(data).hexdigest()
        media = Media(sha, kind, content_type.split(";", 1)[0].strip().lower(), len(data))
        async with self._lock:
            return media, await trio.to_thread.run_sync(self._put, owner, media, data)

    def _put(self, owner: str, media: Media, data: bytes) -> bool:
        blob = self._blob(media.sha256)
        if not blob.exists():
            blob.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(blob, mode=0o600) as out:
                out.write(data)
        record = self._owner(media.sha256, owner)
        if record.exists():
            return False
        if not record.parent.exists():
            record.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(record.parent.parent)
        atomic_write_text(record, json.dumps({"type": media.type,
                                              "content_type": media.content_type,
                                              "bytes": media.bytes}), mode=0o600)
        return True

    def owned(self, owner: str, sha: str) -> Media | None:
        """The media ``owner`` uploaded with this sha256, or None."""
        try:
            meta = json.loads(self._owner(sha, owner).read_text("utf-8"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        return Media(sha, str(meta["type"]), str(meta["content_type"]), int(meta["bytes"]))
