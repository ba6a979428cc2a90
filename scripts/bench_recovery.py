#!/usr/bin/env python3
"""Benchmark: boot recovery time against journal length (issue 8, item 9).

For each ``--sizes`` N: a fresh journal folder is filled with N durable
admissions through the real runtime state (``open_runtime_state``: device +
journal + emitter, every tick fsynced), the way ``bench_gateway.py`` loads a
server: ``--participants`` principals each register, create a private space,
then loop ``member.set`` on it, retiring their receipts every 16 mutations so
the fixed receipt table never fills.  Then the state is closed and opened
again ``--rounds`` times: the time of each open (read + verify every record,
replay every transfer into a fresh device, resume) is the recovery time.

Prints one table (admissions, journal bytes, records, recovery seconds median
and best, microseconds per record) and one JSON line.  Recovery replays the
whole journal today, so it grows linearly with its length; a checkpoint in
the runtime file (issue 8, item 9) is what would make it flat.
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

from aotx_trio import device as D
from aotx_trio.journal import RECORD_SIZE
from aotx_trio.runtime.boot import open_runtime_state
from aotx_trio.vocab import ALL_GRANTS

LINEAGE = bytes(range(16))


async def fill(folder: Path, n: int, participants: int) -> int:
    """N admissions through the runtime state; returns the journal's record count."""
    async with open_runtime_state(LINEAGE, folder) as state:
        async with trio.open_nursery() as nursery:
            await nursery.start(state.emitter.run)
            dev, emitter, lin = state.device, state.emitter, LINEAGE.hex()
            keys = [f"{i + 1:032x}" for i in range(participants)]
            seq = dict.fromkeys(keys, 1)
            spaces: dict[str, str] = {}
            done = 0
            op = 0

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

            batch = [submit(k, D.Kind.REGISTER) for k in keys]
            await settle(batch)
            batch = []
            for k in keys:
                r = submit(k, D.Kind.SPACE_CREATE)
                spaces[k] = r.resource_id
                batch.append(r)
            await settle(batch)
            done = 2 * participants
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


async def recover(folder: Path) -> float:
    t0 = time.perf_counter()
    async with open_runtime_state(LINEAGE, folder):
        took = time.perf_counter() - t0
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10000,100000",
                    help="comma-separated admission counts (default 10000,100000)")
    ap.add_argument("--participants", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        folder = Path(tempfile.mkdtemp(prefix="aotx-bench-recovery-"))
        try:
            t0 = time.perf_counter()
            records = trio.run(fill, folder, n, args.participants)
            fill_s = time.perf_counter() - t0
            size = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
            times = [trio.run(recover, folder) for _ in range(args.rounds)]
            rows.append({"admissions": n, "records": records, "journal_bytes": size,
                         "fill_s": round(fill_s, 2),
                         "recovery_s_median": round(statistics.median(times), 4),
                         "recovery_s_best": round(min(times), 4),
                         "us_per_record": round(statistics.median(times) / records * 1e6, 2)})
            print(f"filled {n:,} admissions ({records:,} records) in {fill_s:.1f} s",
                  file=sys.stderr)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"{'admissions':>11} {'records':>9} {'journal MB':>10} {'recovery s':>11} "
          f"{'best s':>8} {'us/record':>9}")
    for r in rows:
        print(f"{r['admissions']:>11,} {r['records']:>9,} "
              f"{r['journal_bytes'] / 1e6:>10.1f} {r['recovery_s_median']:>11.3f} "
              f"{r['recovery_s_best']:>8.3f} {r['us_per_record']:>9.2f}")
    if len(rows) > 1:
        a, b = rows[0], rows[-1]
        print(f"recovery grows {b['recovery_s_median'] / a['recovery_s_median']:.1f}x for "
              f"{b['records'] / a['records']:.1f}x the records (flat would be 1.0x)")
    print(json.dumps({"rows": rows, "record_size": RECORD_SIZE}))


if __name__ == "__main__":
    main()
