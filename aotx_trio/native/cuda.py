"""The CUDA area of the native library (csrc/cuda/, docs/engine.md "CUDA") and the GPUs
of this machine.

Every build carries the host side (:func:`build_info`, :func:`graph_buckets`,
:func:`plan_pool`, :func:`page_table_mirror`, ...); the device calls (:class:`Device`)
need a build with the CUDA kernels (``aotx_cuda_available()``) and raise
``cuda_not_built`` otherwise.  :func:`list_devices` reads the GPUs through
``cuda-python`` (the ``cuda`` extra, imported only when asked) and backs ``aotx
devices``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from aotx_trio import errors
from aotx_trio.native.lib import check, error_for, ffi, lib

#: tensor types the device kernels take (csrc/engine/aotx_kernels.h numbering)
T_Q8_0 = 8
T_Q4_K = 12


def compiled() -> bool:
    """True when this library was built with the CUDA kernels."""
    return bool(lib.aotx_cuda_available())


def build_info() -> dict[str, Any]:
    b = ffi.new("aotx_cuda_build *")
    lib.aotx_cuda_build_info(b)
    return {"compiled": bool(b.compiled), "runtime_version": int(b.runtime_version),
            "archs": [a for a in ffi.string(b.archs).decode().split(",") if a]}


def last_error() -> str:
    """The last CUDA failure of this thread, naming the call and CUDA's error."""
    return str(ffi.string(lib.aotx_cuda_last_error()).decode())


def _check(rc: int) -> int:
    """check() with the failed CUDA call named for the CUDA codes (9xx)."""
    if rc == 0:
        return rc
    detail = last_error() if -1000 < rc <= -900 else None
    return check(rc, detail or None)


def error_code(cuda_error: int) -> int:
    """Our code for a CUDA runtime error number (0 for cudaSuccess)."""
    return int(lib.aotx_cuda_error_code(cuda_error))


# --------------------------------------------------------------------------- host plans

MAX_BUCKETS = 64


def graph_buckets(max_seqs: int) -> list[int]:
    """The batch sizes a decode step's CUDA graphs are captured for."""
    out = ffi.new("int32_t[]", MAX_BUCKETS)
    n = int(lib.aotx_cuda_graph_buckets(max_seqs, out, MAX_BUCKETS))
    if n < 0:
        check(n, f"max_seqs={max_seqs}")
    return [int(out[i]) for i in range(n)]


def graph_bucket(buckets: list[int], n: int) -> int | None:
    """The bucket that n sequences replay (the smallest >= n), None past the largest."""
    arr = ffi.new("int32_t[]", buckets)
    i = int(lib.aotx_cuda_graph_bucket(arr, len(buckets), n))
    if i < -1:
        check(i, f"n={n}")
    return None if i == -1 else buckets[i]


@dataclass(frozen=True)
class Dims:
    """What the step's scratch depends on (``aotx_cuda_dims``)."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    v_dim: int
    d_ff: int
    n_vocab: int
    max_batch_tokens: int
    max_seqs: int
    max_pages_per_seq: int
    n_groups: int


_SCRATCH_PARTS = ("x", "xn", "q", "k", "v", "attn", "gate", "up", "act", "logits", "mirror",
                  "tokens")


def scratch_plan(dims: Dims) -> dict[str, int]:
    """Bytes of each step buffer on the device (256-byte aligned) and their ``total``."""
    d = ffi.new("aotx_cuda_dims *", asdict(dims))
    out = ffi.new("aotx_cuda_scratch *")
    check(lib.aotx_cuda_scratch_plan(d, out), str(dims))
    return {name: int(getattr(out, name)) for name in (*_SCRATCH_PARTS, "total")}


@dataclass(frozen=True)
class PoolPlan:
    budget: int      # free bytes x fraction
    needed: int      # weights + scratch + reserve + one full sequence's pages
    n_pages: int
    kv_bytes: int


def plan_pool(*, free_bytes: int, fraction: float, weight_bytes: int, scratch_bytes: int,
              reserve_bytes: int, page_bytes: int, min_pages: int, max_pages: int = 0,
              ) -> PoolPlan:
    """Size the KV pool in a device's free memory (``engine.gpu_memory_fraction`` is
    ``fraction``); ``cuda_model_too_large`` names the bytes needed and the budget."""
    if not 0.0 < fraction <= 1.0:
        raise errors.InvalidParams("engine.gpu_memory_fraction", "range",
                                   f"gpu_memory_fraction {fraction} is outside (0, 1]")
    p = ffi.new("aotx_cuda_plan_in *", {
        "free_bytes": free_bytes, "fraction": fraction, "weight_bytes": weight_bytes,
        "scratch_bytes": scratch_bytes, "reserve_bytes": reserve_bytes,
        "page_bytes": page_bytes, "min_pages": min_pages, "max_pages": max_pages})
    out = ffi.new("aotx_cuda_plan *")
    rc = int(lib.aotx_cuda_plan_pool(p, out))
    if rc:
        detail = None
        if rc == lib.AOTX_E_CUDA_TOO_LARGE:
            detail = (f"needs {out.needed} bytes (weights {weight_bytes}, scratch "
                      f"{scratch_bytes}, reserve {reserve_bytes}, KV {min_pages} pages of "
                      f"{page_bytes}), budget {out.budget} bytes = {fraction} of "
                      f"{free_bytes} free")
        raise error_for(rc, detail, needed_bytes=int(out.needed), budget_bytes=int(out.budget),
                        free_bytes=free_bytes)
    return PoolPlan(budget=int(out.budget), needed=int(out.needed), n_pages=int(out.n_pages),
                    kv_bytes=int(out.kv_bytes))


def act_bytes(type_: int, cols: int, n_tok: int) -> int:
    """Bytes of the device activation layout (``aotx_cuda_act_bytes``)."""
    n = int(lib.aotx_cuda_act_bytes(type_, cols, n_tok))
    if n < 0:
        check(n, f"type {type_}, cols {cols}")
    return n


_LAYOUT = ("page_elems", "k_off", "v_off", "k_tok", "v_tok", "page_tokens", "elem_bytes",
           "window")


def page_table_mirror(kv: Any, layer: int, window: int, seqs: list[int],
                      ) -> tuple[np.ndarray[Any, np.dtype[np.int32]], dict[str, int]]:
    """The page-table mirror of a decode batch for one layer (what is copied to the
    device, ``aotx_cuda_pt_build``) and the layer's page layout."""
    arr = ffi.new("uint32_t[]", seqs) if seqs else ffi.NULL
    count = ffi.new("int64_t *")
    layout = ffi.new("aotx_cuda_kv_layout *")
    rc = int(lib.aotx_cuda_pt_build(kv, layer, window, len(seqs), arr, ffi.NULL, 0, count,
                                    layout))
    if rc not in (0, lib.AOTX_E_BUFFER_TOO_SMALL):
        check(rc, f"layer {layer}, sequences {seqs}")
    out = np.zeros(int(count[0]), dtype=np.int32)
    check(lib.aotx_cuda_pt_build(kv, layer, window, len(seqs), arr,
                                 ffi.from_buffer("int32_t[]", out), out.size, count, layout))
    return out, {name: int(getattr(layout, name)) for name in _LAYOUT}


# --------------------------------------------------------------------------- device calls


class Device:
    """Device memory and the kernels of a CUDA build (tests and tools; synchronous
    copies, kernels on the default stream).  Pointers are ints."""

    def __init__(self, device: int = 0) -> None:
        if not compiled():
            raise error_for(lib.AOTX_E_CUDA_NOT_BUILT)
        n = ffi.new("int32_t *")
        _check(lib.aotx_cuda_device_count(n))
        if device >= n[0]:
            raise error_for(lib.AOTX_E_CUDA_NO_DEVICE, f"device {device} of {n[0]}")
        _check(lib.aotx_cuda_set_device(device))
        self._owned: list[int] = []

    def mem_info(self) -> tuple[int, int]:
        free, total = ffi.new("int64_t *"), ffi.new("int64_t *")
        _check(lib.aotx_cuda_mem_info(free, total))
        return int(free[0]), int(total[0])

    def alloc(self, nbytes: int) -> int:
        out = ffi.new("void **")
        _check(lib.aotx_cuda_malloc(max(nbytes, 1), out))
        ptr = int(ffi.cast("uintptr_t", out[0]))
        self._owned.append(ptr)
        return ptr

    def upload(self, host: np.ndarray[Any, Any]) -> int:
        """A new device buffer holding the array's bytes."""
        data = np.ascontiguousarray(host)
        ptr = self.alloc(data.nbytes)
        _check(lib.aotx_cuda_upload(_p(ptr), ffi.from_buffer(data), data.nbytes))
        return ptr

    def download(self, ptr: int, shape: tuple[int, ...] | int, dtype: Any,
                 ) -> np.ndarray[Any, Any]:
        out = np.empty(shape, dtype=dtype)
        _check(lib.aotx_cuda_download(ffi.from_buffer(out), _p(ptr), out.nbytes))
        return out

    def sync(self) -> None:
        _check(lib.aotx_cuda_sync())

    def close(self) -> None:
        while self._owned:
            _check(lib.aotx_cuda_free(_p(self._owned.pop())))

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # kernels (arguments as in csrc/cuda/aotx_cuda_gpu.h; pointers from alloc/upload)

    def quantize(self, type_: int, x: int, ldx: int, n_tok: int, cols: int, act: int) -> None:
        _check(lib.aotx_cuda_quantize(type_, _f(x), ldx, n_tok, cols, _p(act), ffi.NULL))

    def matvec(self, type_: int, w: int, rows: int, cols: int, act: int, n_tok: int, y: int,
               ldy: int) -> None:
        _check(lib.aotx_cuda_matvec(type_, _p(w), rows, cols, _p(act), n_tok, _f(y), ldy,
                                    ffi.NULL))

    def rmsnorm(self, out: int, x: int, w: int, rows: int, n: int, eps: float) -> None:
        _check(lib.aotx_cuda_rmsnorm(_f(out), _f(x), _f(w), rows, n, eps, ffi.NULL))

    def rope(self, x: int, n_tok: int, n_heads: int, head_dim: int, n_rot: int, pos: int,
             inv_freq: int, pos_scale: float, neox: bool) -> None:
        _check(lib.aotx_cuda_rope(_f(x), n_tok, n_heads, head_dim, n_rot,
                                  ffi.cast("int32_t *", pos), _f(inv_freq), pos_scale,
                                  int(neox), ffi.NULL))

    def attention_decode(self, *, n: int, n_heads: int, n_kv_heads: int, head_dim: int,
                         v_dim: int, scale: float, layout: dict[str, int], mirror: int,
                         pages: int, q: int, out: int) -> None:
        a = _paged("aotx_cuda_attn *", layout, mirror, pages, n=n, n_heads=n_heads,
                   n_kv_heads=n_kv_heads, head_dim=head_dim, v_dim=v_dim, scale=scale, q=_f(q),
                   out=_f(out))
        _check(lib.aotx_cuda_attention_decode(a, ffi.NULL))

    def kv_write_decode(self, *, n: int, n_kv_heads: int, k_dim: int, v_dim: int,
                        layout: dict[str, int], mirror: int, pages: int, k: int, v: int) -> None:
        w = _paged("aotx_cuda_kv_rows *", layout, mirror, pages, n=n, n_kv_heads=n_kv_heads,
                   k_dim=k_dim, v_dim=v_dim, k=_f(k), v=_f(v))
        _check(lib.aotx_cuda_kv_write_decode(w, ffi.NULL))


def _paged(ctype: str, layout: dict[str, int], mirror: int, pages: int, **fields: Any) -> Any:
    """A struct of a call over KV pages: the layer's layout, the mirror, the pages and
    the call's own fields."""
    return ffi.new(ctype, {**fields, "layout": {name: layout[name] for name in _LAYOUT},
                           "mirror": ffi.cast("int32_t *", mirror), "pages": _p(pages)})


def _p(ptr: int) -> Any:
    return ffi.cast("void *", ptr)


def _f(ptr: int) -> Any:
    return ffi.cast("float *", ptr)


# --------------------------------------------------------------------------- aotx devices


def list_devices() -> tuple[list[dict[str, Any]], str | None]:
    """The GPUs the driver sees through cuda-python: name, compute capability, memory
    total and free, driver version; and why the list is empty when it is (None if not)."""
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        try:
            from cuda import cuda as cu  # older cuda-python  # type: ignore[no-redef]
        except ImportError:
            return [], "cuda-python is not installed (pip install 'aotx-trio[cuda]')"

    def ok(res: Any) -> Any:
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(_driver_error(cu, err))
        return rest[0] if len(rest) == 1 else tuple(rest)

    try:
        ok(cu.cuInit(0))
        driver = int(ok(cu.cuDriverGetVersion()))
        count = int(ok(cu.cuDeviceGetCount()))
    except RuntimeError as exc:
        return [], f"no CUDA driver or device: {exc}"
    except Exception as exc:   # the bindings could not load libcuda at all
        return [], f"no CUDA driver: {type(exc).__name__}: {exc}"
    out: list[dict[str, Any]] = []
    try:
        for i in range(count):
            out.append(_device(cu, ok, i, driver))
    except RuntimeError as exc:
        return out, f"reading device {len(out)} failed: {exc}"
    return out, None if out else "the driver reports no CUDA device"


def _device(cu: Any, ok: Any, i: int, driver: int) -> dict[str, Any]:
    attr = cu.CUdevice_attribute
    dev = ok(cu.cuDeviceGet(i))
    name = ok(cu.cuDeviceGetName(256, dev))
    major = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    total = ok(cu.cuDeviceTotalMem(dev))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))   # free memory needs a context
    try:
        ok(cu.cuCtxPushCurrent(ctx))
        free, _ = ok(cu.cuMemGetInfo())
        ok(cu.cuCtxPopCurrent())
    finally:
        ok(cu.cuDevicePrimaryCtxRelease(dev))
    raw = name.encode() if isinstance(name, str) else bytes(name)
    return {"index": i, "name": raw.split(b"\0", 1)[0].decode(errors="replace"),
            "compute_capability": f"{int(major)}.{int(minor)}",
            "memory_total_bytes": int(total), "memory_free_bytes": int(free),
            "driver_version": f"{driver // 1000}.{driver % 1000 // 10}"}


def _driver_error(cu: Any, err: Any) -> str:
    try:
        res, name = cu.cuGetErrorName(err)
        if int(res) == 0:
            return bytes(name).decode(errors="replace")
    except Exception:   # naming the error is best effort; the number stays
        pass
    return f"CUresult {int(err)}"


def devices_main(args: argparse.Namespace) -> int:
    """``aotx devices``: the GPUs as JSON on stdout (an empty list, and the reason on
    stderr, when there are none); exit 0 either way."""
    devices, why = list_devices()
    print(json.dumps({"devices": devices, "library": build_info()}, indent=2))
    if why:
        print(f"aotx devices: {why}", file=sys.stderr)
    return 0
