"""Durable small-file writes: fsync a folder, write a file atomically (temp + fsync + rename);
advisory file locks (``flock``)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path


def flock_nb(path: str | os.PathLike[str], *, shared: bool, create: bool = False) -> int | None:
    """Open ``path`` (created 0600 when ``create``) and ``flock`` it without waiting: the
    descriptor, which holds the lock until it is closed, or None when another holder's
    lock conflicts (exclusive against any; shared against exclusive)."""
    flags = os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_RDWR | os.O_CREAT if create else os.O_RDONLY)
    fd = os.open(path, flags, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder so a rename or a new file in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], body: str, *, mode: int = 0o644) -> Path:
    """Write ``body`` to ``path`` so that readers see the old file or the whole new one."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
        fsync_dir(p.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return p
