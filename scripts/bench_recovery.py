#!/usr/bin/env python3
"""Benchmark: boot recovery time against journal length, full replay vs checkpoint
(issue 8, item 9).

For each ``--sizes`` N: a fresh journal folder is filled with N durable
admissions through the real runtime state (``open_runtime_state``: device +
journal + emitter, every tick fsynced), the way ``bench_gateway.py`` loads a
server: ``--participants`` principals each register, create a private space,
then loop ``member.set`` on it, retiring their receipts every 16 mutations so
the fixed receipt table never fills.  Then ``aotx pack --checkpoint`` (offline)
writes a checkpoint of those N into a runtime file, and ``--suffix`` more
admissions are written after it (so the checkpoint boot has a real suffix to
replay).  Then the state is opened ``--rounds`` times each way, interleaved:

* full: no runtime file, every record read, verified and replayed;
* checkpoint: from the runtime file's checkpoint (restored before each round,
  so the suffix stays the same): only the journal's header, the checkpoint's last
  record and the suffix copied, every prefix record's CRC-32C checked through a
  read-only map, the suffix verified and replayed.

The time of each open (to the state being ready) is the recovery time.  Prints
one table (admissions, records, journal MB, full and checkpoint seconds, the
checkpoint's bytes and the offline pack time) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from aotx_trio.native import device as D
from aotx_trio.native.journal import RECORD_SIZE
from aotx_trio.runtime import ccir, checkpoint
from aotx_trio.runtime.boot import open_runtime_state
from aotx_trio.vocab import ALL_GRANTS

LINEAGE = bytes(range(16))


async def fill(folder: Path, n: int, participants: int, start: int = 0) -> int:
    """N admissions through the runtime state (after ``start`` earlier ones by the
    same principals); returns the journal's record count."""
    async with open_runtime_state(LINEAGE, folder) as state:
        async with trio.open_nursery() as nursery:
            await nursery.start(state.emitter.run)
            dev, emitter, lin = state.device, state.emitter, LINEAGE.hex()
            keys = [f"{i + 1:032x}" for i in range(participants)]
            seq = {k: dev.participant(ALL_GRANTS, k).next_sequence or 1 for k in keys}
            spaces: dict[str, str] = {}
            op = 2 * start + 1000   # past every key the earlier fill used

            def submit(actor: str, kind: D.Kind, **kw: object) -> D.Receipt:
                nonlocal op
                op += 1
                r = dev.submit(ALL_GRANTS, actor, D.Request(kind, lin, f"{op:032x}",
                                                            seq[actor], **kw))  # type: ignore[arg-type]
                seq[actor] += 1
                return r

            async def settle(receipts: list[D.Receipt]) -> None:
                emitter.wake()
                await emitter.wait_saved(max(r.admission_record for r in receipts))

            done = 0
            if start == 0:
                await settle([submit(k, D.Kind.REGISTER) for k in keys])
                batch = []
                for k in keys:
                    r = submit(k, D.Kind.SPACE_CREATE)
                    spaces[k] = r.resource_id
                    batch.append(r)
                await settle(batch)
                done = 2 * participants
            else:
                for k in keys:
                    rows, _ = dev.spaces(ALL_GRANTS, k)
                    spaces[k] = rows[0].id
            while done < n:
                batch = []
                for k in keys:
                    if (seq[k] - 3) % 16 == 15:
                        batch.append(submit(k, D.Kind.RETIRE, retry_floor=seq[k]))
                    else:
                        batch.append(submit(k, D.Kind.MEMBER_SET, space=spaces[k],
                                            participant=k,
                                            permissions=("read", "write", "manage")))
                await settle(batch)
                done += len(batch)
            records = state.journal_file.journal.save_state().saved_records
            nursery.cancel_scope.cancel()
    return int(records)


def runtime_file(folder: Path) -> Path:
    """A minimal shared runtime file of the bench's lineage (no model is loaded)."""
    comp = folder / "config.json"
    comp.write_text("{}")
    target = folder / "bench.aotxccir"
    ccir.write_runtime(target, [ccir.Source(ccir.KIND_EMBEDDING_FILE, "config.json", comp, 0,
                                            comp.stat().st_size)],
                       required=ccir.PROFILE_SHARED, optional=0, lineage=LINEAGE,
                       progress=False)
    return target


async def recover(folder: Path, rt: Path | None) -> tuple[float, float]:
    """(wall, CPU) seconds to a ready state; CPU counts every thread of the process
    (the journal is opened in a worker thread), so it is the figure that holds on a
    shared machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    async with open_runtime_state(LINEAGE, folder, runtime_file=rt):
        took = time.perf_counter() - t0, time.process_time() - c0
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000",
                    help="comma-separated admission counts (default 10000,100000)")
    ap.add_argument("--participants", type=int, default=32)
    ap.add_argument("--suffix", type=int, default=1000,
                    help="admissions written after the checkpoint (default 1000)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        folder = Path(tempfile.mkdtemp(prefix="aotx-bench-recovery-"))
        try:
            journal = folder / "journal"
            t0 = time.perf_counter()
            trio.run(fill, journal, n, args.participants)
            fill_s = time.perf_counter() - t0
            rt = runtime_file(folder)
            t0 = time.perf_counter()
            packed = checkpoint.pack_checkpoint(rt, journal)
            pack_s = time.perf_counter() - t0
            records = trio.run(fill, journal, args.suffix, args.participants, n)
            saved = rt.read_bytes()
            size = (journal / "journal.aotxj").stat().st_size
            full, fast, full_cpu, fast_cpu = [], [], [], []
            for _ in range(args.rounds):   # interleaved: the same machine noise for both
                wall, cpu = trio.run(recover, journal, None)
                full.append(wall)
                full_cpu.append(cpu)
                rt.write_bytes(saved)      # the same checkpoint, the same suffix
                wall, cpu = trio.run(recover, journal, rt)
                fast.append(wall)
                fast_cpu.append(cpu)
            rows.append({"admissions": n, "suffix_admissions": args.suffix,
                         "records": records, "checkpoint_records": packed.anchor.records,
                         "journal_bytes": size, "checkpoint_bytes": packed.section_bytes,
                         "fill_s": round(fill_s, 2), "pack_s": round(pack_s, 3),
                         "full_s_median": round(statistics.median(full), 4),
                         "full_s_best": round(min(full), 4),
                         "checkpoint_s_median": round(statistics.median(fast), 4),
                         "checkpoint_s_best": round(min(fast), 4),
                         "full_cpu_s_median": round(statistics.median(full_cpu), 4),
                         "checkpoint_cpu_s_median": round(statistics.median(fast_cpu), 4)})
            print(f"filled {n:,} + {args.suffix:,} admissions ({records:,} records) in "
                  f"{fill_s:.1f} s", file=sys.stderr)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{'admissions':>11} {'records':>9} {'journal MB':>10} {'full s':>8} "
          f"{'ckpt s':>8} {'full cpu':>8} {'ckpt cpu':>8} {'ckpt KB':>8} {'pack s':>7}")
    for r in rows:
        print(f"{r['admissions']:>11,} {r['records']:>9,} "
              f"{r['journal_bytes'] / 1e6:>10.1f} {r['full_s_median']:>8.3f} "
              f"{r['checkpoint_s_median']:>8.3f} {r['full_cpu_s_median']:>8.3f} "
              f"{r['checkpoint_cpu_s_median']:>8.3f} {r['checkpoint_bytes'] / 1e3:>8.1f} "
              f"{r['pack_s']:>7.2f}")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"for {b['records'] / a['records']:.1f}x the records: full replay grows "
              f"{b['full_s_median'] / a['full_s_median']:.1f}x (CPU "
              f"{b['full_cpu_s_median'] / a['full_cpu_s_median']:.1f}x), checkpoint + "
              f"suffix {b['checkpoint_s_median'] / a['checkpoint_s_median']:.1f}x (CPU "
              f"{b['checkpoint_cpu_s_median'] / a['checkpoint_cpu_s_median']:.1f}x)")
    print(json.dumps({"rows": rows, "record_size": RECORD_SIZE}))


if __name__ == "__main__":
    main()
