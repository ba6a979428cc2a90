"""Float32 row products (csrc/engine/kernels/sgemm.c): the fast version equals the reference and
numpy on odd shapes, sub-ranges of rows and strided activations / outputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aotx_trio.native.lib import ffi, lib


def fbuf(a: np.ndarray) -> Any:
    return ffi.from_buffer("float[]", a)


@pytest.fixture(params=["avx2", "avx512"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the fast sgemm capped at one instruction-set level."""
    name = str(request.param)
    rc = lib.aotx_sgemm_force(name.encode())
    if rc == lib.AOTX_E_UNSUPPORTED:
        pytest.skip(f"this CPU does not run {name}")
    assert rc == 0
    assert ffi.string(lib.aotx_sgemm_impl()).decode() == name
    yield name
    assert lib.aotx_sgemm_force(b"auto") == 0


def sgemm(w: np.ndarray, x: np.ndarray, ldx: int, n_tok: int, ldy: int, r0: int, r1: int,
          ref: bool) -> np.ndarray:
    cols = w.shape[1]
    y = np.full(max(n_tok, 1) * ldy, 777.0, np.float32)
    fn = lib.aotx_sgemm_rows_ref if ref else lib.aotx_sgemm_rows
    fn(fbuf(w), cols, fbuf(x), ldx, n_tok, fbuf(y), ldy, r0, r1)
    return y.reshape(max(n_tok, 1), ldy)


SHAPES = [  # rows, cols, n_tok, r0, r1, extra ldx, extra ldy
    (1, 1, 1, 0, 1, 0, 0),
    (3, 7, 2, 0, 3, 1, 2),
    (17, 33, 5, 1, 16, 0, 1),
    (64, 384, 1, 0, 64, 0, 0),
    (37, 385, 17, 3, 37, 5, 4),
    (130, 100, 13, 0, 130, 3, 0),
    (9, 1536, 6, 2, 9, 0, 7),
    (48, 64, 33, 8, 40, 16, 0),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fast_ref_numpy(shape: tuple[int, ...], impl: str) -> None:
    rows, cols, n_tok, r0, r1, ex, ey = shape
    rng = np.random.default_rng(rows * 1000 + cols)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    ldx, ldy = cols + ex, rows + ey
    x = rng.standard_normal(n_tok * ldx).astype(np.float32)
    want = (w.astype(np.float64) @ x.reshape(n_tok, ldx)[:, :cols].astype(np.float64).T).T
    mag = (np.abs(w.astype(np.float64)) @ np.abs(x.reshape(n_tok, ldx)[:, :cols]).T).T
    for ref in (True, False):
        y = sgemm(w, x, ldx, n_tok, ldy, r0, r1, ref)
        got = y[:n_tok, r0:r1]
        assert np.all(np.abs(got - want[:, r0:r1]) <= 1e-5 * mag[:, r0:r1] + 1e-30), ref
        mask = np.ones(y.shape, bool)
        mask[:n_tok, r0:r1] = False
        assert np.all(y[mask] == 777.0)


def test_empty_ranges_write_nothing(impl: str) -> None:
    w = np.ones((4, 8), np.float32)
    x = np.ones(8, np.float32)
    for ref in (True, False):
        y = sgemm(w, x, 8, 1, 4, 2, 2, ref)
        assert np.all(y == 777.0)
        y = sgemm(w, x, 8, 0, 4, 0, 4, ref)
        assert np.all(y == 777.0)


def test_matmul_rows_f32_uses_sgemm(impl: str) -> None:
    rng = np.random.default_rng(1)
    w = rng.standard_normal((11, 70)).astype(np.float32)
    x = rng.standard_normal((3, 70)).astype(np.float32)
    act = np.zeros(lib.aotx_act_bytes(0, 70, 3), np.uint8)
    assert lib.aotx_act_prepare(0, fbuf(x), 70, 3, 70, ffi.from_buffer(act)) == 0
    y = np.zeros((3, 11), np.float32)
    assert lib.aotx_matmul_rows(0, ffi.from_buffer(w), 70, ffi.from_buffer(act), 3, fbuf(y), 11,
                                0, 11) == 0
    assert np.allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
