"""csrc/engine/threads/threadpool.c: every worker runs every section exactly once, in order."""

from __future__ import annotations

import pytest

from aotx_trio.native.lib import check, ffi, lib


def make(n: int) -> object:
    out = ffi.new("aotx_pool **")
    check(lib.aotx_pool_new(n, out))
    return out[0]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_sections_run_on_every_worker(n: int) -> None:
    p = make(n)
    try:
        assert lib.aotx_pool_size(p) == n
        ns = ffi.new("int64_t *")
        # many short sections back to back (the decode-step pattern)
        assert lib.aotx_pool_selftest(p, 2000 if n <= 2 else 200, ns) == 0
        assert ns[0] > 0
    finally:
        lib.aotx_pool_free(p)


def test_sections_after_workers_fell_asleep() -> None:
    import time

    p = make(3)
    try:
        for _ in range(3):
            time.sleep(0.03)   # long enough for the spinners to sleep on the condvar
            assert lib.aotx_pool_selftest(p, 5, ffi.NULL) == 0
    finally:
        lib.aotx_pool_free(p)


def test_default_size_and_bad_arguments() -> None:
    p = make(0)
    try:
        assert lib.aotx_pool_size(p) >= 1
    finally:
        lib.aotx_pool_free(p)
    out = ffi.new("aotx_pool **")
    assert lib.aotx_pool_new(-1, out) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_pool_new(100000, out) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_pool_selftest(ffi.NULL, 1, ffi.NULL) == lib.AOTX_E_INVALID_ARGUMENT
    lib.aotx_pool_free(ffi.NULL)
