"""Shared memory benchmarks (issue 11, "Benchmarks"): recall latency at a full memory
table, and retention throughput inside the runtime against the embedder alone.

    PYTHONPATH=. .venv/bin/python scripts/bench_memory.py [--queries 200]
    PYTHONPATH=. .venv/bin/python scripts/bench_memory.py --retention 256 [--clients 8]

**Recall** (default): fills a device's memory table (``AOTX_MAX_MEMORY`` rows, 4096 by
default: 2048 retained inputs whose 384-d unit embeddings lie in 256 clusters of 8,
receipts retired as it goes), then times, for queries near a random cluster (so about
8 memories pass the similarity floor and are read and rendered):

* ``aotx_device_memory_recall`` alone (the cosine scan, top 8);
* the executor's recall path, :func:`aotx_trio.runtime.memory.recall_block`, for an
  input of a fresh conversation of that space: the conversation and its history read,
  the scan, the recalled texts read, the block rendered; with one query (mode 1) and
  with two (mode 2: the input's embedding and the recall query's).

**Retention** (``--retention N``): the real runtime in-process (``boot.run_runtime``:
journal with fsync, emitter, executor; a tiny synthetic text model so generation costs
next to nothing, and the real all-MiniLM-L6-v2), ``--clients`` participants submitting
N inputs of short sentences in all (``mutation.submit``, each answered once its
admission is saved and its memory retained, ``max_output_tokens`` 1), against the
runtime's own embedder alone on the same sentences in the same process: one sentence
per call (as retention embeds) and in batches of 32 (``scripts/bench_embed.py``'s
figure); rounds interleaved, best of ``--rounds``; the ratios printed.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))

from aotx_trio.native import device as D  # noqa: E402
from aotx_trio.native import lib as native  # noqa: E402
from aotx_trio.native.journal import Journal, JournalParams  # noqa: E402
from aotx_trio.runtime import memory  # noqa: E402

L = "0123456789abcdef0123456789abcdef"
A = "a1" * 16
ALL = D.ALL_GRANTS


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _save(j: Journal) -> None:
    while j.drain() is not None:
        j.ack()


def _unit(v: np.ndarray) -> np.ndarray:
    return (v / np.linalg.norm(v)).astype(np.float32)


def recall_bench(queries: int) -> None:
    cap = native.capacities()["memory"]
    j = Journal(JournalParams(lineage=bytes.fromhex(L), max_pending_bytes=256 << 20))
    dev = D.Device(j, L)
    rng = np.random.default_rng(7)
    centers = [_unit(rng.standard_normal(384)) for _ in range(256)]
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
    k = 0
    while dev.usage().memory + 2 <= cap:
        r = do(D.Kind.INPUT, conversation=conv, model="m",
               text=f"note {seq}: " + "x" * int(rng.integers(20, 120)))
        _save(j)
        dev.memory_retain(r.op_id, _unit(centers[k % 256] + 0.5 * _unit(
            rng.standard_normal(384))))
        k += 1
        dev.complete(r.op_id, "succeeded", b"ok")
        if dev.usage().receipts > 900:
            _save(j)
            do(D.Kind.RETIRE, retry_floor=seq)
    fresh = do(D.Kind.CONVERSATION_CREATE, space=space).resource_id
    _save(j)
    fill = time.perf_counter() - t0
    rows = dev.usage().memory
    scans: list[float] = []
    block1: list[float] = []
    block2: list[float] = []
    cpu: dict[str, list[float]] = {"scan": [], "b1": [], "b2": []}
    lines: list[int] = []
    for _ in range(queries):
        c = centers[int(rng.integers(0, 256))]
        q = _unit(c + 0.5 * _unit(rng.standard_normal(384)))
        q2 = _unit(c + 0.5 * _unit(rng.standard_normal(384)))
        t, c0 = time.perf_counter(), time.thread_time()
        dev.memory_recall(A, space, q, memory.RECALL_ROWS)
        scans.append(time.perf_counter() - t)
        cpu["scan"].append(time.thread_time() - c0)
        t, c0 = time.perf_counter(), time.thread_time()
        block = memory.recall_block(dev, A, fresh, q, "00" * 16)
        block1.append(time.perf_counter() - t)
        cpu["b1"].append(time.thread_time() - c0)
        lines.append(block.count(b"\n- "))
        t, c0 = time.perf_counter(), time.thread_time()
        memory.recall_block(dev, A, fresh, (q, q2), "00" * 16)
        block2.append(time.perf_counter() - t)
        cpu["b2"].append(time.thread_time() - c0)
    print(f"memory rows: {rows} (capacity {cap}); filled in {fill:.1f} s; {queries} queries; "
          f"load average {os.getloadavg()[0]:.1f}")
    print("| measurement | wall p50 | wall p99 | CPU p50 | CPU p99 |")
    print("|---|---:|---:|---:|---:|")
    for name, xs, cs in (
            (f"device scan, top {memory.RECALL_ROWS} of {rows // 2} x 384", scans, cpu["scan"]),
            ("executor recall path, 1 query (mode 1)", block1, cpu["b1"]),
            ("executor recall path, 2 queries (mode 2)", block2, cpu["b2"])):
        print(f"| {name} | {statistics.median(xs) * 1e3:.3f} ms | {pct(xs, 0.99) * 1e3:.3f} ms "
              f"| {statistics.median(cs) * 1e3:.3f} ms | {pct(cs, 0.99) * 1e3:.3f} ms |")
    print(f"recalled lines per block: median {statistics.median(lines):.0f}, "
          f"min {min(lines)}, max {max(lines)}")
    dev.close()


# ---- retention inside the runtime -------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.", "A man is eating food.",
    "The weather is lovely today.", "How do I reset my password?",
    "She plays the piano beautifully.", "Stock markets fell sharply on Monday.",
    "This restaurant serves excellent pasta.", "Where is the nearest train station?",
]


async def retention_round(handler: Any, n: int, clients: int, base: int,
                          texts: list[str]) -> tuple[float, int]:
    """Sentences/s of ``n`` inputs retained through the handler by ``clients``
    participants at once (each makes a space and a conversation first, from sequence
    ``base``; 1: registers first), and the participants' next sequence."""
    from aotx_trio.service.client import InProcessClient

    client = InProcessClient(handler)
    lineage = handler.lineage
    acts = ["shared_read", "shared_write", "shared_manage"]

    def body(who: int, kind: str, seq: int, **f: Any) -> dict[str, Any]:
        return {"principal": f"p{who}", "actions": acts, "kind": kind,
                "body": {"schema": "aotx.shared.mutation.v1", "lineage": lineage,
                         "operation_key": f"{who:08x}{seq:024x}", "sequence": str(seq), **f}}

    cons = []
    for c in range(clients):
        seq = base
        if base == 1:
            await client.call("mutation.submit", body(c, "participant.register", 1))
            seq = 2
        space = (await client.call("mutation.submit",
                                   body(c, "space.create", seq)))["receipt"]["resource"]
        con = (await client.call("mutation.submit", body(
            c, "conversation.create", seq + 1, space=space)))["receipt"]["resource"]
        cons.append((con, seq + 2))
    per = n // clients
    before = handler.memory.retained
    runs = handler.memory.embed_runs

    async def one(c: int) -> None:
        con, seq = cons[c]
        for i in range(per):
            await client.call("mutation.submit", body(
                c, "input", seq + i, conversation=con, model="tiny.gguf", max_output_tokens=1,
                text=texts[(c * per + i) % len(texts)]))

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for c in range(clients):
            nursery.start_soon(one, c)
    wall = time.perf_counter() - t0
    assert handler.memory.retained - before == per * clients
    print(f"  round: {per * clients} retained in {wall:.2f} s, "
          f"{handler.memory.embed_runs - runs} encoder runs")
    return per * clients / wall, cons[0][1] + per


async def retention_bench(n: int, clients: int, rounds: int) -> None:
    import synth_gguf as sg
    from _gateway_env import TINY, make_config
    from _real import real_embedding_dir

    from aotx_trio.runtime import boot, pack

    folder = Path(tempfile.mkdtemp(prefix="aotx-bm-", dir="/tmp"))
    try:
        gguf = sg.write_model(folder / "tiny.gguf", TINY)
        ccir = folder / "runtime.aotxccir"
        pack.pack(ccir, models=[gguf], embedding=real_embedding_dir(), shared=True,
                  lineage=L, progress=False)
        make_config(folder, {f"p{c}": ["shared_read", "shared_write", "shared_manage"]
                             for c in range(clients)})
        texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(n)]
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(functools.partial(
                boot.run_runtime, ccir, folder / "journal", folder / "grants", socket=False))
            emb = handler.models.embedding.embedder
            threads = emb.threads
            alone1: list[float] = []
            alone32: list[float] = []
            service: list[float] = []
            base = 1
            emb.embed(texts[:8])                    # warm up
            for _ in range(rounds):
                t = time.perf_counter()
                for s in texts:
                    emb.embed([s])
                alone1.append(n / (time.perf_counter() - t))
                rate, base = await retention_round(handler, n, clients, base, texts)
                service.append(rate)
                t = time.perf_counter()
                emb.embed(texts, batch_size=32)
                alone32.append(n / (time.perf_counter() - t))
            nursery.cancel_scope.cancel()
        s, a1, a32 = max(service), max(alone1), max(alone32)
        print(f"{n} sentences (~12 tokens), {clients} clients, best of {rounds} interleaved "
              f"rounds, embedder threads {threads}; load average {os.getloadavg()[0]:.1f}")
        print("| side | sentences/s |")
        print("|---|---:|")
        print(f"| retention through the runtime (mutation.submit) | {s:.1f} |")
        print(f"| embedder alone, one sentence per call | {a1:.1f} |")
        print(f"| embedder alone, batches of 32 (bench_embed.py) | {a32:.1f} |")
        print(f"retention / embedder per call = {s / a1:.2f}; "
              f"retention / embedder batched = {s / a32:.2f}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--retention", type=int, default=0, metavar="N",
                    help="measure retention through the runtime with N inputs instead")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.retention:
        trio.run(retention_bench, args.retention, args.clients, args.rounds)
    else:
        recall_bench(args.queries)


if __name__ == "__main__":
    main()
