"""The folder backend of the registry store (docs/formats/registry.md, "Folder").

Replacements go through :func:`aotx_trio._fs.atomic_file`; write-once files
(documents and blobs) are written to a temp file, fsynced and ``link(2)``-ed to
their name, which fails rather than overwrite.  ``flock`` serialises the
read-modify-writes and the feed appends between threads and processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from aotx_trio._fs import atomic_file, fsync_dir
from aotx_trio.errors import FormatError
from aotx_trio.identity import canonical
from aotx_trio.registry.records import check_key, parse_time
from aotx_trio.registry.store import COLLECTIONS, Updater

FORMAT = b"aotx-registry 1\n"
CHUNK = 1 << 20


def _mkdirs(path: Path) -> None:
    """Create ``path`` and its missing parents, fsyncing each new entry's folder."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        fsync_dir(d.parent)


def _link_once(tmp: Path, target: Path) -> bool:
    """Link the fsynced ``tmp`` to ``target``; False when ``target`` exists."""
    _mkdirs(target.parent)
    try:
        os.link(tmp, target)
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
    fsync_dir(target.parent)
    return True


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # closing drops the lock


class FolderStore:
    """:class:`~aotx_trio.registry.store.StoreBackend` on a folder."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        _mkdirs(self.root)
        fmt = self.root / "FORMAT"
        if not fmt.exists():
            tmp = self.root / f".FORMAT.tmp-{uuid.uuid4().hex}"
            self._write_tmp(tmp, [FORMAT])
            _link_once(tmp, fmt)
        if fmt.read_bytes() != FORMAT:
            raise FormatError(f"{fmt}: not an aotx registry of format 1",
                              code="unsupported_registry")
        for sub in ("objects", "blobs/sha256", "blobs/tmp", "feed", "webhooks"):
            _mkdirs(self.root / sub)
        self._objects_lock = self.root / "objects" / ".lock"
        self._feed_lock = self.root / "feed" / ".lock"
        self._feed = self.root / "feed" / "events.jsonl"
        self._hooks = self.root / "webhooks"
        self._hooks_lock = self._hooks / ".lock"

    # ------------------------------------------------------------------ documents

    def _path(self, coll: str, key: str) -> Path:
        if coll not in COLLECTIONS:
            raise ValueError(f"unknown collection {coll!r}")
        check_key(key, "key")
        return self.root / "objects" / coll / f"{key}.json"

    @staticmethod
    def _write_tmp(tmp: Path, chunks: Iterable[bytes]) -> None:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())

    def get(self, coll: str, key: str) -> bytes | None:
        try:
            return self._path(coll, key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def put(self, coll: str, key: str, body: bytes) -> None:
        path = self._path(coll, key)
        _mkdirs(path.parent)
        with atomic_file(path) as out:
            out.write(body)

    def create(self, coll: str, key: str, body: bytes) -> bytes | None:
        path = self._path(coll, key)
        _mkdirs(path.parent)
        tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
        self._write_tmp(tmp, [body])
        if _link_once(tmp, path):
            return None
        return path.read_bytes()

    def update(self, coll: str, key: str, fn: Updater) -> bytes:
        with _flock(self._objects_lock):
            body = fn(self.get(coll, key))
            self.put(coll, key, body)
            return body

    def keys(self, coll: str, prefix: str = "") -> list[str]:
        if coll not in COLLECTIONS:
            raise ValueError(f"unknown collection {coll!r}")
        base = self.root / "objects" / coll
        out = []
        for path in base.rglob("*.json"):
            rel = path.relative_to(base).as_posix()
            if any(part.startswith(".") for part in rel.split("/")):
                continue
            key = rel[: -len(".json")]
            if key.startswith(prefix):
                out.append(key)
        return sorted(out)

    # ------------------------------------------------------------------ blobs

    def _blob_path(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256[:2] / sha256

    def blob_put(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        h = hashlib.sha256()
        size = 0

        def hashed() -> Iterator[bytes]:
            nonlocal size
            for chunk in chunks:
                h.update(chunk)
                size += len(chunk)
                yield chunk

        tmp = self.root / "blobs" / "tmp" / f".{uuid.uuid4().hex}"
        try:
            self._write_tmp(tmp, hashed())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        sha = h.hexdigest()
        _link_once(tmp, self._blob_path(sha))
        return sha, size

    def blob_size(self, sha256: str) -> int | None:
        try:
            return self._blob_path(sha256).stat().st_size
        except FileNotFoundError:
            return None

    def blob_read(self, sha256: str) -> Iterator[bytes]:
        try:
            f = self._blob_path(sha256).open("rb")
        except FileNotFoundError:
            raise KeyError(sha256) from None
        with f:
            while chunk := f.read(CHUNK):
                yield chunk

    # ------------------------------------------------------------------ feed

    def _feed_lines(self) -> list[bytes]:
        """The complete lines of the feed; a torn last line is cut off the file."""
        try:
            data = self._feed.read_bytes()
        except FileNotFoundError:
            return []
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            with self._feed.open("r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())
            data = data[:keep]
        return data.splitlines()

    def feed_append(self, event: bytes, operation_id: str, at: float) -> int | None:
        with _flock(self._feed_lock):
            lines = self._feed_lines()
            docs = [json.loads(line) for line in lines]
            if any(d["operation_id"] == operation_id for d in docs):
                return None
            seq = docs[-1]["seq"] + 1 if docs else 1
            line = canonical({**json.loads(event), "seq": seq}) + b"\n"
            new = not self._feed.exists()
            with self._feed.open("ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            if new:
                fsync_dir(self._feed.parent)
            return int(seq)

    def feed_read(self, after: int, limit: int) -> list[bytes]:
        out = []
        with _flock(self._feed_lock):
            lines = self._feed_lines()
        for line in lines:
            if json.loads(line)["seq"] > after:
                out.append(line)
                if len(out) >= limit:
                    break
        return out

    def feed_ops(self) -> set[str]:
        with _flock(self._feed_lock):
            return {json.loads(line)["operation_id"] for line in self._feed_lines()}

    def feed_trim(self, before: float) -> int:
        with _flock(self._feed_lock):
            lines = self._feed_lines()
            keep = [ln for i, ln in enumerate(lines)
                    if i == len(lines) - 1 or parse_time(json.loads(ln)["at"]) >= before]
            dropped = len(lines) - len(keep)
            if dropped:
                with atomic_file(self._feed) as out:
                    out.write(b"".join(ln + b"\n" for ln in keep))
            return dropped

    def feed_head(self) -> int:
        with _flock(self._feed_lock):
            lines = self._feed_lines()
        return int(json.loads(lines[-1])["seq"]) if lines else 0

    # ------------------------------------------------------------------ webhooks

    def _hook(self, uuid_: str, ext: str) -> Path:
        if str(uuid.UUID(uuid_)) != uuid_:
            raise ValueError(f"not a canonical uuid: {uuid_[:80]!r}")
        return self._hooks / f"{uuid_}{ext}"

    def hook_create(self, uuid: str, body: bytes,
                    admit: Callable[[list[bytes]], None] | None = None) -> bytes | None:
        path = self._hook(uuid, ".json")
        with _flock(self._hooks_lock):
            if admit is not None:
                admit(self.hook_list())
            tmp = path.with_name(f".{path.name}.tmp-{os.urandom(8).hex()}")
            self._write_tmp(tmp, [body])
            if _link_once(tmp, path):
                return None
            return path.read_bytes()

    def hook_get(self, uuid: str) -> bytes | None:
        try:
            return self._hook(uuid, ".json").read_bytes()
        except FileNotFoundError:
            return None

    def hook_list(self) -> list[bytes]:
        return [p.read_bytes() for p in sorted(self._hooks.glob("*.json"))
                if not p.name.startswith(".")]

    def hook_delete(self, uuid: str) -> None:
        with _flock(self._hooks_lock):
            self._hook(uuid, ".json").unlink(missing_ok=True)
            self._hook(uuid, ".lease").unlink(missing_ok=True)
            fsync_dir(self._hooks)

    def _lease(self, uuid: str) -> tuple[str | None, float]:
        try:
            doc = json.loads(self._hook(uuid, ".lease").read_bytes())
        except FileNotFoundError:
            return None, 0.0
        return doc["holder"], float(doc["expires"])

    def hook_update(self, uuid: str, fn: Updater, *, holder: str | None = None,
                    now: float = 0.0) -> bytes | None:
        with _flock(self._hooks_lock):
            if holder is not None:
                who, expires = self._lease(uuid)
                if who != holder or expires < now:
                    return None
            old = self.hook_get(uuid)
            if old is None:
                raise KeyError(uuid)
            body = fn(old)
            with atomic_file(self._hook(uuid, ".json")) as out:
                out.write(body)
            return body

    def hook_lease(self, uuid: str, holder: str, now: float, ttl_s: float) -> bool:
        with _flock(self._hooks_lock):
            who, expires = self._lease(uuid)
            if who is not None and who != holder and expires >= now:
                return False
            with atomic_file(self._hook(uuid, ".lease")) as out:
                out.write(canonical({"holder": holder, "expires": now + ttl_s}))
            return True

    def hook_release(self, uuid: str, holder: str) -> None:
        with _flock(self._hooks_lock):
            if self._lease(uuid)[0] == holder:
                self._hook(uuid, ".lease").unlink(missing_ok=True)

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own files."""
