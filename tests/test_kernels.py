"""Tensor kernels (csrc/engine/kernels/quant.c, quant_x86.c): dequantization equals gguf-py bit for
bit, fast matmul kernels equal the reference (same integer sums, float order only), the
reference equals numpy on dequantized data, and the real model's tensors decode like gguf-py.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _real import real_gguf
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as GT

from aotx_trio.native.lib import ffi, lib

MODEL = real_gguf()

# type -> (block elements, block bytes, byte offsets of fp16 scale fields)
LAYOUT: dict[GT, tuple[int, int, tuple[int, ...]]] = {
    GT.F32: (1, 4, ()),
    GT.F16: (1, 2, ()),
    GT.BF16: (1, 2, ()),
    GT.Q4_0: (32, 18, (0,)),
    GT.Q4_1: (32, 20, (0, 2)),
    GT.Q5_0: (32, 22, (0,)),
    GT.Q5_1: (32, 24, (0, 2)),
    GT.Q8_0: (32, 34, (0,)),
    GT.IQ4_NL: (32, 18, (0,)),
    GT.Q2_K: (256, 84, (80, 82)),
    GT.Q3_K: (256, 110, (108,)),
    GT.Q4_K: (256, 144, (0, 2)),
    GT.Q5_K: (256, 176, (0, 2)),
    GT.Q6_K: (256, 210, (208,)),
    GT.IQ4_XS: (256, 136, (0,)),
}
# the types without register tiles or re-blocked copies: row kernels on every path
NEW_TYPES = [GT.Q4_1, GT.Q5_1, GT.IQ4_NL, GT.Q2_K, GT.Q3_K, GT.IQ4_XS]
QUANT_TYPES = [GT.Q4_0, GT.Q5_0, GT.Q8_0, GT.Q4_K, GT.Q5_K, GT.Q6_K, *NEW_TYPES]
ALL_TYPES = [GT.F32, GT.F16, GT.BF16, *QUANT_TYPES]
GGUF_QUANTIZES = {GT.F16, GT.BF16, GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0}
# weight types multiplied against the Q8_0-family activations (the others of QUANT_TYPES:
# Q8_K32)
Q8_FAMILY = {GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.IQ4_NL}
UNSUPPORTED = 16  # IQ2_XXS: a ggml type with no kernel here

# our k-quant activation layout (aotx_block_q8_k32): Q8_K's quants and 16-sums, one scale
# per 32 values, and the mins' term dm[j] = d[j] * (sum of the 32 quants)
ACT_Q8_K32 = np.dtype([("qs", "i1", (256,)), ("d", "<f4", (8,)), ("dm", "<f4", (8,)),
                       ("bsums", "<i2", (16,))])


def fbuf(a: np.ndarray) -> Any:
    return ffi.from_buffer("float[]", a)


def block_elems(t: GT) -> int:
    return LAYOUT[t][0]


def random_bytes_blocks(t: GT, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks of random bytes whose fp16 scale fields hold finite values."""
    _, bb, offs = LAYOUT[t]
    if t == GT.F32:
        return rng.standard_normal(n_blocks).astype(np.float32).view(np.uint8)
    if t == GT.F16:  # every finite bit pattern: normals, subnormals, zeros
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7C00) == 0x7C00] &= 0xBFFF
        return bits.view(np.uint8)
    if t == GT.BF16:
        bits = rng.integers(0, 1 << 16, n_blocks, dtype=np.uint32).astype(np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= 0xBFFF
        return bits.view(np.uint8)
    raw = rng.integers(0, 256, (n_blocks, bb), dtype=np.uint16).astype(np.uint8)
    for off in offs:
        scale = (rng.uniform(-0.02, 0.02, n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def weights(t: GT, rows: int, cols: int, rng: np.random.Generator, mode: str) -> np.ndarray:
    """W[rows][cols] in type t as a uint8 array [rows, row_bytes]."""
    if mode == "quantize" and t in GGUF_QUANTIZES:
        data = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05, t)
        return np.ascontiguousarray(data).view(np.uint8).reshape(rows, -1)
    if t in (GT.F32, GT.F16, GT.BF16) and mode == "quantize":
        x = rng.standard_normal((rows, cols)).astype(np.float32)
        return np.ascontiguousarray(quants.quantize(x, t)).view(np.uint8).reshape(rows, -1)
    n_blocks = rows * cols // block_elems(t)
    return random_bytes_blocks(t, n_blocks, rng).reshape(rows, -1)


def dequant(t: GT, src: np.ndarray, ref: bool) -> np.ndarray:
    n = src.size * block_elems(t) // LAYOUT[t][1]
    out = np.empty(n, np.float32)
    fn = lib.aotx_dequant_row_ref if ref else lib.aotx_dequant_row
    src = np.ascontiguousarray(src)
    assert fn(int(t), ffi.from_buffer(src), fbuf(out), n) == 0
    return out


def gguf_dequant(t: GT, src: np.ndarray) -> np.ndarray:
    return np.asarray(quants.dequantize(np.ascontiguousarray(src), t), np.float32).reshape(-1)


def prepare(t: GT, x: np.ndarray) -> np.ndarray:
    n_tok, cols = x.shape
    size = lib.aotx_act_bytes(int(t), cols, n_tok)
    assert size >= 0
    act = np.zeros(max(size, 1), np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    assert lib.aotx_act_prepare(int(t), fbuf(x), cols, n_tok, cols,
                                ffi.from_buffer(act)) == 0
    return act[:size]


def act_dequant(t: GT, act: np.ndarray, n_tok: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """(X as the kernels see it, per-element half-step of its quantization)."""
    if t in (GT.F32, GT.F16, GT.BF16):
        x = act.view(np.float32).reshape(n_tok, cols)
        return x, np.zeros_like(x)
    if t in Q8_FAMILY:
        qs, d = act8_blocks(act, n_tok, cols)
    else:
        blocks = act.view(ACT_Q8_K32).reshape(n_tok, cols // 256)
        qs = blocks["qs"].reshape(n_tok, cols // 32, 32)
        d = blocks["d"].reshape(n_tok, cols // 32)
    dd = d[..., None].astype(np.float32)
    xq = (dd * qs.astype(np.float32)).reshape(n_tok, cols)
    return xq, np.broadcast_to(dd / 2, qs.shape).reshape(n_tok, cols)


def act8_blocks(act: np.ndarray, n_tok: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0-family activations: 128-byte pairs of blocks (64 quants + 128, 16 per-lane
    scales) -> (x_q [n_tok][nb][32] int, d [n_tok][nb]); checks the layout's invariants."""
    nb = cols // 32
    pairs = (nb + 1) // 2
    raw = act.reshape(n_tok, pairs, 128)
    xq = raw[..., :64].reshape(n_tok, 2 * pairs, 32).astype(np.int32) - 128
    dx = np.ascontiguousarray(raw[..., 64:]).view(np.float32).reshape(n_tok, 2 * pairs, 8)
    assert np.all(dx == dx[..., :1])  # the scale repeated in each of 8 lanes
    assert np.all(np.abs(xq) <= 127)
    if nb % 2:  # padding block: zero quants, zero scale
        assert np.all(xq[:, nb:] == 0) and np.all(dx[:, nb:] == 0)
    return xq[:, :nb], dx[:, :nb, 0]


def matmul(t: GT, w: np.ndarray, cols: int, act: np.ndarray, n_tok: int, rows: int,
           r0: int, r1: int, ldy: int, ref: bool) -> np.ndarray:
    y = np.full(max(n_tok, 1) * ldy, 12345.0, np.float32)
    fn = lib.aotx_matmul_rows_ref if ref else lib.aotx_matmul_rows
    w = np.ascontiguousarray(w)
    rc = fn(int(t), ffi.from_buffer(w), cols, ffi.from_buffer(act), n_tok,
            fbuf(y), ldy, r0, r1)
    assert rc == 0
    return y.reshape(max(n_tok, 1), ldy)


@pytest.fixture(params=["avx2", "avx512vnni"])
def impl(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test with the fast kernels capped at one instruction-set level."""
    name = str(request.param)
    rc = lib.aotx_kernel_force(name.encode())
    if rc == lib.AOTX_E_UNSUPPORTED:
        pytest.skip(f"this CPU does not run {name}")
    assert rc == 0
    yield name
    assert lib.aotx_kernel_force(b"auto") == 0


def impl_name(t: GT, level: str) -> str:
    """The kernel aotx_matmul_rows runs for type t with the kernels capped at `level`."""
    if t == GT.F32:
        return "avx2" if level == "avx2" else "avx512"
    return level


def check_untouched(y: np.ndarray, n_tok: int, r0: int, r1: int) -> None:
    mask = np.ones(y.shape, bool)
    mask[:n_tok, r0:r1] = False
    assert np.all(y[mask] == 12345.0)


# ------------------------------------------------------------------ layout and types


def test_type_sizes_match_gguf() -> None:
    for t in ALL_TYPES:
        be, bb, _ = LAYOUT[t]
        assert GGML_QUANT_SIZES[t] == (be, bb)
        assert lib.aotx_type_block_elems(int(t)) == be
        assert lib.aotx_type_block_bytes(int(t)) == bb
        assert lib.aotx_type_row_bytes(int(t), be * 3) == bb * 3
    assert lib.aotx_type_block_bytes(int(GT.Q8_K)) == 292
    assert lib.aotx_type_block_elems(UNSUPPORTED) == 0
    assert lib.aotx_type_row_bytes(UNSUPPORTED, 256) == lib.AOTX_E_KERNEL_TYPE
    assert lib.aotx_type_row_bytes(int(GT.Q4_K), 255) == lib.AOTX_E_KERNEL_SHAPE
    assert lib.aotx_type_row_bytes(int(GT.Q8_0), -32) == lib.AOTX_E_INVALID_ARGUMENT


def test_refusals_have_codes() -> None:
    x = np.zeros((1, 64), np.float32)
    act = prepare(GT.Q8_0, x)
    w = np.zeros(68, np.uint8)
    y = np.zeros(4, np.float32)
    args = (ffi.from_buffer(w), 64, ffi.from_buffer(act), 1, fbuf(y), 4)
    assert lib.aotx_matmul_rows(UNSUPPORTED, *args, 0, 1) == lib.AOTX_E_KERNEL_TYPE
    assert lib.aotx_matmul_rows(int(GT.Q8_K), *args, 0, 1) == lib.AOTX_E_KERNEL_TYPE
    assert lib.aotx_matmul_rows(int(GT.Q8_0), ffi.from_buffer(w), 48, ffi.from_buffer(act), 1,
                                fbuf(y), 4, 0, 1) == lib.AOTX_E_KERNEL_SHAPE
    assert lib.aotx_matmul_rows(int(GT.Q8_0), *args, 1, 0) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_matmul_rows(int(GT.Q8_0), ffi.from_buffer(w), 64, ffi.from_buffer(act), 2,
                                fbuf(y), 1, 0, 2) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_act_bytes(int(GT.Q4_K), 100, 1) == lib.AOTX_E_KERNEL_SHAPE
    assert lib.aotx_act_prepare(int(GT.Q8_0), fbuf(x), 32, 1, 64,
                                ffi.from_buffer(act)) == lib.AOTX_E_INVALID_ARGUMENT
    out = np.zeros(32, np.float32)
    assert lib.aotx_dequant_row(int(GT.Q8_0), ffi.from_buffer(w), fbuf(out), 31) \
        == lib.AOTX_E_KERNEL_SHAPE
    assert ffi.string(lib.aotx_code_name(lib.AOTX_E_KERNEL_TYPE)) == b"kernel_type_unsupported"
    assert ffi.string(lib.aotx_code_name(lib.AOTX_E_KERNEL_SHAPE)) == b"kernel_shape_invalid"


def test_impl_names() -> None:
    for t in ALL_TYPES:
        name = ffi.string(lib.aotx_kernel_impl(int(t))).decode()
        assert name in ("ref", "avx2", "avx512", "avx512vnni")
    assert ffi.string(lib.aotx_kernel_impl(UNSUPPORTED)) == b"none"


def test_type_names() -> None:
    """ggml's names by number (the model loader's refusals name the type), and the list of
    the types the kernels run: exactly those with a block size here."""
    for t in GT:
        name = lib.aotx_type_name(int(t))
        assert name != ffi.NULL and ffi.string(name).decode() == t.name
    assert lib.aotx_type_name(4) == ffi.NULL and lib.aotx_type_name(-1) == ffi.NULL
    listed = ffi.string(lib.aotx_kernel_types()).decode().split(", ")
    assert sorted(listed) == sorted(t.name for t in ALL_TYPES)
    for t in GT:
        assert (lib.aotx_kernel_impl(int(t)) != ffi.NULL and
                ffi.string(lib.aotx_kernel_impl(int(t))) != b"none") == (t in ALL_TYPES)


# ------------------------------------------------------------------ dequantization


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("mode", ["quantize", "random"])
def test_dequant_equals_gguf_py(t: GT, mode: str, impl: str) -> None:
    name = ffi.string(lib.aotx_dequant_impl(int(t))).decode()
    assert name == ("avx512vnni" if impl != "avx2" and t != GT.F32 else "ref")
    rng = np.random.default_rng([int(t), len(mode)])
    be = block_elems(t)
    for n_blocks in (1, 2, 3, 7, 16):
        cols = max(be * n_blocks, 64) if be == 1 else be * n_blocks
        w = weights(t, 3, cols, rng, mode)
        want = gguf_dequant(t, w)
        for ref in (True, False):
            got = dequant(t, w, ref)
            assert got.shape == want.shape
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (t.name, ref)


# ------------------------------------------------------------------ activations


@pytest.mark.parametrize("t", [GT.Q4_0, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q6_K, GT.IQ4_XS, GT.F16],
                         ids=lambda t: t.name)
def test_act_prepare_quantizes_each_block(t: GT) -> None:
    rng = np.random.default_rng(7)
    # Q5_0 / Q5_1: an odd block count
    cols, n_tok = 512 + (96 if t in (GT.Q5_0, GT.Q5_1) else 0), 3
    x = rng.standard_normal((n_tok, cols)).astype(np.float32) * 3
    x[1, :] = 0.0  # an all-zero row quantizes to d = 0
    act = prepare(t, x)
    xq, half = act_dequant(t, act, n_tok, cols)
    assert np.all(np.abs(xq - x) <= half * (1 + 1e-5) + 1e-30)
    if t in Q8_FAMILY:
        xq8, _ = act8_blocks(act, n_tok, cols)
        assert np.abs(xq8).max() == 127
    elif t in (GT.Q6_K, GT.IQ4_XS):
        blocks = act.view(ACT_Q8_K32)
        sums = blocks["qs"].astype(np.int32).reshape(-1, 16, 16).sum(axis=2)
        assert np.array_equal(blocks["bsums"], sums)
        # each 32 values quantized on its own: its largest quant is +-127 (or all zero)
        q32 = np.abs(blocks["qs"].astype(np.int32)).reshape(-1, 8, 32).max(axis=2)
        assert np.all((q32 == 127) | (blocks["d"] == 0))
        s32 = sums.reshape(-1, 8, 2).sum(axis=2).astype(np.float32)
        assert np.array_equal(blocks["dm"], (blocks["d"] * s32).astype(np.float32))
    else:
        assert np.array_equal(xq, x)


@pytest.mark.parametrize("t", [GT.Q8_0, GT.Q4_K], ids=lambda t: t.name)
def test_fast_act_prepare_equals_reference_bytes(t: GT, impl: str) -> None:
    rng = np.random.default_rng(9)
    for cols in (256, 768, 2048):
        x = rng.standard_normal((5, cols)).astype(np.float32) * np.float32(10.0) ** rng.integers(
            -3, 4, (5, 1))
        x[0] = 0.0
        x[1, :: 3] = 0.0
        x[2, 5] = 1e6  # one dominant element per block row
        fast = prepare(t, x)
        assert lib.aotx_kernel_force(b"ref") == 0
        ref = prepare(t, x)
        assert lib.aotx_kernel_force(impl.encode()) == 0
        assert np.array_equal(fast, ref)
        # one prepared activation serves every weight type of the family
        for other in (sorted(Q8_FAMILY - {t}) if t == GT.Q8_0 else
                      [GT.Q2_K, GT.Q3_K, GT.Q5_K, GT.Q6_K, GT.IQ4_XS]):
            assert np.array_equal(prepare(other, x), fast)


# ------------------------------------------------------------------ matrix products


def magnitude(wd: np.ndarray, xd: np.ndarray) -> np.ndarray:
    """|W| @ |X|^T in float64: the scale float rounding errors are measured against."""
    return np.abs(wd.astype(np.float64)) @ np.abs(xd.astype(np.float64)).T


def run_case(t: GT, rows: int, n_blocks: int, n_tok: int, r0: int, r1: int, seed: int,
             impl: str, mode: str = "random") -> None:
    assert ffi.string(lib.aotx_kernel_impl(int(t))).decode() == impl_name(t, impl)
    rng = np.random.default_rng(seed)
    be = block_elems(t)
    cols = be * n_blocks if be > 1 else n_blocks
    if be == 1:
        mode = "quantize"  # float weights: normal values (random bits overflow)
    w = weights(t, rows, cols, rng, mode)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    act = prepare(t, x)
    ldy = rows + 3
    y_ref = matmul(t, w, cols, act, n_tok, rows, r0, r1, ldy, ref=True)
    y_fast = matmul(t, w, cols, act, n_tok, rows, r0, r1, ldy, ref=False)
    check_untouched(y_ref, n_tok, r0, r1)
    check_untouched(y_fast, n_tok, r0, r1)
    wd = gguf_dequant(t, w).reshape(rows, cols)
    xd, half = act_dequant(t, act, n_tok, cols)
    mag = magnitude(wd, xd).T[:, r0:r1]  # [n_tok][r1-r0]
    got_ref = y_ref[:n_tok, r0:r1].astype(np.float64)
    got_fast = y_fast[:n_tok, r0:r1].astype(np.float64)
    # fast == ref: same integer sums, only float rounding order differs
    assert np.all(np.abs(got_fast - got_ref) <= 1e-5 * mag + 1e-30), (t.name, "fast vs ref")
    # ref == dequantized W times dequantized X (float64)
    exact = (wd.astype(np.float64) @ xd.astype(np.float64).T).T[:, r0:r1]
    assert np.all(np.abs(got_ref - exact) <= 2e-5 * mag + 1e-30), (t.name, "ref vs numpy")
    # and within quantization tolerance of the unquantized activations
    full = (wd.astype(np.float64) @ x.astype(np.float64).T).T[:, r0:r1]
    bound = (np.abs(wd.astype(np.float64)) @ half.astype(np.float64).T).T[:, r0:r1]
    assert np.all(np.abs(got_ref - full) <= bound * 1.001 + 2e-5 * mag + 1e-30)


SHAPES = [  # rows, blocks per row, n_tok, r0, r1
    (1, 1, 1, 0, 1),
    (5, 1, 2, 0, 5),
    (13, 3, 3, 2, 11),
    (37, 2, 5, 0, 37),
    (19, 5, 17, 4, 19),
    (33, 4, 1, 1, 32),
    (8, 7, 4, 0, 8),
    (70, 2, 9, 3, 67),
    (5, 131, 3, 0, 5),  # long rows: past the buffered-row limit of the Q8_0 family
]


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matmul_fast_ref_numpy(t: GT, shape: tuple[int, int, int, int, int], impl: str) -> None:
    rows, nb, n_tok, r0, r1 = shape
    if block_elems(t) == 1:
        nb = nb * 32 + 5  # float types: odd column counts
    run_case(t, rows, nb, n_tok, r0, r1, seed=rows * 131 + nb, impl=impl)


@pytest.mark.parametrize("t", QUANT_TYPES, ids=lambda t: t.name)
def test_matmul_every_n_tok(t: GT, impl: str) -> None:
    """Batched decode sizes 1..17 (the Q8_0 family's n_tok > 1 path: register tiles of 16
    rows x 8 tokens) on row ranges that start and end inside a 16-row tile."""
    nb = 5 if block_elems(t) == 32 else 2
    for n_tok in range(1, 18):
        rows, r0, r1 = (37, 3, 35) if n_tok % 2 else (21, 0, 21)
        run_case(t, rows, nb, n_tok, r0, r1, seed=1000 + n_tok, impl=impl)


@pytest.mark.parametrize("t", [GT.Q4_0, GT.Q5_0, GT.Q8_0, GT.Q4_1, GT.Q5_1, GT.IQ4_NL],
                         ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [
    (16, 20, 8, 0, 16),    # one full tile, the model's 640 columns
    (50, 20, 16, 17, 18),  # one row in the middle
    (40, 20, 2, 33, 40),   # the last rows of the matrix only (a partial tile)
    (41, 70, 9, 5, 38),    # 3 K slabs of <= 32 blocks: later slabs add into y
    (23, 33, 45, 0, 23),   # 2 K slabs x 3 token slabs (the activation copy's capacity)
    (18, 1, 64, 1, 17),    # a single block per row, prefill-sized n_tok
], ids=lambda s: "x".join(map(str, s)))
def test_matmul_q8fam_tiles(t: GT, shape: tuple[int, int, int, int, int], impl: str) -> None:
    rows, nb, n_tok, r0, r1 = shape
    run_case(t, rows, nb, n_tok, r0, r1, seed=rows * 7 + nb, impl=impl)


@pytest.mark.parametrize("t", [GT.Q4_K, GT.Q6_K, GT.Q5_K], ids=lambda t: t.name)
@pytest.mark.parametrize("shape", [
    (16, 4, 8, 0, 16),     # one full tile, the model's 1024 columns
    (50, 1, 16, 17, 18),   # one row in the middle
    (40, 3, 2, 33, 40),    # the last rows of the matrix only (a partial tile)
    (21, 9, 10, 2, 19),    # 2 scale slabs of <= 8 super-blocks; y accumulates per block
    (18, 2, 64, 1, 17),    # prefill-sized n_tok
], ids=lambda s: "x".join(map(str, s)))
def test_matmul_kquant_tiles(t: GT, shape: tuple[int, int, int, int, int], impl: str) -> None:
    rows, nb, n_tok, r0, r1 = shape
    run_case(t, rows, nb, n_tok, r0, r1, seed=rows * 5 + nb, impl=impl)


def extreme_bytes(t: GT, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """n_blocks random blocks of type t with every quant byte at an extreme: Q8_0 -128 /
    127 / -127 / 1; Q4_0 / Q5_0 nibbles 0 / 15 (random Q5_0 fifth bits); k-quants bytes
    0x00 / 0xFF (quants, scales, mins), Q6_K's int8 scales -128 / 127.  Scale fields are
    random too: callers set or keep them."""
    _, bb, _ = LAYOUT[t]
    if t in (GT.Q4_K, GT.Q6_K):
        raw = rng.choice(np.array((0x00, 0xFF), np.uint8), (n_blocks, bb))
        if t == GT.Q6_K:
            raw[:, 192:208] = rng.choice(np.array((0x80, 0x7F), np.uint8), (n_blocks, 16))
        return raw
    fill = (0x80, 0x7F, 0x81, 0x01) if t == GT.Q8_0 else (0x00, 0xFF, 0xF0, 0x0F)
    return rng.choice(np.array(fill, np.uint8), (n_blocks, bb))


def test_matmul_kquant_tiles_extreme_quants(impl: str) -> None:
    """Quants, scales and mins at their extremes against activations at +-127."""
    rng = np.random.default_rng(22)
    rows, cols, n_tok = 17, 512, 9
    x = np.where(rng.random((n_tok, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
    for t in (GT.Q4_K, GT.Q6_K):
        act = prepare(t, x)
        _, _, offs = LAYOUT[t]
        raw = extreme_bytes(t, rows * cols // 256, rng)
        for off in offs:
            raw[:, off:off + 2] = np.array([0.5], np.float16).view(np.uint8)
        w = raw.reshape(rows, -1)
        y_ref = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
        y_fast = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
        wd = gguf_dequant(t, w).reshape(rows, cols)
        xd, _ = act_dequant(t, act, n_tok, cols)
        exact = (wd.astype(np.float64) @ xd.astype(np.float64).T).T
        mag = magnitude(wd, xd).T
        assert np.all(np.abs(y_fast - exact) <= 2e-5 * mag + 1e-30), t.name
        assert np.all(np.abs(y_fast - y_ref) <= 1e-5 * mag + 1e-30), t.name


def test_matmul_q8fam_tiles_extreme_quants(impl: str) -> None:
    """Weights at the int8 / nibble extremes (-128 for Q8_0: w xor 0x80 = 0) and
    activations at +-127: the integer sums must stay exact."""
    rng = np.random.default_rng(21)
    rows, cols, n_tok = 19, 96, 11
    x = np.where(rng.random((n_tok, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
    act = prepare(GT.Q8_0, x)
    for t, fill in ((GT.Q8_0, (0x80, 0x7F)), (GT.Q4_0, (0x00, 0xFF)), (GT.Q5_0, (0x00, 0xFF)),
                    (GT.Q4_1, (0x00, 0xFF)), (GT.Q5_1, (0x00, 0xFF)),
                    (GT.IQ4_NL, (0x00, 0xFF))):
        _, bb, offs = LAYOUT[t]
        raw = rng.choice(np.array(fill, np.uint8), (rows * cols // 32, bb))
        for off in offs:
            raw[:, off:off + 2] = np.array([0.5], np.float16).view(np.uint8)
        w = raw.reshape(rows, -1)
        y_ref = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
        y_fast = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
        wd = gguf_dequant(t, w).reshape(rows, cols)
        xd, _ = act_dequant(t, act, n_tok, cols)
        exact = (wd.astype(np.float64) @ xd.astype(np.float64).T).T
        mag = magnitude(wd, xd).T
        assert np.all(np.abs(y_fast - exact) <= 1e-5 * mag + 1e-30), t.name
        assert np.all(np.abs(y_fast - y_ref) <= 1e-5 * mag + 1e-30), t.name


def new_type_extremes(t: GT, n_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks of a NEW_TYPES type at its integer extremes: every quant, scale and min byte
    0x00 / 0xFF (Q4_1 / Q5_1 nibbles 0 / 15 with random fifth bits; IQ4_NL / IQ4_XS levels
    -127 / 113; Q3_K quants -4 / 3 and scales -32 / 31; Q2_K quants 0 / 3, scales and mins
    0 / 15); the float scale fields 0.5 (Q2_K's dmin 0.25)."""
    _, bb, offs = LAYOUT[t]
    raw = rng.choice(np.array((0x00, 0xFF), np.uint8), (n_blocks, bb))
    for k, off in enumerate(offs):
        raw[:, off:off + 2] = np.array([0.5 / (1 + k)], np.float16).view(np.uint8)
    return raw


@pytest.mark.parametrize("t", NEW_TYPES, ids=lambda t: t.name)
def test_matmul_new_types_extreme_quants(t: GT, impl: str) -> None:
    """The new types' row kernels at their integer extremes against activations at +-127
    (maddubs near saturation: |w| <= 127 by the sign trick, q <= 31 unsigned): the integer
    sums stay exact, so the fast kernels equal W x X (dequantized, float64) to float
    rounding, and the reference too; a token alone gets its bits in the batch of 9 (in the
    batch-invariant mode: AVX-512 runs Q4_1 / Q5_1 batches on the register tiles)."""
    rng = np.random.default_rng(24)
    rows, cols, n_tok = 19, 768, 9
    raw = new_type_extremes(t, rows * cols // block_elems(t), rng)
    w = raw.reshape(rows, -1)
    x = np.where(rng.random((n_tok, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
    x[:, :32] *= 5.0  # one block with another activation scale
    act = prepare(t, x)
    wd = gguf_dequant(t, w).reshape(rows, cols)
    xd, _ = act_dequant(t, act, n_tok, cols)
    exact = (wd.astype(np.float64) @ xd.astype(np.float64).T).T
    mag = magnitude(wd, xd).T
    y_ref = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
    y_fast = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
    assert np.all(np.abs(y_fast - exact) <= 2e-6 * mag + 1e-30), t.name
    assert np.all(np.abs(y_ref - exact) <= 2e-6 * mag + 1e-30), t.name
    lib.aotx_kernel_invariant(1)  # AVX-512 Q4_1 / Q5_1: the tiles at n_tok = 1 too
    try:
        y_inv = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
        for i in range(n_tok):
            alone = matmul(t, w, cols, prepare(t, x[i:i + 1]), 1, rows, 0, rows, rows, ref=False)
            assert np.array_equal(alone[0].view(np.uint32), y_inv[i].view(np.uint32)), (t.name, i)
    finally:
        lib.aotx_kernel_invariant(0)


@pytest.mark.parametrize("t", [GT.Q8_0, GT.Q5_0, GT.Q4_0, GT.Q4_1, GT.Q5_1, GT.IQ4_NL],
                         ids=lambda t: t.name)
def test_q8_0_tiles_bits_equal_rows1_at_extremes(t: GT, impl: str) -> None:
    """Q8_0 at the head's 640 columns with weights at -128 / 127 (Q4_0 / Q5_0: quants
    0 / 15 / 31, random fifth bits) and activations at +-127: the multi-token tiles
    (AVX2: int16 pairs, madd; Q4_0 / Q5_0: maddubs) give each token the bits of its
    n_tok = 1 run (AVX2: rows as stored, hadd tree), at 8 tokens (the 8-sequence step)
    and 37 (a prefill slab with a partial token group), on row ranges that cut 8- and
    16-row chunks; and stay within the reference's bound.  Q4_0 / Q5_0 also at 1088
    columns (two K slabs of 32 blocks); Q4_1 / Q5_1 likewise (the tiles with the mins'
    term on both paths), IQ4_NL too (AVX-512 tiles with u = level + 128; AVX2 rows)."""
    rng = np.random.default_rng(23)
    rows = 43
    cols = 640 if t == GT.Q8_0 else 1088
    _, _, offs = LAYOUT[t]
    raw = extreme_bytes(t, rows * cols // 32, rng)
    for off in offs:
        raw[:, off:off + 2] = np.array([0.25], np.float16).view(np.uint8)
    w = raw.reshape(rows, -1)
    for n_tok in (8, 37):
        x = np.where(rng.random((n_tok, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
        x[:, :32] *= 3.0  # one block with a different activation scale
        lib.aotx_kernel_invariant(1)
        try:
            alone = np.stack([matmul(t, w, cols, prepare(t, x[i:i + 1]), 1, rows,
                                     0, rows, rows, ref=False)[0] for i in range(n_tok)])
            act = prepare(t, x)
            y = np.full((n_tok, rows), np.nan, np.float32)
            for r0, r1 in ((0, 5), (5, 24), (24, rows)):
                y[:, r0:r1] = matmul(t, w, cols, act, n_tok, rows, r0, r1, rows,
                                     ref=False)[:, r0:r1]
        finally:
            lib.aotx_kernel_invariant(0)
        assert np.array_equal(y.view(np.uint32), alone.view(np.uint32)), (impl, n_tok)
        y_ref = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
        mag = magnitude(gguf_dequant(t, w).reshape(rows, cols),
                        act_dequant(t, act, n_tok, cols)[0]).T
        assert np.all(np.abs(y - y_ref) <= 1e-5 * mag + 1e-30), (impl, n_tok)


# copy bytes per 8 rows x one block (32 columns; k-quants: a 256-column super-block)
# The re-blocked copies per kernel path: (rows per group, bytes per group and block); each
# copy starts with a 64-byte header naming its layout.
PACKED: dict[str, tuple[int, dict[GT, int]]] = {
    "avx2": (8, {GT.Q8_0: 272, GT.Q5_0: 176, GT.Q4_0: 144, GT.Q4_K: 1152, GT.Q6_K: 1680}),
    "avx512vnni": (16, {GT.Q8_0: 544, GT.Q5_0: 352, GT.Q4_0: 288, GT.Q4_K: 2304,
                         GT.Q6_K: 3360}),
}
PACK_HEAD = 64
# columns per type: Q8_0 / Q5_0 / Q4_0 at 640 (the head, attn_q / ffn_gate / ffn_up), 3
# blocks and 34 (two K slabs); k-quants at 1 super-block, 2 and 8 (ffn_down's 2048)
PACKED_COLS = {GT.Q8_0: (640, 96, 1088), GT.Q5_0: (640, 96, 1088), GT.Q4_0: (640, 96, 1088),
               GT.Q4_K: (256, 512, 2048), GT.Q6_K: (256, 512, 2048)}
PACKED_CASES = [(path, t) for path, (_, sizes) in PACKED.items() for t in sizes]


def packed_size(path: str, t: GT, rows: int, cols: int) -> int:
    gr, sizes = PACKED[path]
    return PACK_HEAD + (rows + gr - 1) // gr * (cols // block_elems(t)) * sizes[t]


def packed_matmul(t: GT, pk: np.ndarray, cols: int, act: np.ndarray, n_tok: int, r0: int,
                  r1: int, ldy: int) -> np.ndarray:
    y = np.full(n_tok * ldy, 12345.0, np.float32)
    rc = lib.aotx_matmul_packed(t, ffi.from_buffer(pk), cols, ffi.from_buffer(act), n_tok,
                                fbuf(y), ldy, r0, r1)
    assert rc == 0
    return y.reshape(n_tok, ldy)


def pack_copy(path: str, t: GT, w: np.ndarray, rows: int, cols: int,
              pieces: tuple[int, ...]) -> np.ndarray:
    """The re-blocked copy for the path picked now, filled piece by piece ([0, pieces[0]),
    ...: row splits)."""
    size = lib.aotx_packed_bytes(t, rows, cols)
    assert size == packed_size(path, t, rows, cols)
    pk = np.full(size, 0xAA, np.uint8)
    w = np.ascontiguousarray(w)
    for r0, r1 in itertools.pairwise((0, *pieces, rows)):
        assert lib.aotx_pack(t, ffi.from_buffer(w), rows, cols, r0, r1, ffi.from_buffer(pk)) == 0
    return pk


def force_path(path: str) -> None:
    if lib.aotx_kernel_force(path.encode()) != 0:
        pytest.skip(f"this CPU cannot run the {path} kernels")


def extreme_blocks(t: GT, w: np.ndarray, rows: int, cols: int, rng: np.random.Generator) -> None:
    """Every third row's even blocks (k-quants: super-blocks) at the type's extremes
    (extreme_bytes), in place, keeping the scale fields: Q8_0 / Q4_0 d, Q5_0 d and qh (its
    random fifth bits), Q4_K d and dmin, Q6_K d."""
    be, bb, _ = LAYOUT[t]
    ext = extreme_bytes(t, rows * cols // be, rng).reshape(rows, cols // be, bb)
    lo, hi = {GT.Q5_0: (6, bb), GT.Q4_K: (4, bb), GT.Q6_K: (0, 208)}.get(t, (2, bb))
    blocks = w.reshape(rows, cols // be, bb)
    blocks[::3, ::2, lo:hi] = ext[::3, ::2, lo:hi]


@pytest.mark.parametrize(("path", "t"), PACKED_CASES, ids=lambda v: getattr(v, "name", v))
@pytest.mark.parametrize("k", [0, 1, 2], ids=lambda k: f"cols{k}")
def test_packed_copy_bits_equal_the_tiles(path: str, t: GT, k: int) -> None:
    """The re-blocked copies (the Q8_0 head, the body's Q5_0 / Q4_0 / Q4_K / Q6_K
    projections; AVX2 tiles: groups of 8 rows, AVX-512 VNNI tiles: 16) give every token
    the bits of aotx_matmul_rows on the original rows (AVX-512 in its batch-invariant
    mode, whose n_tok = 1 runs the tiles as the copy does) at n_tok 1, 3, 8, 9, 13 and 37
    (a prefill slab with partial token groups), on row ranges that cut groups at the end
    and leave other rows untouched; weights random with blocks at the quant extremes
    mixed in, at PACKED_COLS' columns."""
    force_path(path)
    gr = PACKED[path][0]
    cols = PACKED_COLS[t][k]
    cuts = (0, gr, 2 * gr, 43)   # rows 43: the last group cut short
    try:
        lib.aotx_kernel_invariant(1)
        rng = np.random.default_rng(cols + int(t))
        rows = cuts[-1]
        w = weights(t, rows, cols, rng, "random")
        extreme_blocks(t, w, rows, cols, rng)
        pk = pack_copy(path, t, w, rows, cols, (gr, 2 * gr))
        for n_tok in (1, 3, 8, 9, 13, 37):
            x = rng.standard_normal((n_tok, cols)).astype(np.float32)
            x[:, :32] *= 30.0
            act = prepare(t, x)
            want = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
            y = np.full((n_tok, rows), np.nan, np.float32)
            for r0, r1 in itertools.pairwise(cuts):
                got = packed_matmul(t, pk, cols, act, n_tok, r0, r1, rows)
                check_untouched(got, n_tok, r0, r1)
                y[:, r0:r1] = got[:, r0:r1]
            assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (cols, n_tok)
            y_ref = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
            mag = magnitude(gguf_dequant(t, w).reshape(rows, cols),
                            act_dequant(t, act, n_tok, cols)[0]).T
            assert np.all(np.abs(y - y_ref) <= 1e-5 * mag + 1e-30), (cols, n_tok)
    finally:
        lib.aotx_kernel_invariant(0)
        assert lib.aotx_kernel_force(b"auto") == 0


@pytest.mark.parametrize(("path", "t"), PACKED_CASES, ids=lambda v: getattr(v, "name", v))
def test_packed_copy_only_for_its_kernels(path: str, t: GT) -> None:
    """A copy is offered in the layout of the kernels picked now; one made under a path is
    refused (AOTX_E_UNSUPPORTED: run the original) under another; bad ranges, types,
    columns and buffers that are no copy of this type are refused."""
    force_path(path)
    gr = PACKED[path][0]
    rows, cols = 2 * gr, PACKED_COLS[t][1]
    w = weights(t, rows, cols, np.random.default_rng(5), "random")
    try:
        pk = pack_copy(path, t, w, rows, cols, ())
        act = prepare(t, np.ones((1, cols), np.float32))
        y = np.zeros(rows, np.float32)
        args = (ffi.from_buffer(pk), cols, ffi.from_buffer(act), 1, fbuf(y), rows)
        assert lib.aotx_matmul_packed(t, *args, 0, rows) == 0
        assert lib.aotx_matmul_packed(t, *args, gr // 2, rows) == lib.AOTX_E_INVALID_ARGUMENT
        assert lib.aotx_pack(t, ffi.from_buffer(w), rows, cols, gr // 2, rows,
                             ffi.from_buffer(pk)) == lib.AOTX_E_INVALID_ARGUMENT
        assert lib.aotx_packed_bytes(t, rows, 48) == 0
        if t in (GT.Q4_K, GT.Q6_K):  # whole super-blocks only
            assert lib.aotx_packed_bytes(t, rows, cols + 32) == 0
            assert lib.aotx_matmul_packed(t, *args[:1], cols + 32, *args[2:], 0, gr) == \
                lib.AOTX_E_INVALID_ARGUMENT
        assert lib.aotx_packed_bytes(GT.Q5_K, rows, 256) == 0
        assert lib.aotx_matmul_packed(GT.Q5_K, *args, 0, gr) == lib.AOTX_E_INVALID_ARGUMENT
        other_type = GT.Q4_0 if t != GT.Q4_0 else GT.Q8_0
        assert lib.aotx_matmul_packed(other_type, *args, 0, gr) == lib.AOTX_E_INVALID_ARGUMENT
        junk = np.zeros_like(pk)   # no header: not a copy
        assert lib.aotx_matmul_packed(t, ffi.from_buffer(junk), *args[1:], 0, gr) == \
            lib.AOTX_E_INVALID_ARGUMENT
        for other in ("ref", "avx2", "avx512vnni"):
            if other == path or lib.aotx_kernel_force(other.encode()) != 0:
                continue
            size = lib.aotx_packed_bytes(t, rows, cols)
            want = packed_size(other, t, rows, cols) if t in PACKED.get(other, (0, {}))[1] else 0
            assert size == want, other
            assert lib.aotx_matmul_packed(t, *args, 0, gr) == lib.AOTX_E_UNSUPPORTED, other
    finally:
        assert lib.aotx_kernel_force(b"auto") == 0


@pytest.mark.parametrize("t", [GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.BF16],
                         ids=lambda t: t.name)
def test_matmul_on_gguf_quantized_weights(t: GT, impl: str) -> None:
    run_case(t, 24, 20, 6, 0, 24, seed=11, impl=impl, mode="quantize")


@pytest.mark.parametrize("t", [GT.Q8_0, GT.Q4_K, GT.Q6_K], ids=lambda t: t.name)
def test_matmul_zero_and_extreme_activations(t: GT, impl: str) -> None:
    rng = np.random.default_rng(5)
    rows, cols = 9, 512
    w = weights(t, rows, cols, rng, "random")
    x = np.zeros((3, cols), np.float32)
    x[1] = 1e-3
    x[2, ::2] = 1e4
    x[2, 1::2] = -1e4
    act = prepare(t, x)
    y_ref = matmul(t, w, cols, act, 3, rows, 0, rows, rows, ref=True)
    y_fast = matmul(t, w, cols, act, 3, rows, 0, rows, rows, ref=False)
    assert np.all(y_ref[0] == 0.0) and np.all(y_fast[0] == 0.0)
    wd = gguf_dequant(t, w).reshape(rows, cols)
    xd, _ = act_dequant(t, act, 3, cols)
    mag = magnitude(wd, xd).T
    assert np.all(np.abs(y_fast - y_ref) <= 1e-5 * mag + 1e-30)


@pytest.fixture(params=["ref", "avx2", "avx512vnni"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every kernel path this CPU runs (the reference included)."""
    name = str(request.param)
    rc = lib.aotx_kernel_force(name.encode())
    if rc == lib.AOTX_E_UNSUPPORTED:
        pytest.skip(f"this CPU does not run {name}")
    assert rc == 0
    # ref and avx2 are always batch invariant; avx512vnni only in the invariant mode
    assert lib.aotx_kernel_is_invariant() == (name != "avx512vnni")
    assert lib.aotx_kernel_invariant(1) == 0
    assert lib.aotx_kernel_is_invariant() == 1
    yield name
    assert lib.aotx_kernel_invariant(0) == 0
    assert lib.aotx_kernel_force(b"auto") == 0


@pytest.mark.parametrize("t", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_batch_invariant(t: GT, path: str) -> None:
    """A token's outputs are bit-identical whether it is alone (n_tok = 1), in a batch of
    4 at any position, or of 9, and whatever row ranges the rows are split into (thread
    chunks start at multiples of 16): one fixed reduction order per row (on AVX-512 in
    the invariant mode, AOTX_INVARIANT=1)."""
    rng = np.random.default_rng(77)
    be = block_elems(t)
    n_blocks = 70 if be == 32 else 9 if be == 256 else 1
    cols = be * n_blocks if be > 1 else 2240 + 5
    rows, n_tok = 45, 9
    w = weights(t, rows, cols, rng, "random" if be > 1 else "quantize")
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    alone = np.stack([matmul(t, w, cols, prepare(t, x[i:i + 1]), 1, rows, 0, rows, rows,
                             ref=False)[0] for i in range(n_tok)])
    assert np.all(np.isfinite(alone))
    bits = alone.view(np.uint32)
    full = matmul(t, w, cols, prepare(t, x), n_tok, rows, 0, rows, rows, ref=False)
    assert np.array_equal(full.view(np.uint32), bits), (t.name, path, "batch of 9")
    for at in range(n_tok - 3):  # batches of 4, the token at every position
        y = matmul(t, w, cols, prepare(t, x[at:at + 4]), 4, rows, 0, rows, rows, ref=False)
        assert np.array_equal(y.view(np.uint32), bits[at:at + 4]), (t.name, path, at)
    split = np.full((n_tok, rows), np.nan, np.float32)
    act = prepare(t, x)
    for r0, r1 in ((0, 16), (16, 32), (32, rows)):  # two threads' chunks
        part = matmul(t, w, cols, act, n_tok, rows, r0, r1, rows, ref=False)
        split[:, r0:r1] = part[:, r0:r1]
    assert np.array_equal(split.view(np.uint32), bits), (t.name, path, "row split")


@pytest.mark.parametrize("t", [GT.Q4_K, GT.Q6_K], ids=lambda t: t.name)
def test_kquant_invariant_kernels_equal_the_reference_bits(t: GT, path: str) -> None:
    """Q4_K / Q6_K x Q8_K32: the batch-invariant kernels (the AVX2 tiles and Q6_K's
    one-row decode kernel, the AVX-512 tiles in the invariant mode) repeat the
    reference's float steps (aotx_block_q8_k32 in csrc/engine/aotx_kernels.h), so they give its
    bits at every n_tok (1: decode; 5: a partial token group; 13: more than one), on row
    ranges that cut 8- and 16-row chunks, with random and extreme quants (|T_j| near
    2^24 for Q6_K: the float steps are exact only below it) and activations with
    outliers (one 32-block much larger than the rest of its super-block)."""
    rng = np.random.default_rng(31)
    rows, nb = 45, 9
    cols = 256 * nb
    for mode in ("random", "extreme"):
        if mode == "random":
            w = weights(t, rows, cols, rng, "random")
            x = rng.standard_normal((13, cols)).astype(np.float32)
            x[:, 40] = 300.0
        else:
            _, bb, offs = LAYOUT[t]
            raw = rng.choice(np.array((0x00, 0xFF), np.uint8), (rows * nb, bb))
            if t == GT.Q6_K:
                raw[:, 192:208] = rng.choice(np.array((0x80, 0x7F), np.uint8), (raw.shape[0], 16))
            for off in offs:
                raw[:, off:off + 2] = np.array([0.5], np.float16).view(np.uint8)
            w = raw.reshape(rows, -1)
            x = np.where(rng.random((13, cols)) < 0.5, -1.0, 1.0).astype(np.float32)
        for n_tok in (1, 5, 13):
            act = prepare(t, x[:n_tok])
            want = matmul(t, w, cols, act, n_tok, rows, 0, rows, rows, ref=True)
            got = np.full((n_tok, rows), np.nan, np.float32)
            for r0, r1 in ((0, 3), (3, 19), (19, 40), (40, rows)):
                got[:, r0:r1] = matmul(t, w, cols, act, n_tok, rows, r0, r1, rows,
                                       ref=False)[:, r0:r1]
            assert np.all(np.isfinite(want))
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (path, mode, n_tok)


def test_threads_on_disjoint_row_ranges_match_one_call() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(12)
    rows, cols, n_tok = 301, 640, 3
    w = weights(GT.Q5_0, rows, cols, rng, "random")
    act = prepare(GT.Q5_0, rng.standard_normal((n_tok, cols)).astype(np.float32))
    whole = matmul(GT.Q5_0, w, cols, act, n_tok, rows, 0, rows, rows, ref=False)
    y = np.full(n_tok * rows, 12345.0, np.float32)
    cuts = [0, 37, 150, 151, 301]

    def part(r0: int, r1: int) -> int:
        return int(lib.aotx_matmul_rows(int(GT.Q5_0), ffi.from_buffer(w), cols,
                                        ffi.from_buffer(act), n_tok, fbuf(y), rows, r0, r1))

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(part, cuts[:-1], cuts[1:])) == [0, 0, 0, 0]
    assert np.array_equal(y.reshape(n_tok, rows), whole)


def test_forced_reference_is_named() -> None:
    code = ("from aotx_trio.native.lib import ffi, lib; "
            "print(ffi.string(lib.aotx_kernel_impl(8)).decode())")
    env = dict(os.environ, AOTX_KERNELS="ref")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "ref"
    assert lib.aotx_kernel_force(b"ref") == 0
    try:
        assert ffi.string(lib.aotx_kernel_impl(int(GT.Q4_K))) == b"ref"
        assert ffi.string(lib.aotx_kernel_impl(int(GT.F32))) == b"ref"
    finally:
        assert lib.aotx_kernel_force(b"auto") == 0
    assert lib.aotx_kernel_force(b"sse9") == lib.AOTX_E_INVALID_ARGUMENT


def test_avx2_cap_from_the_environment() -> None:
    """AOTX_KERNELS=avx2 caps every kernel at the AVX2 path (how benchmarks measure it
    on an AVX-512 machine): never above it, and the same path a forced run reports."""
    code = ("from aotx_trio.native.lib import ffi, lib; "
            "print(ffi.string(lib.aotx_kernel_impl(12)).decode(), "
            "ffi.string(lib.aotx_sgemm_impl()).decode())")
    env = dict(os.environ, AOTX_KERNELS="avx2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60)
    q4k, f32 = out.stdout.split()
    if lib.aotx_cpu_features() & 1:               # AVX2 + FMA on this CPU
        assert (q4k, f32) == ("avx2", "avx2")
    else:
        assert (q4k, f32) == ("ref", "ref")


# ------------------------------------------------------------------ the real model



_SCALAR = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1",
           10: "<u8", 11: "<i8", 12: "<f8"}


def read_gguf_tensors(path: Path) -> dict[str, tuple[GT, list[int], np.ndarray]]:
    """name -> (type, dims, raw bytes): a minimal GGUF v3 reader (gguf-py's GGUFReader
    spends ~10 s decoding the 262k-token vocabulary we do not need here)."""
    buf = np.memmap(path, np.uint8, mode="r")
    pos = 0

    def take(dt: str) -> int | float:
        nonlocal pos
        v = np.frombuffer(buf, dt, 1, pos)[0]
        pos += np.dtype(dt).itemsize
        return v.item()  # type: ignore[no-any-return]

    def string() -> str:
        nonlocal pos
        n = int(take("<u8"))
        pos += n
        return bytes(buf[pos - n:pos]).decode()

    def skip_value(vt: int) -> None:
        nonlocal pos
        if vt == 8:
            string()
        elif vt == 9:
            et, n = int(take("<u4")), int(take("<u8"))
            if et in _SCALAR:
                pos += n * np.dtype(_SCALAR[et]).itemsize
            else:
                for _ in range(n):
                    skip_value(et)
        else:
            pos += np.dtype(_SCALAR[vt]).itemsize

    assert bytes(buf[:4]) == b"GGUF"
    pos = 4
    assert take("<u4") == 3
    n_tensors, n_kv = int(take("<u8")), int(take("<u8"))
    align = 32
    for _ in range(n_kv):
        key, vt = string(), int(take("<u4"))
        if key == "general.alignment":
            align = int(take("<u4"))
        else:
            skip_value(vt)
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [int(take("<u8")) for _ in range(int(take("<u4")))]
        infos.append((name, dims, GT(int(take("<u4"))), int(take("<u8"))))
    start = (pos + align - 1) // align * align
    out = {}
    for name, dims, t, off in infos:
        rows = int(np.prod(dims[1:]))
        rb = dims[0] // LAYOUT[t][0] * LAYOUT[t][1]
        out[name] = (t, dims, buf[start + off:start + off + rows * rb].reshape(rows, rb))
    return out


@pytest.fixture(scope="module")
def model_tensors() -> dict[str, tuple[GT, list[int], np.ndarray]]:
    return read_gguf_tensors(MODEL)


def test_mini_reader_tiles_the_file(model_tensors: dict[str, tuple[GT, list[int], np.ndarray]]
                                    ) -> None:
    """Our test-side reader's tensors lie back to back (32-byte aligned) up to the file's end."""
    spans = sorted((raw.ctypes.data, raw.nbytes) for _, _, raw in model_tensors.values())
    for (a, n), (b, _) in itertools.pairwise(spans):
        assert b - a == (n + 31) // 32 * 32
    root = next(iter(model_tensors.values()))[2]
    while isinstance(root.base, np.ndarray):
        root = root.base
    assert spans[-1][0] + spans[-1][1] == root.ctypes.data + MODEL.stat().st_size
    t, dims, _ = model_tensors["token_embd.weight"]
    assert (t, dims) == (GT.Q8_0, [640, 262144])


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight",
                                  "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                                  "blk.0.ffn_down.weight", "blk.2.ffn_down.weight",
                                  "blk.0.attn_norm.weight"])
def test_real_model_tensors(model_tensors: dict[str, tuple[GT, list[int], np.ndarray]],
                            name: str, impl: str) -> None:
    t, dims, raw = model_tensors[name]
    cols = dims[0]
    n = raw.shape[0]
    rows_idx = [0, 1, n // 2, n - 1] if n > 1 else [0]
    sel = np.ascontiguousarray(raw[rows_idx])
    want = gguf_dequant(t, sel)
    for ref in (True, False):
        got = dequant(t, sel, ref)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    if t == GT.F32:
        return
    # fast vs ref vs numpy on a slab of real rows
    slab = np.ascontiguousarray(raw[: min(40, raw.shape[0])])
    rows = slab.shape[0]
    rng = np.random.default_rng(3)
    for n_tok in (1, 4, 7):
        x = rng.standard_normal((n_tok, cols)).astype(np.float32)
        act = prepare(t, x)
        y_ref = matmul(t, slab, cols, act, n_tok, rows, 0, rows, rows, ref=True)
        y_fast = matmul(t, slab, cols, act, n_tok, rows, 0, rows, rows, ref=False)
        wd = gguf_dequant(t, slab).reshape(rows, cols)
        xd, _ = act_dequant(t, act, n_tok, cols)
        mag = magnitude(wd, xd).T
        exact = (wd.astype(np.float64) @ xd.astype(np.float64).T).T
        assert np.all(np.abs(y_fast - y_ref) <= 1e-5 * mag + 1e-30)
        assert np.all(np.abs(y_ref - exact) <= 2e-5 * mag + 1e-30)
