"""Kernel throughput on the real model's shapes (Gemma 3 270M Q4_K_M + MiniLM F32; the
common types Q4_1 / Q5_1 / IQ4_NL / Q2_K / Q3_K / IQ4_XS on like shapes).

    AOTX_NATIVE_DIR=build/dev-kernels .venv/bin/python scripts/bench_kernels.py [--quick]
        [--types Q8_0,Q5_0 | --cases Q8_0:262144:8,Q8_0:8192:64,Q8P:262144:8]

Per type and shape: n_tok = 1 (decode: GB/s of weights streamed), the time of
n_tok = 2, 4, 8, 16 (batched decode) and 64 (prefill) as a multiple of the
n_tok = 1 time on the same rows, and GFLOP/s at n_tok = 8 and 64, for the
implementation aotx_matmul_rows picks (and the reference at n_tok = 1 on the
small shapes).  Then a whole decode step (every
layer's matrices + the tied Q8_0 output head, 1 and 2 threads) in ms/token.
Weights are random blocks with valid scales (same bytes per row as the model).
Case type Q8P: Q8_0 from the re-blocked copy the AVX2 path makes of the head at load.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from aotx_trio.native.lib import ffi, lib

T = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10,
     "Q3_K": 11, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ4_NL": 20, "IQ4_XS": 23, "BF16": 30}
SCALE_OFFS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
              "IQ4_NL": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2),
              "Q5_K": (0, 2), "Q6_K": (208,), "IQ4_XS": (0,)}

# (type, rows, cols, what)
SHAPES = [
    ("Q8_0", 262144, 640, "token_embd / output head"),
    ("Q8_0", 256, 640, "attn_v"),
    ("Q5_0", 1024, 640, "attn_q"),
    ("Q5_0", 2048, 640, "ffn_gate / ffn_up"),
    ("Q4_K", 640, 1024, "attn_output"),
    ("Q4_K", 640, 2048, "ffn_down (some layers)"),
    ("Q6_K", 640, 2048, "ffn_down"),
    ("Q4_0", 2048, 640, "(not in model)"),
    ("Q5_K", 640, 2048, "(not in model)"),
    # the common types' row kernels (no register tiles); Q4_1 at SmolLM2-135M's shapes
    ("Q4_1", 49152, 576, "SmolLM2 token_embd / head"),
    ("Q4_1", 1536, 576, "SmolLM2 ffn_gate / ffn_up"),
    ("Q4_1", 576, 1536, "SmolLM2 ffn_down"),
    ("Q5_1", 2048, 640, "(not in model)"),
    ("IQ4_NL", 2048, 640, "(not in model)"),
    ("Q2_K", 640, 2048, "(not in model)"),
    ("Q3_K", 640, 2048, "(not in model)"),
    ("IQ4_XS", 640, 2048, "(not in model)"),
    ("F16", 2048, 640, "(not in model)"),
    ("BF16", 2048, 640, "(not in model)"),
    ("F32", 1536, 384, "MiniLM ffn up"),
    ("F32", 384, 1536, "MiniLM ffn down"),
]


def make_weights(tname: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    t = T[tname]
    rb = int(lib.aotx_type_row_bytes(t, cols))
    if tname == "F32":
        return rng.standard_normal((rows, cols), np.float32).view(np.uint8)
    if tname in ("F16", "BF16"):
        bits = rng.integers(0x3000, 0x3c00, (rows, cols), dtype=np.uint16)
        return bits.view(np.uint8)
    bb = int(lib.aotx_type_block_bytes(t))
    raw = rng.integers(0, 256, rows * rb, dtype=np.uint8).reshape(-1, bb)
    for off in SCALE_OFFS[tname]:
        raw[:, off:off + 2] = np.array([0.01], np.float16).view(np.uint8)
    return raw.reshape(rows, rb)


class Mat:
    def __init__(self, tname: str, rows: int, cols: int, rng: np.random.Generator) -> None:
        self.t, self.rows, self.cols = T[tname], rows, cols
        self.w = make_weights(tname, rows, cols, rng)
        self.nbytes = self.w.nbytes
        self.wp = ffi.from_buffer(self.w)

    def prepare(self, n_tok: int, rng: np.random.Generator) -> tuple[Any, Any, np.ndarray]:
        x = rng.standard_normal((n_tok, self.cols), np.float32)
        act = np.zeros(int(lib.aotx_act_bytes(self.t, self.cols, n_tok)), np.uint8)
        assert lib.aotx_act_prepare(self.t, ffi.from_buffer("float[]", x), self.cols, n_tok,
                                    self.cols, ffi.from_buffer(act)) == 0
        y = np.zeros((n_tok, self.rows), np.float32)
        return ffi.from_buffer(act), ffi.from_buffer("float[]", y), act

    def run(self, act: Any, y: Any, n_tok: int, r0: int, r1: int, ref: bool = False) -> None:
        fn = lib.aotx_matmul_rows_ref if ref else lib.aotx_matmul_rows
        rc = fn(self.t, self.wp, self.cols, act, n_tok, y, self.rows, r0, r1)
        assert rc == 0


def best_time(fn: Callable[[], None], min_time: float, clock: Callable[[], float] = time.thread_time
              ) -> float:
    """Best of several runs.  Single-threaded runs count this thread's CPU time, so that
    other processes on the (shared, 2-core) machine do not inflate it; pass
    clock=time.perf_counter for multi-threaded runs."""
    fn()
    best, spent, n = float("inf"), 0.0, 0
    while spent < min_time or n < 3:
        t0 = clock()
        fn()
        dt = clock() - t0
        best, spent, n = min(best, dt), spent + dt, n + 1
    return best


NS = (2, 4, 8, 16, 64)  # batched decode (2..16) and prefill (64)


def bench_shapes(min_time: float, only: str | None) -> None:
    rng = np.random.default_rng(0)
    ratios = " ".join(f"{'x' + str(n):>5}" for n in NS)
    print("x<n> = time at n_tok = <n> / time at n_tok = 1 on the same rows (n = 64: at most "
          "8192 rows)")
    print(f"{'type':5} {'rows x cols':>13} {'impl':>10} {'MB':>7} {'n=1 GB/s':>9} "
          f"{'ref GB/s':>9} {ratios} {'n=8 GF/s':>9} {'n=64 GF/s':>9}  shape")
    for tname, rows, cols, what in SHAPES:
        if only and tname not in only.split(","):
            continue
        m = Mat(tname, rows, cols, rng)
        impl = ffi.string(lib.aotx_kernel_impl(m.t)).decode()
        act1, y1, _a1 = m.prepare(1, rng)
        t1 = best_time(partial(m.run, act1, y1, 1, 0, rows), min_time)
        gbs = m.nbytes / t1 / 1e9
        ref = "-"
        if m.nbytes < 4e6:
            tr = best_time(partial(m.run, act1, y1, 1, 0, rows, ref=True), min_time / 4)
            ref = f"{m.nbytes / tr / 1e9:.2f}"
        cols_out, gf8, gf64 = [], 0.0, 0.0
        for n in NS:
            # prefill: at most 8192 rows (the output head only ever sees the last token)
            pr = rows if n <= 16 else min(rows, 8192)
            actn, yn, _an = m.prepare(n, rng)
            tn = best_time(partial(m.run, actn, yn, n, 0, pr), min_time)
            cols_out.append(f"{tn / (t1 * pr / rows):5.2f}")
            gf = 2.0 * pr * cols * n / tn / 1e9
            gf8 = gf if n == 8 else gf8
            gf64 = gf if n == 64 else gf64
        print(f"{tname:5} {rows:>6} x {cols:<5} {impl:>10} {m.nbytes / 1e6:7.1f} {gbs:9.2f} "
              f"{ref:>9} {' '.join(cols_out)} {gf8:9.1f} {gf64:9.1f}  {what}", flush=True)


def bench_decode(min_time: float) -> None:
    """Every matrix of an 18-layer Gemma 3 270M decode step plus the output head."""
    rng = np.random.default_rng(1)
    layer = [("Q5_0", 1024, 640), ("Q5_0", 256, 640), ("Q8_0", 256, 640), ("Q4_K", 640, 1024),
             ("Q5_0", 2048, 640), ("Q5_0", 2048, 640), ("Q6_K", 640, 2048)]
    mats = [Mat(*spec, rng) for _ in range(18) for spec in layer]
    mats.append(Mat("Q8_0", 262144, 640, rng))
    preps = [m.prepare(1, rng) for m in mats]
    total = sum(m.nbytes for m in mats)

    def step(lo: float, hi: float) -> None:
        for m, (act, y, _) in zip(mats, preps, strict=True):
            m.run(act, y, 1, int(m.rows * lo), int(m.rows * hi))

    t1 = best_time(lambda: step(0.0, 1.0), min_time)
    with ThreadPoolExecutor(2) as pool:
        def two() -> None:
            # per matrix split, as a thread pool would (each half is one call)
            for m, (act, y, _) in zip(mats, preps, strict=True):
                h = m.rows // 2
                f = pool.submit(m.run, act, y, 1, 0, h)
                m.run(act, y, 1, h, m.rows)
                f.result()
        t2 = best_time(two, min_time, time.perf_counter)
    print(f"\ndecode step (18 layers + head, {total / 1e6:.0f} MB of weights): "
          f"1 thread {t1 * 1e3:.1f} ms CPU ({total / t1 / 1e9:.1f} GB/s), "
          f"2 threads {t2 * 1e3:.1f} ms wall ({total / t2 / 1e9:.1f} GB/s)")


def run_packed(pk: Any, act: Any, y: Any, n_tok: int, rows: int) -> None:
    assert lib.aotx_matmul_packed(8, pk, 640, act, n_tok, y, rows, 0, rows) == 0


def bench_cases(min_time: float, cases: str) -> None:
    """One line per TYPE:ROWS:N_TOK (640 columns): the best time on this thread's CPU
    clock, for A/B runs of two builds (AOTX_NATIVE_DIR) taken alternately."""
    rng = np.random.default_rng(1)
    for case in cases.split(","):
        tname, rows_s, n_s = case.split(":")
        rows, n_tok = int(rows_s), int(n_s)
        packed = tname == "Q8P"  # Q8_0 from the re-blocked copy (the AVX2 head at load)
        m = Mat("Q8_0" if packed else tname, rows, 640, rng)
        act, y, _keep = m.prepare(n_tok, rng)
        run = partial(m.run, act, y, n_tok, 0, rows)
        if packed:
            size = int(lib.aotx_packed_bytes(8, rows, 640))
            if size <= 0:
                raise SystemExit("Q8P: no re-blocked copy on this kernel path (AOTX_KERNELS=avx2)")
            pk = np.zeros(size, np.uint8)
            assert lib.aotx_pack(8, m.wp, rows, 640, 0, rows, ffi.from_buffer(pk)) == 0
            run = partial(run_packed, ffi.from_buffer(pk), act, y, n_tok, rows)
        dt = best_time(run, min_time)
        impl = ffi.string(lib.aotx_kernel_impl(m.t)).decode() + (" packed" if packed else "")
        print(f"{tname} {rows} x 640 n_tok={n_tok} {impl}: {dt * 1e3:.2f} ms, "
              f"{2 * rows * 640 * n_tok / dt / 1e9:.1f} GFLOP/s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", help="only these TYPE:ROWS:N_TOK cases (comma-separated, 640 "
                    "columns, e.g. Q8_0:262144:8), one line each")
    ap.add_argument("--quick", action="store_true", help="shorter timing loops")
    ap.add_argument("--types", help="only these types (comma-separated, e.g. Q8_0,Q5_0); "
                    "skips the decode step")
    args = ap.parse_args()
    min_time = 0.2 if args.quick else 0.6
    if args.cases:
        bench_cases(min_time, args.cases)
        return 0
    bench_shapes(min_time, args.types)
    if not args.types:
        bench_decode(min_time)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
