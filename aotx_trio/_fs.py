"""Durable file writes: fsync a folder; write a file atomically (temp + fsync + rename);
advisory file locks (``flock``).

:func:`atomic_file` is the one way this package replaces a file: readers see
the old file or the whole new one, and a crash leaves at most a stray temp
file (``.NAME.tmp-PID``), never a torn target.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from aotx_trio.errors import ConfigError


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


def refuse_writable_by_others(path: str | os.PathLike[str]) -> None:
    """Raise :class:`aotx_trio.errors.ConfigError` (code ``file_permissions``) naming
    ``path`` when its group or others may write it: whoever can rewrite a file of
    credentials or grants can give themselves any action.  A missing file is left to
    the caller's own message."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{path}: group or others may write it (mode "
                          f"{stat.S_IMODE(mode):04o}); refusing to use it: chmod go-w {path}",
                          code="file_permissions", key="(file)", path=str(path))


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a folder so a rename or a new file in it survives a crash."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A binary file to write ``path``'s new contents into.

    On a clean exit of the block the file is flushed and fsynced, renamed over
    ``path`` and the folder fsynced; if the block raises, the temp file is
    removed and ``path`` is untouched.  The temp file is created with
    ``O_EXCL | O_NOFOLLOW`` (never through a planted link)."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()   # our own leftover from a crash of this very pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode)
    try:
        with os.fdopen(fd, "w+b") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, p)
        fsync_dir(p.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def atomic_write_text(path: str | os.PathLike[str], body: str, *, mode: int = 0o644) -> Path:
    """Write ``body`` (UTF-8) to ``path`` atomically (:func:`atomic_file`)."""
    p = Path(path)
    with atomic_file(p, mode=mode) as out:
        out.write(body.encode("utf-8"))
    return p
