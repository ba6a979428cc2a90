"""Time the CUDA decode kernels on the device (run by scripts/gpu_check after the GPU
tests): each product's weight bytes read per second, and the decode attention's K/V bytes
per second, against the H200's measured copy bandwidth (about 4.3 TB/s counting bytes read
and written; docs/engine.md, "CUDA").  Wall-clock over 20 launches after 3 warm-ups, one
synchronize at the end: numbers for planning the kernels' next steps, not a benchmark.

    python scripts/gpu_kernel_timing.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from aotx_trio.native import cuda

REPS = 20


def timed(dev: cuda.Device, launch: Callable[[], None]) -> float:
    """Seconds per launch."""
    for _ in range(3):
        launch()
    dev.sync()
    t0 = time.perf_counter()
    for _ in range(REPS):
        launch()
    dev.sync()
    return (time.perf_counter() - t0) / REPS


def weights(rng: np.random.Generator, t: int, rows: int, cols: int) -> np.ndarray:
    """Random blocks of type t with small finite fp16 scales (d, and dmin for Q4_K)."""
    block, size = (32, 34) if t == cuda.T_Q8_0 else (256, 144)
    nb = rows * cols // block
    raw = rng.integers(0, 256, (nb, size), dtype=np.uint8)
    scale = np.full(nb, 0.001, np.float16).view(np.uint8).reshape(nb, 2)
    raw[:, 0:2] = scale
    if t == cuda.T_Q4_K:
        raw[:, 2:4] = scale
    return raw.reshape(rows, -1)


def matvec_line(dev: cuda.Device, name: str, t: int, rows: int, cols: int, n_tok: int) -> str:
    rng = np.random.default_rng(0)
    w = weights(rng, t, rows, cols)
    wp = dev.upload(w)
    xp = dev.upload(rng.standard_normal((n_tok, cols)).astype(np.float32))
    act = dev.alloc(cuda.act_bytes(t, cols, n_tok))
    dev.quantize(t, xp, cols, n_tok, cols, act)
    y = dev.alloc(n_tok * rows * 4)
    s = timed(dev, lambda: dev.matvec(t, wp, rows, cols, act, n_tok, y, rows))
    return f"{name:34s} n_tok {n_tok}: {s * 1e6:8.1f} us  {w.nbytes / s / 1e9:7.1f} GB/s of weights"


def attention_line(dev: cuda.Device, n_seqs: int, ctx: int) -> str:
    """Gemma 3 270M's shape (4 query heads on 1 kv head of 256), f16 pages of 8 positions."""
    page_tokens, hd = 8, 256
    per_seq = ctx // page_tokens
    n_pages = n_seqs * per_seq
    page_elems = page_tokens * hd * 2
    mirror = np.zeros(4 * n_seqs + n_pages, np.int32)
    for i in range(n_seqs):
        mirror[4 * i:4 * i + 4] = [ctx, 0, 0, 4 * n_seqs + i * per_seq]
    mirror[4 * n_seqs:] = np.random.default_rng(1).permutation(n_pages)
    layout = {"page_elems": page_elems, "k_off": 0, "v_off": page_tokens * hd, "k_tok": hd,
              "v_tok": hd, "page_tokens": page_tokens, "elem_bytes": 2, "window": 0}
    pages = dev.alloc(n_pages * page_elems * 2)
    q = dev.upload(np.ones((n_seqs, 4, hd), np.float32))
    out = dev.alloc(n_seqs * 4 * hd * 4)
    mp = dev.upload(mirror)
    s = timed(dev, lambda: dev.attention_decode(
        n=n_seqs, n_heads=4, n_kv_heads=1, head_dim=hd, v_dim=hd, scale=0.0625, layout=layout,
        mirror=mp, pages=pages, q=q, out=out))
    kv_bytes = n_pages * page_elems * 2
    return (f"attention {n_seqs:3d} seqs x {ctx:5d} positions: {s * 1e6:8.1f} us  "
            f"{kv_bytes / s / 1e9:7.1f} GB/s of K/V")


def main() -> int:
    with cuda.Device() as dev:
        lines = [
            matvec_line(dev, "Q8_0 output head 262144 x 640", cuda.T_Q8_0, 262144, 640, 1),
            matvec_line(dev, "Q8_0 output head 262144 x 640", cuda.T_Q8_0, 262144, 640, 8),
            matvec_line(dev, "Q8_0 8192 x 8192", cuda.T_Q8_0, 8192, 8192, 1),
            matvec_line(dev, "Q4_K 8192 x 8192", cuda.T_Q4_K, 8192, 8192, 1),
            matvec_line(dev, "Q4_K 8192 x 8192", cuda.T_Q4_K, 8192, 8192, 8),
            attention_line(dev, 1, 4096),
            attention_line(dev, 32, 2048),
        ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
