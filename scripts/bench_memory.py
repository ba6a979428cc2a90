"""Recall latency at a full memory table (issue 11, "Benchmarks").

Fills a device's memory table (``AOTX_MAX_MEMORY`` rows, 4096 by default: 2048
retained inputs with random unit 384-d embeddings, receipts retired as it goes),
then times ``aotx_device_memory_recall`` (the cosine scan, top 8) and one full
recall block as the executor builds it (scan + reading the recalled texts).

    PYTHONPATH=. .venv/bin/python scripts/bench_memory.py [--queries 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from aotx_trio import device as D
from aotx_trio import native
from aotx_trio.journal import Journal, JournalParams

L = "0123456789abcdef0123456789abcdef"
A = "a1" * 16
ALL = D.ALL_GRANTS


def _save(j: Journal) -> None:
    while j.drain() is not None:
        j.ack()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--queries", type=int, default=200)
    args = ap.parse_args()
    cap = native.capacities()["memory"]
    j = Journal(JournalParams(lineage=bytes.fromhex(L), max_pending_bytes=256 << 20))
    dev = D.Device(j, L)
    rng = np.random.default_rng(7)
    seq = 1

    def do(kind: D.Kind, **kw: object) -> D.Receipt:
        nonlocal seq
        r = dev.submit(ALL, A, D.Request(kind, L, f"{seq:032x}", seq, **kw))  # type: ignore[arg-type]
        seq += 1
        return r

    do(D.Kind.REGISTER)
    space = do(D.Kind.SPACE_CREATE).resource_id
    conv = do(D.Kind.CONVERSATION_CREATE, space=space).resource_id
    t0 = time.perf_counter()
    while dev.usage().memory + 2 <= cap:
        r = do(D.Kind.INPUT, conversation=conv, model="m",
               text=f"note {seq}: " + "x" * int(rng.integers(20, 400)))
        _save(j)
        v = rng.standard_normal(384).astype(np.float32)
        dev.memory_retain(r.op_id, v / np.linalg.norm(v))
        dev.complete(r.op_id, "succeeded", b"ok")
        if dev.usage().receipts > 900:
            _save(j)
            do(D.Kind.RETIRE, retry_floor=seq)
    _save(j)
    fill = time.perf_counter() - t0
    rows = dev.usage().memory
    scans, blocks = [], []
    for _ in range(args.queries):
        q = rng.standard_normal(384).astype(np.float32)
        t = time.perf_counter()
        got = dev.memory_recall(A, space, q, 8)
        scans.append(time.perf_counter() - t)
        t = time.perf_counter()
        for row, _ in got:
            dev.memory_read(ALL, A, space, row.object)
        blocks.append(scans[-1] + time.perf_counter() - t)
    ms = sorted(x * 1e3 for x in scans)
    print(f"memory rows: {rows} (capacity {cap}); filled in {fill:.1f} s")
    print(f"recall scan (top 8 of {rows // 2} embeddings x 384): "
          f"p50 {statistics.median(ms):.3f} ms, p99 {ms[int(len(ms) * 0.99) - 1]:.3f} ms")
    bl = sorted(x * 1e3 for x in blocks)
    print(f"scan + reading 8 texts: p50 {statistics.median(bl):.3f} ms")
    dev.close()


if __name__ == "__main__":
    main()
