#!/usr/bin/env python3
"""The engine's CPU cost on one thread, for A/B comparisons on a shared machine.

    AOTX_KERNELS=avx2 [AOTX_INVARIANT=1] [AOTX_NATIVE_DIR=build/x] \\
        .venv/bin/python scripts/bench_engine_cpu.py [--model GGUF] [--page-tokens 8] [--kv-f32]
        [--vs-peer [--rounds 3]]

One thread (the caller runs every share), timed by this thread's CPU clock
(time.thread_time), so other processes on the machine do not count while they hold
the core (they still share caches and memory bandwidth: run the two sides of an A/B
alternately, several times).  Prints one line: CPU ms of a 430-token prefill (best of
2), of one decode step after it (best block of 16 steps out of 4), of one batched step
of 8 sequences with 16+i-token prompts (best block of 8 steps out of 3), the kernel
path and the KV waste after the 8-sequence run.  Not a test.

K/V pages are IEEE binary16 by default (the runtime's default for the text models
``aotx pack`` adds, and llama.cpp's default KV type, so ``--vs-peer`` compares like for
like); ``--kv-f32`` measures float32 pages (``--kv-f16``, the old opt-in, is accepted
and does nothing).  The first line of the output names the KV type.

``--vs-peer`` instead runs bench_engine.py's two children (ours, then llama.cpp's via
llama-cpp-python, which must be importable) with 1 thread each and their clocks on
process CPU time (time.perf_counter replaced by time.process_time), and prints each
rate in tokens per CPU second and the ratio: the llama.cpp comparison at a cost that
other processes on a shared machine do not inflate (they still share caches).  It runs
``--rounds N`` rounds (default 3) of the two children, the order alternating (ours then
the peer, the peer then ours, ...; the peer always runs our first child's token ids),
and prints for each measure the median of each side over the rounds, the ratio of the
two medians and the range (min-max) of the per-round ratios, with the load average
before and after.  One round is about 70 s on a 2-core VM.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_engine as B  # noqa: E402

from aotx_trio.native.engine import Engine  # noqa: E402
from aotx_trio.native.lib import ffi, lib  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=B.DEFAULT)
    ap.add_argument("--page-tokens", type=int, default=8)
    kv_type = ap.add_mutually_exclusive_group()
    kv_type.add_argument("--kv-f32", action="store_true",
                         help="float32 K/V pages (default: binary16, like llama.cpp)")
    kv_type.add_argument("--kv-f16", action="store_true",
                         help="binary16 K/V pages: the default, accepted for old command lines")
    ap.add_argument("--vs-peer", action="store_true", help="ours and llama.cpp, CPU time")
    ap.add_argument("--rounds", type=int, default=3,
                    help="--vs-peer: rounds of the two children, order alternating")
    ap.add_argument("--side", choices=("ours", "peer"), help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.side:
        time.perf_counter = time.process_time
        if a.side == "ours":
            r = B.child_ours(a.model, 1, a.page_tokens, not a.kv_f32)
        else:
            r = B.child_peer(a.model, 1, [int(x) for x in a.ids.split(",")])
        keep = ("prefill", "decode", "agg1", "agg4", "agg8", "ids", "kernels", "kv_type")
        print(json.dumps({k: r[k] for k in keep if k in r}))
        return 0
    if a.vs_peer:
        if a.rounds < 1:
            ap.error("--rounds must be at least 1")
        return vs_peer(a)
    with Engine.load(a.model, threads=1, max_seqs=8, max_batch_tokens=B.BATCH,
                     page_tokens=a.page_tokens, kv_f16=not a.kv_f32) as eng:
        ids = eng.tokenize(B.PROMPT)[:B.N_PROMPT]
        prefill = 1e9
        for rep in range(2):
            s = eng.add_sequence()
            t = time.thread_time()
            tok = eng.sample(s, eng.prefill(s, ids), 0)
            prefill = min(prefill, time.thread_time() - t)
            if rep == 0:
                eng.release(s)
        decode = 1e9
        for _ in range(4):
            t = time.thread_time()
            for _ in range(16):
                tok = eng.sample(s, eng.step([(s, [tok])]), 0)
            decode = min(decode, (time.thread_time() - t) / 16)
        eng.release(s)
        seqs = [eng.add_sequence() for _ in range(8)]
        toks = [eng.sample(q, eng.prefill(q, p), 0)
                for q, p in zip(seqs, B.multi_prompts(ids, 8), strict=True)]
        step8 = 1e9
        for _ in range(3):
            t = time.thread_time()
            for _ in range(8):
                res = eng.step([(q, [tk]) for q, tk in zip(seqs, toks, strict=True)])
                toks = [eng.sample(q, res, i) for i, q in enumerate(seqs)]
            step8 = min(step8, (time.thread_time() - t) / 8)
        waste = eng.kv_stats().waste
        kv = "f16" if eng.kv_stats().elem_bytes == 2 else "f32"
    path = ffi.string(lib.aotx_kernel_impl(12)).decode()
    print(f"CPU ms, 1 thread, KV {kv}: prefill {B.N_PROMPT} tokens {prefill * 1e3:.1f}, "
          f"decode step {decode * 1e3:.2f}, 8-sequence step {step8 * 1e3:.2f} "
          f"(8 seq / 1 seq per token {8 * decode / step8:.2f}x); kernels {path}; "
          f"KV waste {100 * waste:.1f}%, pages of {a.page_tokens}")
    return 0


MEASURES = (("prefill", f"prefill tok/CPU-s ({B.N_PROMPT}-token prompt)"),
            ("decode", "decode tok/CPU-s (after the prompt)"),
            ("agg1", "aggregate tok/CPU-s, 1 sequence"),
            ("agg4", "aggregate tok/CPU-s, 4 sequences"),
            ("agg8", "aggregate tok/CPU-s, 8 sequences"))


def loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def vs_peer(a: argparse.Namespace) -> int:
    def side(name: str, ids: list[int] | None) -> dict[str, object]:
        argv = [sys.executable, str(Path(__file__).resolve()), "--side", name, "--model",
                str(a.model), "--page-tokens", str(a.page_tokens)]
        if a.kv_f32:
            argv.append("--kv-f32")
        if ids is not None:
            argv += ["--ids", ",".join(map(str, ids))]
        env = {"OPENBLAS_NUM_THREADS": "1", **os.environ}
        p = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=900,
                           env=env)
        if p.returncode != 0:
            raise SystemExit(f"{name} failed: {(p.stderr or p.stdout).strip()[-400:]}")
        doc: dict[str, object] = json.loads(p.stdout.strip().splitlines()[-1])
        return doc

    kv = "f32" if a.kv_f32 else "f16"
    print(f"loadavg before: {loadavg()}", flush=True)
    ours: list[dict[str, object]] = []
    peer: list[dict[str, object]] = []
    ids: list[int] | None = None
    for rnd in range(a.rounds):
        # round 1 runs ours first (the peer takes its token ids); then the order alternates
        for name in (("peer", "ours") if rnd % 2 else ("ours", "peer")):
            if name == "ours":
                ours.append(side("ours", None))
                if ids is None:
                    got = ours[-1]["ids"]
                    assert isinstance(got, list)
                    ids = got
            else:
                peer.append(side("peer", ids))
        print(f"round {rnd + 1} of {a.rounds} done ({'peer, ours' if rnd % 2 else 'ours, peer'})"
              f", loadavg {loadavg()}", flush=True)

    def val(r: dict[str, object], k: str) -> float:
        return float(str(r[k]))

    print(f"1 thread each, rates per CPU second, {a.rounds} rounds (order alternating); KV "
          f"aotx {ours[0].get('kv_type', kv)} / llama.cpp {peer[0].get('kv_type', 'f16')};"
          f" AOTX_KERNELS={os.environ.get('AOTX_KERNELS', 'auto')}, AOTX_INVARIANT="
          f"{os.environ.get('AOTX_INVARIANT', 'unset')}; aotx kernels {ours[0].get('kernels')};"
          f" cpu flags {B.cpu_flags()}")
    print("| measure | aotx (median) | llama.cpp (median) | ratio of medians "
          "| per-round ratios min-max |")
    print("|---|---:|---:|---:|---|")
    for k, label in MEASURES:
        o = [val(r, k) for r in ours]
        q = [val(r, k) for r in peer]
        mo, mq = statistics.median(o), statistics.median(q)
        per = [x / y for x, y in zip(o, q, strict=True)]
        print(f"| {label} | {mo:.1f} | {mq:.1f} | {mo / mq:.2f}x "
              f"| {min(per):.2f}-{max(per):.2f}x |")
    o8 = [val(r, "agg8") / val(r, "agg1") for r in ours]
    q8 = [val(r, "agg8") / val(r, "agg1") for r in peer]
    print(f"| 8 sequences / 1 sequence (each side, median of the rounds) "
          f"| {statistics.median(o8):.2f}x | {statistics.median(q8):.2f}x | | |")
    print(f"loadavg after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
