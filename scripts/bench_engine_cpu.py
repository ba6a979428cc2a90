#!/usr/bin/env python3
"""The engine's CPU cost on one thread, for A/B comparisons on a shared machine.

    AOTX_KERNELS=avx2 [AOTX_INVARIANT=1] [AOTX_NATIVE_DIR=build/x] \\
        .venv/bin/python scripts/bench_engine_cpu.py [--model GGUF] [--page-tokens 16]

One thread (the caller runs every share), timed by this thread's CPU clock
(time.thread_time), so other processes on the machine do not count while they hold
the core (they still share caches and memory bandwidth: run the two sides of an A/B
alternately, several times).  Prints one line: CPU ms of a 430-token prefill (best of
2), of one decode step after it (best block of 16 steps out of 4), of one batched step
of 8 sequences with 16+i-token prompts (best block of 8 steps out of 3), the kernel
path and the KV waste after the 8-sequence run.  Not a test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench_engine as B  # noqa: E402

from aotx_trio.engine import Engine  # noqa: E402
from aotx_trio.native import ffi, lib  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=B.DEFAULT)
    ap.add_argument("--page-tokens", type=int, default=16)
    a = ap.parse_args()
    with Engine.load(a.model, threads=1, max_seqs=8, max_batch_tokens=B.BATCH,
                     page_tokens=a.page_tokens) as eng:
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
    path = ffi.string(lib.aotx_kernel_impl(12)).decode()
    print(f"CPU ms, 1 thread: prefill {B.N_PROMPT} tokens {prefill * 1e3:.1f}, decode step "
          f"{decode * 1e3:.2f}, 8-sequence step {step8 * 1e3:.2f} "
          f"(8 seq / 1 seq per token {8 * decode / step8:.2f}x); kernels {path}; "
          f"KV waste {100 * waste:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
