"""A fault seam for the journal's writes: off unless ``AOTX_JOURNAL_FAULTS`` is set.

For fault-and-load runs (``scripts/chaos.py --disk-faults``) against real server
processes: the runtime's journal then writes through :class:`FaultyFileOps`,
which fails a ``pwrite`` with EIO or ENOSPC, fails an ``fsync`` with EIO, or
stalls an ``fsync``, each with its own probability.  The emitter treats these as
it treats real ones (docs/reliability.md): a failed write or fsync is never
acknowledged; the records are written again before the next fsync, and new
writes hold (429 ``journal_hold``) until a save succeeds.

``AOTX_JOURNAL_FAULTS`` is comma-separated ``key=value``: ``eio`` and ``enospc``
(probability per ``pwrite``), ``fsync_eio`` (per ``fsync``), ``slow_fsync``
(``P:SECONDS``), ``seed``.  Example: ``eio=0.01,enospc=0.01,fsync_eio=0.01,
slow_fsync=0.05:0.2,seed=7``.  Opening and recovering the file never fails here.
"""

from __future__ import annotations

import errno
import os
import random
import time

from aotx_trio import errors
from aotx_trio.runtime.journal_file import FileOps

ENV = "AOTX_JOURNAL_FAULTS"
KEYS = ("eio", "enospc", "fsync_eio", "slow_fsync", "seed")


class FaultyFileOps(FileOps):
    def __init__(self, *, eio: float = 0.0, enospc: float = 0.0, fsync_eio: float = 0.0,
                 slow_p: float = 0.0, slow_s: float = 0.0, seed: int = 0) -> None:
        self.eio, self.enospc, self.fsync_eio = eio, enospc, fsync_eio
        self.slow_p, self.slow_s = slow_p, slow_s
        self.rng = random.Random(seed)
        self.injected = 0
        self.armed = False    # boot arms it once the file is open and recovered

    def _fail(self, code: int) -> None:
        self.injected += 1
        raise OSError(code, f"injected by {ENV}: {os.strerror(code)}")

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        roll = self.rng.random() if self.armed else 1.0
        if roll < self.eio:
            self._fail(errno.EIO)
        if roll < self.eio + self.enospc:
            self._fail(errno.ENOSPC)
        return super().pwrite(fd, data, offset)

    def fsync(self, fd: int) -> None:
        roll = self.rng.random() if self.armed else 1.0
        if roll < self.fsync_eio:
            self._fail(errno.EIO)
        if roll < self.fsync_eio + self.slow_p:
            time.sleep(self.slow_s)    # in the emitter's worker thread
        super().fsync(fd)


def parse(spec: str) -> FaultyFileOps:
    """The fault plan of an ``AOTX_JOURNAL_FAULTS`` value (ConfigError naming the key)."""
    kw: dict[str, float] = {}
    slow = (0.0, 0.0)
    seed = 0
    for part in filter(None, (p.strip() for p in spec.split(","))):
        key, eq, value = part.partition("=")
        try:
            if key not in KEYS or not eq:
                raise ValueError
            if key == "slow_fsync":
                p, _, s = value.partition(":")
                slow = (float(p), float(s))
            elif key == "seed":
                seed = int(value)
            else:
                kw[key] = float(value)
        except ValueError:
            raise errors.ConfigError(f"{ENV}: bad entry {part[:40]!r} (keys: "
                                     f"{', '.join(KEYS)})", key=ENV) from None
    return FaultyFileOps(slow_p=slow[0], slow_s=slow[1], seed=seed, **kw)


def from_env() -> FileOps | None:
    """The faulty file operations ``AOTX_JOURNAL_FAULTS`` asks for, or None (real I/O)."""
    spec = os.environ.get(ENV)
    return parse(spec) if spec else None
