"""Durable small-file writes: fsync a folder, write a file atomically (temp + fsync + rename)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


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
