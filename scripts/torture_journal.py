#!/usr/bin/env python3
"""kill -9 torture of the journal: no acknowledged transfer is ever lost.

Each cycle starts one writer process that opens the journal (recovering and
truncating a torn tail), runs the real :class:`~aotx_trio.runtime.emitter.Emitter`
and, from several producer tasks, enqueues transfers with unique,
self-checking payloads; after ``wait_saved`` it appends ``ACK <id>`` to the
cycle's ack file.  The parent ``kill -9``s the writer after a random delay
(sometimes before it is even ready), then recovers the file read-only and checks:

* every acknowledged id (of every cycle so far) is in the file, with its payload;
* no id is present twice (an unacknowledged one at most once);
* every complete transfer seen after an earlier cycle is still there;
* the file reopens and continues (every cycle's writer reopens it; at the end
  the parent reopens it, writes one more transfer and reads it back).

Usage::

    python scripts/torture_journal.py --cycles 200            # CI size (tests/test_torture.py)
    python scripts/torture_journal.py --cycles 20000 --seed 7 # long run (docs/reliability.md)

Writers are forked from the parent (``--spawn fork``, fast: the imports are
already done) or started as ``python scripts/torture_journal.py --writer ...``
(``--spawn exec``, a cold interpreter each cycle).  Exit status 0 when every
check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from aotx_trio import errors  # noqa: E402
from aotx_trio.native.journal import XFER_ADMISSION, XFER_BOOT, XFER_OUTPUT, recover_journal  # noqa: E402
from aotx_trio.runtime.emitter import Emitter  # noqa: E402
from aotx_trio.runtime.journal_file import JOURNAL_NAME, open_journal_file  # noqa: E402

LINEAGE = b"torture-lineage!"
PRODUCERS = 3


def payload_for(ident: str) -> bytes:
    """A self-checking payload: the id, '|', then 0..899 bytes derived from it."""
    h = hashlib.sha256(ident.encode()).digest()
    n = int.from_bytes(h[:2], "little") % 900
    body = (h * (n // 32 + 1))[:n]
    return ident.encode() + b"|" + body


def parse_payload(data: bytes) -> str:
    ident, _, _ = data.partition(b"|")
    text = ident.decode()
    if payload_for(text) != data:
        raise AssertionError(f"payload of {text!r} does not match its id")
    return text


# ---- writer ----

async def _produce(emitter: Emitter, cycle: int, p: int, ack_fd: int) -> None:
    i = 0
    while True:
        ident = f"{cycle}.{p}.{i}"
        data = payload_for(ident)
        try:
            last = emitter.journal.enqueue(XFER_OUTPUT if len(data) > 160 else XFER_ADMISSION,
                                           data)
        except errors.JournalHold:
            await trio.sleep(0.001)
            continue
        emitter.wake()
        await emitter.wait_saved(last)
        os.write(ack_fd, f"ACK {ident}\n".encode())
        i += 1


async def _writer(directory: Path, cycle: int, ack_fd: int, ready_fd: int) -> None:
    jf = await trio.to_thread.run_sync(open_journal_file, directory, LINEAGE)
    emitter = Emitter.for_file(jf)
    async with trio.open_nursery() as n:
        await n.start(emitter.run)
        os.write(ready_fd, b"R")
        for p in range(PRODUCERS):
            n.start_soon(_produce, emitter, cycle, p, ack_fd)


def writer_main(directory: Path, cycle: int, ack_path: Path, ready_fd: int) -> None:
    ack_fd = os.open(ack_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    trio.run(_writer, directory, cycle, ack_fd, ready_fd)


# ---- parent ----

@dataclass
class Stats:
    cycles: int = 0
    acked: int = 0
    torn_tails: int = 0
    killed_before_ready: int = 0
    transfers: int = 0
    boots: int = 0
    errors: list[str] = field(default_factory=list)


def spawn(mode: str, directory: Path, cycle: int, ack_path: Path) -> tuple[int, int]:
    """Start a writer; returns (pid, read end of its ready pipe)."""
    r, w = os.pipe()
    if mode == "fork":
        pid = os.fork()
        if pid == 0:  # child
            os.close(r)
            try:
                writer_main(directory, cycle, ack_path, w)
            finally:
                os._exit(3)
        os.close(w)
        return pid, r
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--writer", "--dir", str(directory),
         "--cycle", str(cycle), "--ack", str(ack_path), "--ready-fd", str(w)],
        pass_fds=(w,), env=dict(os.environ, PYTHONPATH=str(ROOT)))
    os.close(w)
    return proc.pid, r


def wait_ready(fd: int, timeout: float) -> bool:
    import select

    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready) and os.read(fd, 1) == b"R"


def verify(path: Path, acked: set[str], seen_before: set[str], stats: Stats) -> set[str]:
    rec = recover_journal(path, LINEAGE)
    ids = [parse_payload(t.data) for t in rec.transfers if t.kind != XFER_BOOT]
    counts = collections.Counter(ids)
    dup = [i for i, c in counts.items() if c > 1]
    if dup:
        raise AssertionError(f"ids present more than once: {dup[:5]}")
    present = set(ids)
    lost = acked - present
    if lost:
        raise AssertionError(f"{len(lost)} acknowledged transfers lost, e.g. {sorted(lost)[:5]}")
    vanished = seen_before - present
    if vanished:
        raise AssertionError(f"{len(vanished)} complete transfers vanished: {sorted(vanished)[:5]}")
    if rec.torn_bytes:
        stats.torn_tails += 1
    stats.transfers = len(ids)
    stats.boots = rec.boot
    return present


def final_continue(directory: Path, acked: set[str]) -> None:
    """The parent reopens the file, writes one more transfer, and reads it back."""
    async def main() -> None:
        jf = await trio.to_thread.run_sync(open_journal_file, directory, LINEAGE)
        emitter = Emitter.for_file(jf)
        async with trio.open_nursery() as n:
            await n.start(emitter.run)
            last = jf.journal.enqueue(XFER_ADMISSION, payload_for("final"))
            emitter.wake()
            await emitter.wait_saved(last)
            n.cancel_scope.cancel()
        jf.close()

    trio.run(main)
    rec = recover_journal(directory / JOURNAL_NAME, LINEAGE)
    ids = {parse_payload(t.data) for t in rec.transfers if t.kind != XFER_BOOT}
    if "final" not in ids or not acked <= ids or rec.torn_bytes:
        raise AssertionError("the file did not continue after the last kill")


def run(cycles: int, seed: int, directory: Path, mode: str, max_delay: float,
        verbose: bool) -> Stats:
    rng = random.Random(seed)
    path = directory / JOURNAL_NAME
    acks_dir = directory / "acks"
    acks_dir.mkdir(exist_ok=True)
    acked: set[str] = set()
    seen: set[str] = set()
    stats = Stats()
    for cycle in range(cycles):
        ack_path = acks_dir / f"{cycle}.txt"
        pid, ready_fd = spawn(mode, directory, cycle, ack_path)
        try:
            if rng.random() < 0.75:
                # kill while it writes
                if not wait_ready(ready_fd, 30.0):
                    raise AssertionError(f"cycle {cycle}: writer never became ready")
                time.sleep(rng.uniform(0.0, max_delay))
            else:
                # kill anywhere, opening and recovery included
                time.sleep(rng.uniform(0.0, max_delay * (2.0 if mode == "fork" else 8.0)))
                if not wait_ready(ready_fd, 0.0):
                    stats.killed_before_ready += 1
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(ready_fd)
        if ack_path.exists():
            for line in ack_path.read_text().splitlines():
                if line.startswith("ACK "):
                    acked.add(line[4:])
        if path.exists():
            seen = verify(path, acked, seen, stats)
        elif acked:
            raise AssertionError(f"cycle {cycle}: journal missing with {len(acked)} acks")
        stats.cycles += 1
        stats.acked = len(acked)
        if verbose and (cycle + 1) % 100 == 0:
            print(f"cycle {cycle + 1}: acked {stats.acked}, transfers {stats.transfers}, "
                  f"boots {stats.boots}, torn tails {stats.torn_tails}", flush=True)
    final_continue(directory, acked)
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", help="journal folder (default: a fresh temporary folder)")
    ap.add_argument("--spawn", choices=("fork", "exec"), default="fork")
    ap.add_argument("--max-delay", type=float, default=0.03,
                    help="seconds: upper bound of the random kill delay after the writer is ready")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cycle", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ack", help=argparse.SUPPRESS)
    ap.add_argument("--ready-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.writer:
        writer_main(Path(args.dir), args.cycle, Path(args.ack), args.ready_fd)
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="aotx-torture-") as tmp:
        directory = Path(args.dir) if args.dir else Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        try:
            stats = run(args.cycles, args.seed, directory, args.spawn, args.max_delay,
                        args.verbose)
        except (AssertionError, errors.AotxError) as exc:
            print(f"FAIL: {exc}", flush=True)
            return 1
    print(f"OK cycles={stats.cycles} acked={stats.acked} transfers={stats.transfers} "
          f"boots={stats.boots} torn_tails={stats.torn_tails} "
          f"killed_before_ready={stats.killed_before_ready} lost=0 duplicated=0 "
          f"seconds={time.monotonic() - started:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
