"""csrc/cuda/ host side, on any machine: the build report and a CPU-only build, the CUDA
error mapping, the page-table mirror a decode batch copies to the device, the CUDA-graph
buckets, the buffer plan, the device activation layout, and ``aotx devices``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aotx_trio import errors
from aotx_trio.native import cuda
from aotx_trio.native.lib import check, error_for, ffi, lib

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- build


def test_build_report_matches_what_the_library_carries() -> None:
    info = cuda.build_info()
    assert info["compiled"] == cuda.compiled() == hasattr(lib, "aotx_cuda_malloc")
    if info["compiled"]:
        assert info["archs"] and all(a.rstrip("a").isdigit() for a in info["archs"])
        assert info["runtime_version"] >= 11000
    else:
        assert info == {"compiled": False, "runtime_version": 0, "archs": []}


def _no_gpu_here() -> bool:
    if not cuda.compiled():
        return True
    n = ffi.new("int32_t *")
    return bool(lib.aotx_cuda_device_count(n)) or n[0] == 0


@pytest.mark.skipif(not cuda.compiled(), reason="this library was built without CUDA")
@pytest.mark.skipif(not _no_gpu_here(), reason="a CUDA device is present (test_cuda_kernels.py)")
def test_a_cuda_build_without_a_device_answers_a_named_error() -> None:
    """The CUDA runtime's own answer on this machine (no driver, or no device) comes back
    as one of our codes, with the failed call named; nothing crashes."""
    with pytest.raises(errors.ConfigError) as err:
        cuda.Device()
    assert err.value.native in ("cuda_driver_unusable", "cuda_no_device")
    assert "cudaGetDeviceCount" in err.value.message
    assert "cudaGetDeviceCount" in cuda.last_error()


def _build(tmp: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "build.py", *args], cwd=ROOT, text=True,
                          capture_output=True, env={**os.environ, **env}, timeout=600)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_cpu_only_build_says_so_and_keeps_the_host_side(tmp_path: Path) -> None:
    out = tmp_path / "cpu"
    run = _build(tmp_path, {"AOTX_CUDA": "0"}, "--only", "cuda", "--out", str(out))
    assert run.returncode == 0, run.stderr
    assert "CUDA not built" in run.stderr
    probe = """
import json
from aotx_trio import errors
from aotx_trio.native import cuda
from aotx_trio.native.lib import lib
try:
    cuda.Device()
    refused = None
except errors.ConfigError as exc:
    refused = exc.native
print(json.dumps({"info": cuda.build_info(), "gpu_calls": hasattr(lib, "aotx_cuda_malloc"),
                  "refused": refused, "buckets": cuda.graph_buckets(8)}))
"""
    got = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, text=True, capture_output=True,
                         env={**os.environ, "AOTX_NATIVE_DIR": str(out)}, timeout=120)
    assert got.returncode == 0, got.stderr
    res = json.loads(got.stdout)
    assert res == {"info": {"compiled": False, "runtime_version": 0, "archs": []},
                   "gpu_calls": False, "refused": "cuda_not_built", "buckets": [1, 2, 4, 8]}


def test_asking_for_cuda_without_nvcc_is_refused_by_name(tmp_path: Path) -> None:
    env = {"AOTX_CUDA": "1", "CUDA_HOME": str(tmp_path / "none"), "PATH": str(tmp_path)}
    run = _build(tmp_path, env, "--only", "cuda", "--out", str(tmp_path / "x"))
    assert run.returncode != 0
    assert "AOTX_CUDA=1 but no nvcc" in run.stderr
    run = _build(tmp_path, {"AOTX_CUDA": "yes"}, "--only", "cuda", "--out", str(tmp_path / "x"))
    assert run.returncode != 0 and "must be 0 or 1" in run.stderr


def _build_module() -> Any:
    sys.path.insert(0, str(ROOT))
    try:
        import build
    finally:
        sys.path.remove(str(ROOT))
    return build


@pytest.mark.skipif(shutil.which("nvcc") is None or os.environ.get("AOTX_CUDA") == "0",
                    reason="no nvcc on PATH (or AOTX_CUDA=0): this machine builds CPU-only")
@pytest.mark.skipif("AOTX_NATIVE_DIR" in os.environ,
                    reason="another build is loaded (AOTX_NATIVE_DIR), not the default one")
def test_a_machine_with_nvcc_builds_the_cuda_kernels() -> None:
    """CI's machines have nvcc: the default build there compiles csrc/cuda (warnings as
    errors), so a kernel that stops compiling fails the install step, not a GPU run."""
    assert cuda.compiled()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
@pytest.mark.timeout(300)
def test_a_warning_in_a_cuda_source_fails_the_build(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LD_PRELOAD", raising=False)   # a sanitizer run's: not for nvcc
    build = _build_module()
    toolkit = build.find_cuda()
    assert toolkit is not None
    src = tmp_path / "warns.cu"
    src.write_text("__global__ void k(int *p) { int unused = 3; p[0] = 1; }\n")
    with pytest.raises(SystemExit) as err:
        build.compile_cuda(toolkit, [src], tmp_path / "obj")
    assert "nvcc failed on" in str(err.value) and "unused" in str(err.value)
    assert not list((tmp_path / "obj").glob("*.o"))


def test_build_only_cuda_brings_the_engine_along() -> None:
    build = _build_module()
    headers, sources = build.select(["cuda"])
    names = {h.name for h in headers}
    assert {"aotx_cuda.h", "aotx_kv.h", "aotx_kernels.h"} <= names
    assert "aotx_cuda_gpu.h" not in names                     # only with the kernels
    assert "aotx_cuda_gpu.h" in {h.name for h in build.select(["cuda"], cuda=True)[0]}
    assert any(s.name == "cuda_host.c" for s in sources)
    assert any(s.name == "kv.c" for s in sources)
    assert any(s.name == "tokenizer.c" for s in sources)   # the engine's own need
    assert not any(s.name.startswith("device") for s in sources)
    assert build.cuda_sources(["device"]) == []
    assert {s.name for s in build.cuda_sources(None)} >= {"cuda_matvec.cu", "cuda_attention.cu"}


# --------------------------------------------------------------------------- errors

# cudaError_t numbers (driver_types.h) and the code each becomes
CUDA_ERRORS = {
    0: None, 2: "cuda_out_of_memory", 100: "cuda_no_device", 101: "cuda_no_device",
    3: "cuda_driver_unusable", 34: "cuda_driver_unusable", 35: "cuda_driver_unusable",
    36: "cuda_driver_unusable", 803: "cuda_driver_unusable", 804: "cuda_driver_unusable",
    98: "cuda_arch_unsupported", 200: "cuda_arch_unsupported", 209: "cuda_arch_unsupported",
    218: "cuda_arch_unsupported", 222: "cuda_arch_unsupported",
    9: "cuda_launch_refused", 701: "cuda_launch_refused",
    700: "cuda_device_fault", 702: "cuda_device_fault", 710: "cuda_device_fault",
    714: "cuda_device_fault", 715: "cuda_device_fault", 716: "cuda_device_fault",
    717: "cuda_device_fault", 718: "cuda_device_fault", 719: "cuda_device_fault",
    1: "cuda_error", 999: "cuda_error", 12345: "cuda_error",
}


@pytest.mark.parametrize(("number", "name"), sorted(CUDA_ERRORS.items()))
def test_cuda_errors_map_to_named_codes(number: int, name: str | None) -> None:
    code = cuda.error_code(number)
    if name is None:
        assert code == 0
        return
    exc = error_for(code, "cudaSomething: cudaErrorX (text)")
    assert exc.native == name and code < 0
    want = errors.ConfigError if name in (
        "cuda_no_device", "cuda_driver_unusable", "cuda_arch_unsupported") else errors.NativeError
    assert type(exc) is want
    assert exc.message.endswith("cudaSomething: cudaErrorX (text)")


# --------------------------------------------------------------------------- graph buckets


def _expected_buckets(max_seqs: int) -> list[int]:
    out, b = [], 1
    while b < max_seqs:
        out.append(b)
        b = b * 2 if b < 8 else b + 8 if b < 64 else b + 32
    return [*out, max_seqs]


@pytest.mark.parametrize("max_seqs", [1, 2, 3, 8, 9, 20, 64, 65, 100, 256, 1000])
def test_graph_buckets_and_the_bucket_each_batch_replays(max_seqs: int) -> None:
    buckets = cuda.graph_buckets(max_seqs)
    assert buckets == _expected_buckets(max_seqs)
    assert buckets == sorted(set(buckets)) and buckets[-1] == max_seqs
    for n in range(1, max_seqs + 1):
        b = cuda.graph_bucket(buckets, n)
        assert b is not None and b >= n
        assert not any(n <= x < b for x in buckets)          # the smallest that holds n
    assert cuda.graph_bucket(buckets, max_seqs + 1) is None   # runs uncaptured
    with pytest.raises(errors.InvalidInput):
        cuda.graph_bucket(buckets, 0)


def test_graph_buckets_refuse_what_cannot_be_listed() -> None:
    with pytest.raises(errors.InvalidInput):
        cuda.graph_buckets(0)
    with pytest.raises(errors.NativeError) as err:   # more than 64 buckets
        cuda.graph_buckets(4000)
    assert err.value.native == "buffer_too_small"


# --------------------------------------------------------------------------- buffer plan


def _al(n: int) -> int:
    return (n + 255) // 256 * 256


def test_scratch_plan_is_each_buffer_aligned_and_their_sum() -> None:
    # Gemma 3 270M's shapes: d 640, 4 heads of 256, 1 kv head, d_ff 2048, vocab 262144
    dims = cuda.Dims(d_model=640, n_heads=4, n_kv_heads=1, head_dim=256, v_dim=256, d_ff=2048,
                     n_vocab=262144, max_batch_tokens=512, max_seqs=16, max_pages_per_seq=512,
                     n_groups=6)
    got = cuda.scratch_plan(dims)
    T = 512
    assert got["x"] == got["xn"] == _al(T * 640 * 4)
    assert got["q"] == _al(T * 4 * 256 * 4) and got["k"] == got["v"] == _al(T * 256 * 4)
    assert got["attn"] == _al(T * 4 * 256 * 4)
    assert got["gate"] == got["up"] == _al(T * 2048 * 4)
    # widest input: d_ff 2048; Q8_0: T x 2048 int8 + T x 64 scales; Q8_K32: T x 8 x 352
    assert got["act"] == _al(max(_al(T * 2048) + T * 64 * 4, T * 8 * 352))
    assert got["logits"] == _al(16 * 262144 * 4)
    assert got["mirror"] == 6 * _al(16 * (4 + 512) * 4)
    assert got["tokens"] == 3 * _al(T * 4)
    parts = {k: v for k, v in got.items() if k != "total"}
    assert got["total"] == sum(parts.values())
    assert all(v % 256 == 0 and v > 0 for v in parts.values())
    bigger = cuda.scratch_plan(cuda.Dims(**{**dims.__dict__, "max_batch_tokens": 1024}))
    assert bigger["total"] > got["total"]
    with pytest.raises(errors.InvalidInput):
        cuda.scratch_plan(cuda.Dims(**{**dims.__dict__, "n_kv_heads": 3}))   # 4 % 3


GiB = 1 << 30


def test_pool_plan_fills_the_budget_after_weights_scratch_and_reserve() -> None:
    p = cuda.plan_pool(free_bytes=100 * GiB, fraction=0.9, weight_bytes=10 * GiB,
                       scratch_bytes=GiB, reserve_bytes=GiB // 2, page_bytes=1 << 20,
                       min_pages=96)
    assert p.budget == int(100 * GiB * 0.9)
    assert p.n_pages == (p.budget - 10 * GiB - GiB - GiB // 2) // (1 << 20)
    assert p.kv_bytes == p.n_pages << 20
    assert p.needed == 10 * GiB + GiB + GiB // 2 + 96 * (1 << 20)
    capped = cuda.plan_pool(free_bytes=100 * GiB, fraction=0.9, weight_bytes=10 * GiB,
                            scratch_bytes=GiB, reserve_bytes=0, page_bytes=1 << 20, min_pages=96,
                            max_pages=5000)
    assert capped.n_pages == 5000


def test_a_model_that_does_not_fit_is_refused_naming_bytes() -> None:
    with pytest.raises(errors.ConfigError) as err:
        cuda.plan_pool(free_bytes=8 * GiB, fraction=0.5, weight_bytes=3 * GiB,
                       scratch_bytes=GiB // 2, reserve_bytes=GiB // 4, page_bytes=1 << 20,
                       min_pages=512)
    e = err.value
    assert e.native == "cuda_model_too_large"
    needed = 3 * GiB + GiB // 2 + GiB // 4 + 512 * (1 << 20)
    assert e.fields["needed_bytes"] == needed and e.fields["budget_bytes"] == 4 * GiB
    assert f"needs {needed} bytes" in e.message and f"budget {4 * GiB} bytes" in e.message
    assert f"{8 * GiB} free" in e.message


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5, float("nan")])
def test_pool_plan_refuses_a_fraction_outside_0_1(fraction: float) -> None:
    with pytest.raises(errors.InvalidParams) as err:
        cuda.plan_pool(free_bytes=GiB, fraction=fraction, weight_bytes=0, scratch_bytes=0,
                       reserve_bytes=0, page_bytes=4096, min_pages=1)
    assert err.value.fields["param"] == "engine.gpu_memory_fraction"


# --------------------------------------------------------------------------- activations


def test_device_activation_layouts() -> None:
    # Q8_0 family: int8 quants, then the scales at the next 256-byte boundary
    assert cuda.act_bytes(cuda.T_Q8_0, 64, 3) == 256 + 3 * 2 * 4
    assert cuda.act_bytes(cuda.T_Q8_0, 2048, 8) == 2048 * 8 + 8 * 64 * 4
    # k-quants: the CPU's Q8_K32 blocks, 352 bytes per 256 values
    assert cuda.act_bytes(cuda.T_Q4_K, 512, 2) == 2 * 2 * 352
    with pytest.raises(errors.InvalidInput) as err:
        cuda.act_bytes(cuda.T_Q4_K, 300, 1)
    assert err.value.native == "kernel_shape_invalid"
    with pytest.raises(errors.FormatError):
        cuda.act_bytes(6, 64, 1)   # Q5_0: no device kernel yet


# --------------------------------------------------------------------------- page tables

PT = 4


@pytest.fixture
def pool() -> Iterator[Any]:
    """6 layers, layers 0-3 sliding (window 6) and 4-5 global: groups of 2 layers."""
    p = ffi.new("aotx_kv_params *")
    p.n_pages, p.page_tokens, p.max_seqs, p.max_tokens = 256, PT, 8, 64
    p.n_layers, p.n_kv_heads, p.k_dim, p.v_dim, p.window = 6, 2, 8, 16, 6
    sliding = ffi.new("uint8_t[]", [1, 1, 1, 1, 0, 0])
    p.sliding = sliding
    p.kv_f16 = 1
    out = ffi.new("aotx_kv_pool **")
    check(lib.aotx_kv_new(p, out))
    yield out[0]
    lib.aotx_kv_free(out[0])


def _seq(kv: Any, length: int) -> int:
    s = ffi.new("uint32_t *")
    check(lib.aotx_kv_seq_new(kv, s))
    for i in range(length):        # one decode step at a time: the step grows the sequence by
        if i:                      # its token; the previous step's end trimmed the window
            check(lib.aotx_kv_seq_trim(kv, s[0]))
        check(lib.aotx_kv_seq_grow(kv, s[0], 1))
    return int(s[0])


def _locate(kv: Any, seq: int, layer: int, pos: int, head: int, v: int) -> tuple[int, int]:
    page, off = ffi.new("int32_t *"), ffi.new("int64_t *")
    check(lib.aotx_kv_locate(kv, seq, layer, pos, head, v, page, off))
    return int(page[0]), int(off[0])


@pytest.mark.parametrize(("layer", "window"), [(0, 6), (3, 6), (4, 0), (5, 0)])
def test_mirror_addresses_every_visible_row_where_the_pool_keeps_it(
        pool: Any, layer: int, window: int) -> None:
    seqs = [_seq(pool, n) for n in (1, 4, 5, 13, 30)]
    mirror, lay = cuda.page_table_mirror(pool, layer, window, seqs)
    assert lay["page_tokens"] == PT and lay["elem_bytes"] == 2 and lay["window"] == window
    assert lay["k_tok"] == 2 * 8 and lay["v_tok"] == 2 * 16
    entries = mirror[:4 * len(seqs)].reshape(-1, 4)
    expect_off = 4 * len(seqs)
    for i, (seq, length) in enumerate(zip(seqs, (1, 4, 5, 13, 30), strict=True)):
        n, lo, page0, off = (int(v) for v in entries[i])
        assert n == length
        assert lo == (max(0, length - window) if window else 0)
        assert page0 == lo // PT and off == expect_off
        expect_off += (length + PT - 1) // PT - page0
        for s in range(lo, length):          # each visible row: where the pool says it is
            page = int(mirror[off + s // PT - page0])
            for head in range(2):
                for v, dim, tok, base in ((0, 8, lay["k_tok"], lay["k_off"]),
                                          (1, 16, lay["v_tok"], lay["v_off"])):
                    assert _locate(pool, seq, layer, s, head, v) == (
                        page, base + (s % PT) * tok + head * dim)
    assert expect_off == mirror.size


def test_mirror_is_one_per_group_and_names_its_failures(pool: Any) -> None:
    seqs = [_seq(pool, 9), _seq(pool, 17)]
    m0, l0 = cuda.page_table_mirror(pool, 0, 6, seqs)
    m1, l1 = cuda.page_table_mirror(pool, 1, 6, seqs)   # same group, the next layer
    assert (m0 == m1).all() and l0["k_off"] != l1["k_off"]
    assert l1["k_off"] == l0["k_off"] + PT * l0["k_tok"]
    count = ffi.new("int64_t *")
    arr = ffi.new("uint32_t[]", seqs)
    small = ffi.new("int32_t[]", 3)
    assert lib.aotx_cuda_pt_build(pool, 0, 6, 2, arr, small, 3, count, ffi.NULL) == \
        lib.AOTX_E_BUFFER_TOO_SMALL
    assert count[0] == m0.size and list(small) == [0, 0, 0]   # nothing written
    empty, _ = cuda.page_table_mirror(pool, 0, 6, [])
    assert empty.size == 0
    with pytest.raises(errors.NotFound):
        cuda.page_table_mirror(pool, 0, 6, [7])             # not a live sequence
    with pytest.raises(errors.InvalidInput):
        cuda.page_table_mirror(pool, 6, 0, seqs)            # no layer 6
    # a global reading of a sliding layer reaches released pages: refused, not read
    with pytest.raises(errors.InvalidInput):
        cuda.page_table_mirror(pool, 0, 0, seqs)
    with pytest.raises(errors.InvalidInput):
        cuda.page_table_mirror(pool, 4, 0, [_seq(pool, 0)])  # empty sequence


# --------------------------------------------------------------------------- aotx devices


def _devices(*pre: str) -> subprocess.CompletedProcess[str]:
    code = "\n".join([*pre, "from aotx_trio.cli import main",
                      "raise SystemExit(main(['devices']))"])
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True, capture_output=True,
                          timeout=120)


def test_aotx_devices_without_cuda_python_lists_none_and_says_why() -> None:
    run = _devices("import sys", "sys.modules['cuda'] = None")   # as if not installed
    assert run.returncode == 0, run.stderr
    body = json.loads(run.stdout)
    assert body["devices"] == []
    assert body["library"] == cuda.build_info()
    assert "cuda-python is not installed" in run.stderr


@pytest.mark.skipif(not _no_gpu_here(), reason="a CUDA device is present")
def test_aotx_devices_on_a_machine_without_a_gpu() -> None:
    run = _devices()
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["devices"] == []
    assert run.stderr.startswith("aotx devices: ")
    assert "cuda-python is not installed" in run.stderr or "no CUDA" in run.stderr
