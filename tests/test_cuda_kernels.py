"""csrc/cuda/ kernels on a GPU against the CPU (marker ``gpu``; scripts/gpu_check runs
them on the device machine; elsewhere they skip, saying why).

Integer paths are exact: the device quantizers give the CPU's quants and scales bit for
bit, the Q4_K product the reference's bits (same integer sums, same float steps, same
order), and the Q8_0 product the reference's bits whenever every float step is exact
(power-of-two scales).  Float paths are within stated bounds: the Q8_0 product with any
scales within 2 x nb x 2^-24 x sum|w x| (two summation orders of nb block products),
RMSNorm within 2 ulp, RoPE within 1e-6 x (|a| + |b|) per pair, attention within 3e-5 of
the float64 softmax over the same half K/V.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from aotx_trio import errors
from aotx_trio.native import cuda
from aotx_trio.native.lib import check, ffi, lib

pytestmark = pytest.mark.gpu

# This file runs on the device machine, which has numpy and pytest but not gguf or the
# model packages: the CPU side is the library's own reference calls, the weights are made
# here (block layouts: csrc/engine/aotx_kernels.h).
Q8_0, Q4_K, Q6_K = cuda.T_Q8_0, cuda.T_Q4_K, 14


def prepare(t: int, x: np.ndarray) -> np.ndarray:
    """The CPU's activations for weights of type t (aotx_act_prepare)."""
    n_tok, cols = x.shape
    act = np.zeros(lib.aotx_act_bytes(t, cols, n_tok), np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    check(lib.aotx_act_prepare(t, ffi.from_buffer("float[]", x), cols, n_tok, cols,
                               ffi.from_buffer(act)))
    return act


def act8_blocks(act: np.ndarray, n_tok: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """The CPU's Q8_0-family activations (128-byte pairs: 64 quants + 128, then each
    block's scale 8 times) -> (x_q [n_tok][nb][32], d [n_tok][nb])."""
    nb, pairs = cols // 32, (cols // 32 + 1) // 2
    raw = act.reshape(n_tok, pairs, 128)
    xq = raw[..., :64].reshape(n_tok, 2 * pairs, 32).astype(np.int32) - 128
    d = np.ascontiguousarray(raw[..., 64:]).view(np.float32).reshape(n_tok, 2 * pairs, 8)
    return xq[:, :nb], np.ascontiguousarray(d[:, :nb, 0])


def matmul_ref(t: int, w: np.ndarray, cols: int, act: np.ndarray, n_tok: int) -> np.ndarray:
    """The CPU reference product (aotx_matmul_rows_ref), [n_tok][rows]."""
    rows = w.shape[0]
    y = np.zeros((n_tok, rows), np.float32)
    check(lib.aotx_matmul_rows_ref(t, ffi.from_buffer(np.ascontiguousarray(w)), cols,
                                   ffi.from_buffer(act), n_tok, ffi.from_buffer("float[]", y),
                                   rows, 0, rows))
    return y


def q8_0_weights(rng: np.random.Generator, rows: int, cols: int, log2_d: np.ndarray | None = None,
                 qmax: int = 127) -> np.ndarray:
    """Q8_0 blocks [rows][cols/32 x 34]: fp16 scales (2^log2_d when given), random quants."""
    nb = cols // 32
    blocks = np.zeros((rows, nb, 34), np.uint8)
    d = (2.0 ** log2_d if log2_d is not None else rng.uniform(1e-4, 2e-3, (rows, nb)))
    blocks[..., 0:2] = d.astype(np.float16).view(np.uint8).reshape(rows, nb, 2)
    blocks[..., 2:] = rng.integers(-qmax, qmax + 1, (rows, nb, 32)).astype(np.int8).view(np.uint8)
    return blocks.reshape(rows, -1)


def q4_k_weights(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """Q4_K super-blocks [rows][cols/256 x 144] of random bytes with finite fp16 d, dmin."""
    nb = rows * cols // 256
    raw = rng.integers(0, 256, (nb, 144), dtype=np.uint16).astype(np.uint8)
    for off in (0, 2):
        raw[:, off:off + 2] = rng.uniform(-0.02, 0.02, nb).astype(np.float16).view(
            np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def q8_0_dequant(w: np.ndarray) -> np.ndarray:
    rows = w.shape[0]
    b = w.reshape(rows, -1, 34)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16).astype(np.float64)
    return (d * b[..., 2:].view(np.int8)).reshape(rows, -1)


@pytest.fixture(scope="module")
def dev() -> Iterator[cuda.Device]:
    if not cuda.compiled():
        pytest.skip("this library was built without the CUDA kernels (no nvcc at build "
                    "time, or AOTX_CUDA=0)")
    try:
        d = cuda.Device()
    except errors.ConfigError as exc:
        pytest.skip(f"no usable CUDA device: {exc.native}: {exc.message}")
    with d:
        yield d


def _aligned(n: int) -> int:
    return (n + 255) // 256 * 256


def _quantize_on(dev: cuda.Device, t: int, x: np.ndarray, ldx: int) -> np.ndarray:
    """x [n_tok][cols] quantized on the device (x laid out with row stride ldx)."""
    n_tok, cols = x.shape
    padded = np.zeros((n_tok, ldx), np.float32)
    padded[:, :cols] = x
    xp = dev.upload(padded)
    size = cuda.act_bytes(t, cols, n_tok)
    act = dev.alloc(size)
    dev.quantize(t, xp, ldx, n_tok, cols, act)
    dev.sync()
    return dev.download(act, size, np.uint8)


def _device_q8_0(act: np.ndarray, n_tok: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    q = act[:n_tok * cols].view(np.int8).reshape(n_tok, cols // 32, 32)
    off = _aligned(n_tok * cols)
    d = act[off:off + n_tok * (cols // 32) * 4].view(np.float32).reshape(n_tok, cols // 32)
    return q, d


@pytest.mark.parametrize(("t", "cols"), [(Q8_0, 96), (Q8_0, 2048), (Q4_K, 256), (Q4_K, 2560)])
@pytest.mark.parametrize("n_tok", [1, 3, 8])
def test_device_quantization_is_the_cpus_bit_for_bit(dev: cuda.Device, t: int, cols: int,
                                                     n_tok: int) -> None:
    rng = np.random.default_rng(cols * 10 + n_tok)
    x = (rng.standard_normal((n_tok, cols)) * rng.uniform(0.01, 30, (n_tok, 1))).astype(np.float32)
    x[0, 5] = 0.0
    x[:, 64:96] = 0.0                        # an all-zero block: d = 0, q = 0
    got = _quantize_on(dev, t, x, cols + 7)
    cpu = prepare(t, x)
    if t == Q4_K:
        assert np.array_equal(got, cpu)      # the same Q8_K32 bytes
        return
    q, d = _device_q8_0(got, n_tok, cols)
    cq, cd = act8_blocks(cpu, n_tok, cols)
    assert np.array_equal(q.astype(np.int32), cq)
    assert np.array_equal(d.view(np.uint32), np.ascontiguousarray(cd).view(np.uint32))


def _matvec_on(dev: cuda.Device, t: int, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    rows = w.shape[0]
    n_tok, cols = x.shape
    wp = dev.upload(w)
    xp = dev.upload(x)
    size = cuda.act_bytes(t, cols, n_tok)
    act = dev.alloc(size)
    dev.quantize(t, xp, cols, n_tok, cols, act)
    y = dev.alloc(n_tok * rows * 4)
    dev.matvec(t, wp, rows, cols, act, n_tok, y, rows)
    dev.sync()
    return dev.download(y, (n_tok, rows), np.float32)


@pytest.mark.parametrize(("rows", "cols"), [(37, 256), (64, 1280), (131, 2560)])
@pytest.mark.parametrize("n_tok", [1, 2, 5, 8])
def test_q4_k_product_is_the_references_bits(dev: cuda.Device, rows: int, cols: int,
                                             n_tok: int) -> None:
    rng = np.random.default_rng(rows + cols + n_tok)
    w = q4_k_weights(rng, rows, cols)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    got = _matvec_on(dev, Q4_K, w, x)
    ref = matmul_ref(Q4_K, w, cols, prepare(Q4_K, x), n_tok)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def _pow2_q8_0(rng: np.random.Generator, rows: int, cols: int) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 weights with power-of-two scales and small quants, and activations whose every
    block quantizes with a power-of-two scale: every float step of the product is exact."""
    nb = cols // 32
    blocks = q8_0_weights(rng, rows, cols, log2_d=-rng.integers(4, 10, (rows, nb)), qmax=8)
    scale = 2.0 ** -rng.integers(2, 8, (1, nb, 1))
    xq = rng.integers(-127, 128, (4, nb, 32))
    xq[:, :, 0] = 127                        # max|x| = 127 x scale: d is the scale
    x = (xq * scale).astype(np.float32).reshape(4, cols)
    return blocks, x


def test_q8_0_integer_sums_are_the_references(dev: cuda.Device) -> None:
    rng = np.random.default_rng(7)
    rows, cols = 45, 2048
    w, x = _pow2_q8_0(rng, rows, cols)
    for n_tok in (1, 4):
        got = _matvec_on(dev, Q8_0, w, x[:n_tok])
        ref = matmul_ref(Q8_0, w, cols, prepare(Q8_0, x[:n_tok]), n_tok)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize(("rows", "cols"), [(33, 64), (256, 640), (96, 4096)])
@pytest.mark.parametrize("n_tok", [1, 8])
def test_q8_0_product_within_the_float_order_bound(dev: cuda.Device, rows: int, cols: int,
                                                   n_tok: int) -> None:
    rng = np.random.default_rng(rows * cols + n_tok)
    w = q8_0_weights(rng, rows, cols)
    x = rng.standard_normal((n_tok, cols)).astype(np.float32)
    act = prepare(Q8_0, x)
    got = _matvec_on(dev, Q8_0, w, x)
    ref = matmul_ref(Q8_0, w, cols, act, n_tok)
    wf = q8_0_dequant(w)
    xq, xd = act8_blocks(act, n_tok, cols)
    xf = (xq * xd[..., None]).reshape(n_tok, cols).astype(np.float64)
    bound = 2 * (cols // 32) * 2.0 ** -24 * (np.abs(xf) @ np.abs(wf).T)
    assert np.all(np.abs(got.astype(np.float64) - ref) <= bound + 1e-30)


def test_matvec_refusals_are_named(dev: cuda.Device) -> None:
    w = dev.alloc(64 * 34)
    act = dev.alloc(4096)
    y = dev.alloc(4096)
    with pytest.raises(errors.InvalidInput):
        dev.matvec(Q8_0, w, 1, 64, act, 9, y, 1)            # more than 8 tokens
    with pytest.raises(errors.InvalidInput):
        dev.matvec(Q8_0, w + 2, 1, 64, act, 1, y, 1)        # not 16-byte aligned
    with pytest.raises(errors.FormatError) as err:
        dev.matvec(Q6_K, w, 1, 256, act, 1, y, 1)           # no device kernel yet
    assert err.value.native == "kernel_type_unsupported"


@pytest.mark.parametrize(("rows", "n"), [(7, 640), (16, 256), (3, 5000)])
def test_rmsnorm_is_the_decoders_formula(dev: cuda.Device, rows: int, n: int) -> None:
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((rows, n)) * 3).astype(np.float32)
    w = rng.uniform(0.5, 1.5, n).astype(np.float32)
    eps = np.float32(1e-6)
    xp, wp = dev.upload(x), dev.upload(w)
    out = dev.alloc(x.nbytes)
    dev.rmsnorm(out, xp, wp, rows, n, float(eps))
    dev.rmsnorm(xp, xp, wp, rows, n, float(eps))                    # in place
    dev.sync()
    got, inplace = dev.download(out, x.shape, np.float32), dev.download(xp, x.shape, np.float32)
    ss = (x.astype(np.float64) ** 2).sum(axis=1)
    r = (1.0 / np.sqrt(ss / n + np.float64(eps))).astype(np.float32)
    ref = (x * r[:, None]) * w
    assert np.array_equal(got, inplace)
    assert np.all(np.abs(got - ref) <= 2 * np.spacing(np.abs(ref)))


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(("head_dim", "n_rot"), [(256, 256), (128, 64)])
def test_rope_rotates_as_the_decoder(dev: cuda.Device, neox: bool, head_dim: int,
                                     n_rot: int) -> None:
    rng = np.random.default_rng(head_dim + n_rot + neox)
    n_tok, n_heads = 5, 3
    x = rng.standard_normal((n_tok, n_heads, head_dim)).astype(np.float32)
    pos = np.array([0, 1, 17, 1000, 4095], np.int32)
    half = n_rot // 2
    inv = (10000.0 ** (-np.arange(half, dtype=np.float64) * 2 / n_rot)).astype(np.float32)
    scale = np.float32(0.5)
    xp, pp, ip = dev.upload(x), dev.upload(pos), dev.upload(inv)
    dev.rope(xp, n_tok, n_heads, head_dim, n_rot, pp, ip, float(scale), neox)
    dev.sync()
    got = dev.download(xp, x.shape, np.float32)
    ang = ((pos.astype(np.float32) * scale)[:, None] * inv[None, :]).astype(np.float32)
    c, s = np.cos(ang.astype(np.float64))[:, None, :], np.sin(ang.astype(np.float64))[:, None, :]
    ia = np.arange(half) if neox else 2 * np.arange(half)
    ib = ia + half if neox else ia + 1
    a, b = x[..., ia].astype(np.float64), x[..., ib].astype(np.float64)
    tol = 1e-6 * (np.abs(a) + np.abs(b)) + 1e-30
    assert np.all(np.abs(got[..., ia] - (a * c - b * s)) <= tol)
    assert np.all(np.abs(got[..., ib] - (a * s + b * c)) <= tol)
    assert np.array_equal(got[..., n_rot:], x[..., n_rot:])       # the rest untouched


# --------------------------------------------------------------------------- attention


def _pool(n_layers: int, sliding: list[int], n_kv: int, hd: int, window: int) -> Any:
    p = ffi.new("aotx_kv_params *")
    p.n_pages, p.page_tokens, p.max_seqs, p.max_tokens = 1024, 8, 8, 1024
    p.n_layers, p.n_kv_heads, p.k_dim, p.v_dim, p.window = n_layers, n_kv, hd, hd, window
    keep = ffi.new("uint8_t[]", sliding)
    p.sliding = keep
    p.kv_f16 = 1
    out = ffi.new("aotx_kv_pool **")
    check(lib.aotx_kv_new(p, out))
    return out[0]


def _grown(kv: Any, length: int) -> int:
    s = ffi.new("uint32_t *")
    check(lib.aotx_kv_seq_new(kv, s))
    if length > 1:
        check(lib.aotx_kv_seq_grow(kv, s[0], length - 1))
        check(lib.aotx_kv_seq_trim(kv, s[0]))      # the previous steps' window release
    check(lib.aotx_kv_seq_grow(kv, s[0], 1))        # this step's token
    return int(s[0])


def _row(kv: Any, pages: np.ndarray, seq: int, layer: int, pos: int, head: int, v: int,
         dim: int) -> np.ndarray:
    page, off = ffi.new("int32_t *"), ffi.new("int64_t *")
    check(lib.aotx_kv_locate(kv, seq, layer, pos, head, v, page, off))
    return pages[page[0], off[0]:off[0] + dim].astype(np.float64)


@pytest.mark.parametrize(("n_heads", "n_kv", "hd"), [(8, 2, 64), (4, 1, 256), (3, 3, 128),
                                                     (16, 2, 64)])
@pytest.mark.parametrize("layer", [0, 1])   # 0: sliding (window 100), 1: global
def test_paged_attention_decode_against_float64(dev: cuda.Device, n_heads: int, n_kv: int,
                                                hd: int, layer: int) -> None:
    kv = _pool(2, [1, 0], n_kv, hd, 100)
    try:
        lengths = [1, 7, 33, 250, 513]
        seqs = [_grown(kv, n) for n in lengths]
        stats = ffi.new("aotx_kv_stats *")
        lib.aotx_kv_stats_get(kv, stats)
        window = 100 if layer == 0 else 0
        mirror, layout = cuda.page_table_mirror(kv, layer, window, seqs)
        rng = np.random.default_rng(n_heads * hd + layer)
        pages = rng.standard_normal((stats.n_pages, layout["page_elems"])).astype(np.float16)
        q = rng.standard_normal((len(seqs), n_heads, hd)).astype(np.float32)
        out = dev.alloc(len(seqs) * n_heads * hd * 4)
        scale = 1.0 / np.sqrt(hd)
        dev.attention_decode(n=len(seqs), n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd,
                             v_dim=hd, scale=float(scale), layout=layout,
                             mirror=dev.upload(mirror), pages=dev.upload(pages),
                             q=dev.upload(q), out=out)
        dev.sync()
        got = dev.download(out, q.shape, np.float32)
        G = n_heads // n_kv
        for i, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            lo = max(0, n - window) if window else 0
            for h in range(n_heads):
                K = np.stack([_row(kv, pages, seq, layer, s, h // G, 0, hd) for s in range(lo, n)])
                V = np.stack([_row(kv, pages, seq, layer, s, h // G, 1, hd) for s in range(lo, n)])
                sc = np.float32(scale) * (K @ q[i, h].astype(np.float64))
                p = np.exp(sc - sc.max())
                ref = (p / p.sum()) @ V
                assert np.max(np.abs(got[i, h] - ref)) <= 3e-5, (i, h)
    finally:
        lib.aotx_kv_free(kv)


def _cpu_halves(x: np.ndarray) -> np.ndarray:
    """float -> binary16 bits as the CPU stores K/V (aotx_kv_f16_store)."""
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size, np.uint16)
    lib.aotx_kv_f16_store(ffi.from_buffer("uint16_t[]", out), ffi.from_buffer("float[]", x),
                          x.size)
    return out


@pytest.mark.parametrize("layer", [0, 1])
def test_kv_write_stores_the_cpus_halves_where_the_pool_keeps_them(dev: cuda.Device,
                                                                  layer: int) -> None:
    n_kv, hd = 2, 64
    kv = _pool(2, [1, 0], n_kv, hd, 100)
    try:
        lengths = [1, 9, 130, 8]
        seqs = [_grown(kv, n) for n in lengths]
        mirror, layout = cuda.page_table_mirror(kv, layer, 100 if layer == 0 else 0, seqs)
        stats = ffi.new("aotx_kv_stats *")
        lib.aotx_kv_stats_get(kv, stats)
        rng = np.random.default_rng(layer)
        k = (rng.standard_normal((len(seqs), n_kv * hd)) * 50).astype(np.float32)
        v = (rng.standard_normal((len(seqs), n_kv * hd)) * 50).astype(np.float32)
        k[0, :4] = [1e5, -1e5, 1.0 + 2.0 ** -11, 2.0 ** -25]   # overflow, a tie, underflow
        pages = np.zeros((stats.n_pages, layout["page_elems"]), np.uint16)
        pp = dev.upload(pages)
        dev.kv_write_decode(n=len(seqs), n_kv_heads=n_kv, k_dim=hd, v_dim=hd, layout=layout,
                            mirror=dev.upload(mirror), pages=pp, k=dev.upload(k),
                            v=dev.upload(v))
        dev.sync()
        got = dev.download(pp, pages.shape, np.uint16)
        page, off = ffi.new("int32_t *"), ffi.new("int64_t *")
        for i, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            for h in range(n_kv):
                for which, rows in ((0, k), (1, v)):
                    check(lib.aotx_kv_locate(kv, seq, layer, n - 1, h, which, page, off))
                    pages[page[0], off[0]:off[0] + hd] = _cpu_halves(rows[i, h * hd:(h + 1) * hd])
        assert np.array_equal(got, pages)        # those rows, and nothing else written
    finally:
        lib.aotx_kv_free(kv)


def test_attention_refusals_are_named(dev: cuda.Device) -> None:
    layout = {"page_elems": 1024, "k_off": 0, "v_off": 512, "k_tok": 64, "v_tok": 64,
              "page_tokens": 8, "elem_bytes": 2, "window": 0}
    buf = dev.alloc(1 << 16)
    args = {"n": 1, "n_heads": 4, "n_kv_heads": 1, "head_dim": 64, "v_dim": 64, "scale": 0.125,
            "layout": layout, "mirror": buf, "pages": buf, "q": buf, "out": buf}
    with pytest.raises(errors.InvalidInput):
        dev.attention_decode(**{**args, "head_dim": 60})            # not a multiple of 8
    with pytest.raises(errors.InvalidInput):
        dev.attention_decode(**{**args, "layout": {**layout, "elem_bytes": 4}})   # f32 pages
    with pytest.raises(errors.AotxError) as err:
        dev.attention_decode(**{**args, "n_heads": 16})             # 16 heads per kv head
    assert err.value.native == "unsupported"


def test_aotx_devices_lists_this_gpu(dev: cuda.Device) -> None:
    devices, why = cuda.list_devices()
    if why and "cuda-python" in why:
        pytest.skip(why)
    assert why is None and devices
    _, total = dev.mem_info()
    first = devices[0]
    assert first["memory_total_bytes"] == total
    assert 0 < first["memory_free_bytes"] <= total
    assert first["name"] and re.fullmatch(r"\d+\.\d+", first["compute_capability"])


def test_device_memory_and_its_errors(dev: cuda.Device) -> None:
    free, total = dev.mem_info()
    assert 0 < free <= total
    with pytest.raises(errors.NativeError) as err:
        dev.alloc(1 << 50)                                          # a petabyte
    assert err.value.native == "cuda_out_of_memory"
    assert "cudaMalloc" in err.value.message
    x = dev.upload(np.ones((2, 64), np.float32))           # the next launch is not blamed
    dev.rmsnorm(x, x, dev.upload(np.ones(64, np.float32)), 2, 64, 1e-6)
    dev.sync()
    data = np.arange(1000, dtype=np.int32)
    assert np.array_equal(dev.download(dev.upload(data), 1000, np.int32), data)
