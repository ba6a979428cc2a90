"""csrc/engine/kv/kv_f16.c: K/V pages in IEEE binary16 (Engine.load(kv_f16=True)), on every path
this CPU runs ("ref" always, "f16c" with AVX2 + FMA + F16C).

The conversions against numpy's float16 (round to nearest even, exact widening), bit for
bit on both paths; the stored rows of the first layer (which no attention precedes) are
exactly the float32 engine's rows rounded to half; attention over half pages against the
float32 engine (tolerance: half rounding of K and V) and against the other path; half
the page bytes; batch invariance with half pages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import synth_gguf as sg

from aotx_trio.native.engine import Engine
from aotx_trio.native.lib import ffi, lib

pytestmark = pytest.mark.timeout(300)

# float weights: no activation quantization, whose rounding flips a random net amplifies,
# so the logits show the KV rounding itself
F32 = {"types": (sg.Q.F32,), "embd_type": sg.Q.F32}
SPECS = {
    "gqa4": sg.Spec(**F32),                                        # heads 4 per KV head, hd 64
    # one query head per KV head (the per-head path) and rows of 40 (the 16-lane tails)
    "mha_hd40": sg.Spec(n_heads=4, n_kv_heads=4, head_dim=40, seed=5, **F32),
    "llama": sg.Spec(arch="llama", window=0, seed=7, **F32),
}
PROMPT = [int(t) for t in np.random.default_rng(7).integers(4, 512, 21)]


@pytest.fixture(params=["ref", "f16c"])
def kv_path(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    rc = lib.aotx_kv_f16_force(name.encode())
    if rc == lib.AOTX_E_UNSUPPORTED:
        pytest.skip(f"this CPU has no {name}")
    assert rc == 0 and ffi.string(lib.aotx_kv_f16_impl()).decode() == name
    yield name
    assert lib.aotx_kv_f16_force(b"auto") == 0


@pytest.fixture(scope="module", params=sorted(SPECS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    name = str(request.param)
    return sg.write_model(tmp_path_factory.mktemp("f16") / f"{name}.gguf", SPECS[name])


def specials() -> np.ndarray:
    rng = np.random.default_rng(1)
    edges = [0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e6, -1e6, np.inf, -np.inf,
             6.1035156e-05, 6.1e-05, 5.9604645e-08, 2.9802322e-08, 2.9802326e-08, 1e-9,
             1.0 + 2**-11, 1.0 + 3 * 2**-11, 2049.0, 2051.0]
    pos = np.arange(0x7c01, dtype=np.uint16).view(np.float16).astype(np.float32)  # 0 .. inf
    mids = (pos[:-1] + pos[1:]) / 2                        # every tie between two halves
    return np.concatenate([np.array(edges, np.float32), rng.standard_normal(4096, np.float32) * 8,
                           pos, -pos, mids, -mids]).astype(np.float32)


def test_conversions_match_numpy_bit_for_bit(kv_path: str) -> None:
    x = specials()
    finite = np.isfinite(x)
    x = x[finite | np.isinf(x)]          # NaN payloads checked below
    h = np.zeros(len(x), np.uint16)
    lib.aotx_kv_f16_store(ffi.from_buffer("uint16_t[]", h), ffi.from_buffer("float[]", x), len(x))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    bad = np.nonzero(h != want)[0]
    assert bad.size == 0, f"{kv_path}: {x[bad[:4]]} -> {h[bad[:4]]} want {want[bad[:4]]}"
    back = np.zeros(len(h), np.float32)
    lib.aotx_kv_f16_load(ffi.from_buffer("float[]", back), ffi.from_buffer("uint16_t[]", h),
                         len(h))
    assert np.array_equal(back.view(np.uint32), want.view(np.float16).astype(np.float32)
                          .view(np.uint32))
    nan = np.array([np.nan, -np.nan], np.float32)
    hn = np.zeros(2, np.uint16)
    lib.aotx_kv_f16_store(ffi.from_buffer("uint16_t[]", hn), ffi.from_buffer("float[]", nan), 2)
    assert np.isnan(hn.view(np.float16)).all()


def kv_row(eng: Engine, seq: int, layer: int, pos: int, head: int, v: int) -> np.ndarray:
    p = lib.aotx_model_kv_row(eng._m, seq, layer, pos, head, v)
    assert p != ffi.NULL
    st = eng.kv_stats()
    n = eng.info.head_dim                # v_dim = head_dim in these models
    dt = np.float16 if st.elem_bytes == 2 else np.float32
    return np.frombuffer(ffi.buffer(p, st.elem_bytes * n), dt).astype(np.float32)


FORCED = [int(t) for t in np.random.default_rng(8).integers(4, 512, 6)]


def logits_of(eng: Engine) -> list[np.ndarray]:
    """The prompt, then 6 teacher-forced decode steps: a logits row after each."""
    s = eng.add_sequence()
    rows = [eng.prefill(s, PROMPT).logits(0)]
    for tok in FORCED:
        rows.append(eng.step([(s, [tok])]).logits(0))
    eng.release(s)
    return rows


def test_half_pages_store_rounded_rows_and_attend_close_to_float(model: Path,
                                                                 kv_path: str) -> None:
    with Engine.load(model, threads=2, max_seqs=2) as e32, \
            Engine.load(model, threads=2, max_seqs=2, kv_f16=True) as e16:
        s32, s16 = e32.kv_stats(), e16.kv_stats()
        assert (s32.elem_bytes, s16.elem_bytes) == (4, 2)
        # the default pool keeps its bytes: twice the pages of half the size
        assert s16.page_bytes * 2 == s32.page_bytes and s16.n_pages == 2 * s32.n_pages
        a, b = e32.add_sequence(), e16.add_sequence()
        e32.step([(a, PROMPT)])
        e16.step([(b, PROMPT)])
        window = e32.info.window or len(PROMPT)
        held = range(max(0, len(PROMPT) - window + 1), len(PROMPT))   # not yet released
        assert len(held) >= 7
        for pos in held:                        # layer 0: nothing attended before its K/V
            for head in range(e32.info.n_kv_heads):
                for v in (0, 1):
                    want = kv_row(e32, a.id, 0, pos, head, v).astype(np.float16)
                    got = kv_row(e16, b.id, 0, pos, head, v)
                    assert np.array_equal(got, want.astype(np.float32)), (pos, head, v)
        e32.release(a)
        e16.release(b)
        rels = [float(np.linalg.norm(r16 - r32) / np.linalg.norm(r32))
                for r32, r16 in zip(logits_of(e32), logits_of(e16), strict=True)]
        print(kv_path, model.name, "relative L2 f16 vs f32 KV:", [f"{r:.1e}" for r in rels])
        assert max(rels) < 5e-3, rels


def test_both_paths_agree_and_each_is_deterministic(model: Path) -> None:
    got = {}
    for name in ("ref", "f16c"):
        if lib.aotx_kv_f16_force(name.encode()) != 0:
            continue
        try:
            with Engine.load(model, threads=2, max_seqs=2, kv_f16=True) as eng:
                first, again = logits_of(eng), logits_of(eng)
        finally:
            assert lib.aotx_kv_f16_force(b"auto") == 0
        assert all(np.array_equal(x, y) for x, y in zip(first, again, strict=True))
        got[name] = first
    if len(got) == 2:
        for r, f in zip(got["ref"], got["f16c"], strict=True):
            assert float(np.linalg.norm(r - f) / np.linalg.norm(r)) < 1e-4


def test_half_pages_are_batch_invariant(kv_path: str, tmp_path: Path) -> None:
    """A sequence's logits with half pages: alone, in a batch with others, with 1 thread
    (the matmul kernels in their invariant mode, AOTX_INVARIANT=1: it changes only the
    AVX-512 tiles, which are not batch-invariant by default)."""
    model = sg.write_model(tmp_path / "inv.gguf", sg.Spec())      # every tensor type
    prompts = [[int(t) for t in np.random.default_rng(50 + i).integers(4, 512, 3 + 2 * i)]
               for i in range(6)]

    def run(threads: int, group: list[int]) -> dict[int, list[bytes]]:
        with Engine.load(model, threads=threads, max_seqs=6, kv_f16=True) as eng:
            seqs = [eng.add_sequence() for _ in group]
            out: dict[int, list[bytes]] = {i: [] for i in group}
            res = eng.step([(s, prompts[i]) for s, i in zip(seqs, group, strict=True)])
            for _ in range(4):
                toks = []
                for row, i in enumerate(group):
                    lg = res.logits(row)
                    out[i].append(lg.tobytes())
                    toks.append(int(np.argmax(lg)))
                res = eng.step([(s, [t]) for s, t in zip(seqs, toks, strict=True)])
            return out

    assert lib.aotx_kernel_invariant(1) == 0
    try:
        alone: dict[int, list[bytes]] = {}
        for i in range(len(prompts)):
            alone.update(run(2, [i]))
        assert run(2, [5, 3, 1, 0, 2, 4]) == alone
        assert run(1, list(range(6))) == alone
    finally:
        assert lib.aotx_kernel_invariant(0) == 0
