"""csrc/engine/kv/kv.c: page accounting, reservations, sharing, sliding-window release."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aotx_trio import errors
from aotx_trio.native.lib import check, ffi, lib

PT = 16


def make(n_pages: int = 64, window: int = 0, n_layers: int = 6, sliding: list[int] | None = None,
         max_seqs: int = 8, max_tokens: int = 1024) -> Any:
    p = ffi.new("aotx_kv_params *")
    p.n_pages, p.page_tokens, p.max_seqs, p.max_tokens = n_pages, PT, max_seqs, max_tokens
    p.n_layers, p.n_kv_heads, p.k_dim, p.v_dim, p.window = n_layers, 1, 8, 8, window
    keep = None
    if sliding is not None:
        keep = ffi.new("uint8_t[]", sliding)
        p.sliding = keep
    out = ffi.new("aotx_kv_pool **")
    check(lib.aotx_kv_new(p, out))
    return out[0]


@pytest.fixture
def pool() -> Iterator[Any]:
    kv = make()
    yield kv
    lib.aotx_kv_free(kv)


def stats(kv: Any) -> Any:
    s = ffi.new("aotx_kv_stats *")
    lib.aotx_kv_stats_get(kv, s)
    return s


def info(kv: Any, seq: int) -> Any:
    i = ffi.new("aotx_kv_seq_info *")
    check(lib.aotx_kv_seq_info_get(kv, seq, i))
    return i


def new_seq(kv: Any) -> int:
    s = ffi.new("uint32_t *")
    check(lib.aotx_kv_seq_new(kv, s))
    return int(s[0])


def test_grow_allocates_whole_pages(pool: Any) -> None:
    s = new_seq(pool)
    check(lib.aotx_kv_seq_grow(pool, s, 1))
    assert stats(pool).used_pages == 1   # one group: all layers global
    check(lib.aotx_kv_seq_grow(pool, s, 15))
    assert stats(pool).used_pages == 1
    check(lib.aotx_kv_seq_grow(pool, s, 1))
    st_ = stats(pool)
    assert st_.used_pages == 2 and st_.tokens_held == 17
    assert st_.slots_held - st_.slots_live == 15   # only the last page partly empty
    check(lib.aotx_kv_seq_free(pool, s))
    assert stats(pool).used_pages == 0 and stats(pool).free_pages == 64


def test_exhaustion_is_a_refusal_and_changes_nothing() -> None:
    kv = make(n_pages=4)
    try:
        a, b = new_seq(kv), new_seq(kv)
        check(lib.aotx_kv_seq_grow(kv, a, 48))
        before = stats(kv).free_pages
        rc = lib.aotx_kv_seq_grow(kv, b, 17)
        assert rc == lib.AOTX_R_KV_PAGES_EXHAUSTED and rc > 0
        assert info(kv, b).length == 0 and stats(kv).free_pages == before
        with pytest.raises(errors.OverCapacity):
            check(rc)
        check(lib.aotx_kv_seq_grow(kv, b, 16))
    finally:
        lib.aotx_kv_free(kv)


def test_reservation_is_conservative_admission() -> None:
    kv = make(n_pages=4)
    try:
        a, b = new_seq(kv), new_seq(kv)
        check(lib.aotx_kv_seq_reserve(kv, a, 40))          # 3 pages
        s = stats(kv)
        assert s.reserved_pages == 3 and s.free_pages == 1
        assert lib.aotx_kv_seq_reserve(kv, b, 20) == lib.AOTX_R_KV_PAGES_EXHAUSTED
        assert lib.aotx_kv_seq_grow(kv, b, 17) == lib.AOTX_R_KV_PAGES_EXHAUSTED
        check(lib.aotx_kv_seq_grow(kv, a, 40))              # served from the reservation
        s = stats(kv)
        assert s.reserved_pages == 0 and s.used_pages == 3 and s.free_pages == 1
        # shrink (an undone step) gives the reservation back
        check(lib.aotx_kv_seq_shrink(kv, a, 40))
        assert stats(kv).reserved_pages == 3
        check(lib.aotx_kv_seq_free(kv, a))
        assert stats(kv).reserved_pages == 0 and stats(kv).free_pages == 4
    finally:
        lib.aotx_kv_free(kv)


def test_gemma_layout_groups_and_sliding_release() -> None:
    sliding = [0 if (i + 1) % 6 == 0 else 1 for i in range(18)]
    kv = make(n_pages=400, window=64, n_layers=18, sliding=sliding)
    try:
        s = stats(kv)
        assert s.n_groups == 6 and s.layers_per_group == 3    # gcd(15 sliding, 3 global)
        q = new_seq(kv)
        for _ in range(40):   # 40 steps of 8 positions = 320 positions
            check(lib.aotx_kv_seq_grow(kv, q, 8))
            check(lib.aotx_kv_seq_trim(kv, q))
        i = info(kv, q)
        # global group: 20 pages; each of 5 sliding groups keeps the pages a
        # future query can see (positions >= 320 - 64 + 1 = 257 -> pages 16..19)
        assert i.pages == 20 + 5 * 4
        assert i.released == 5 * 16
        assert stats(kv).used_pages == 40
        check(lib.aotx_kv_seq_free(kv, q))
        assert stats(kv).used_pages == 0
    finally:
        lib.aotx_kv_free(kv)


def locate(kv: Any, seq: int, layer: int, pos: int, head: int = 0, v: int = 0) -> tuple[int, int]:
    page, off = ffi.new("int32_t *"), ffi.new("int64_t *")
    check(lib.aotx_kv_locate(kv, seq, layer, pos, head, v, page, off))
    return int(page[0]), int(off[0])


def test_fork_shares_full_pages_with_refcounts(pool: Any) -> None:
    a = new_seq(pool)
    check(lib.aotx_kv_seq_grow(pool, a, 40))
    where = locate(pool, a, 0, 5)
    d, shared = ffi.new("uint32_t *"), ffi.new("int32_t *")
    check(lib.aotx_kv_seq_fork(pool, a, 37, d, shared))
    assert shared[0] == 32                       # whole pages only
    s = stats(pool)
    assert s.used_pages == 3 and s.shared_pages == 2
    assert locate(pool, d[0], 0, 5) == where     # the child reads the parent's slot
    check(lib.aotx_kv_seq_grow(pool, d[0], 5))   # the child writes its own page
    assert stats(pool).used_pages == 4
    assert locate(pool, d[0], 0, 33)[0] != locate(pool, a, 0, 33)[0]
    check(lib.aotx_kv_seq_free(pool, a))
    s = stats(pool)
    assert s.used_pages == 3 and s.shared_pages == 0  # the child still holds the prefix
    assert locate(pool, d[0], 0, 5) == where
    check(lib.aotx_kv_seq_free(pool, d[0]))
    assert stats(pool).used_pages == 0


def test_locate_follows_the_page_layout(pool: Any) -> None:
    """K: [g][page_tokens][n_kv_heads][k_dim], then V (aotx_kv.h); g = 6 layers here."""
    a = new_seq(pool)
    check(lib.aotx_kv_seq_grow(pool, a, 20))
    k_tok = v_tok = 8                               # n_kv_heads 1 x dim 8
    page0, off = locate(pool, a, 2, 3)
    assert off == 2 * PT * k_tok + 3 * k_tok
    _, voff = locate(pool, a, 2, 3, v=1)
    assert voff == 6 * PT * k_tok + 2 * PT * v_tok + 3 * v_tok
    page1, off = locate(pool, a, 0, 17)
    assert page1 != page0 and off == 1 * k_tok
    assert stats(pool).page_bytes == 6 * PT * (k_tok + v_tok) * 4
    page, o = ffi.new("int32_t *"), ffi.new("int64_t *")
    assert lib.aotx_kv_locate(pool, a, 0, 20, 0, 0, page, o) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_kv_locate(pool, a, 0, 0, 1, 0, page, o) == lib.AOTX_E_INVALID_ARGUMENT
    assert lib.aotx_kv_locate(pool, a, 6, 0, 0, 0, page, o) == lib.AOTX_E_INVALID_ARGUMENT


def test_accounting_holds_no_storage() -> None:
    """The pool is accounting only: pages whose storage would exceed any address
    space (4096 pages x 128 GiB) are counted, reserved, shared and freed."""
    p = ffi.new("aotx_kv_params *")
    p.n_pages, p.page_tokens, p.max_seqs, p.max_tokens = 4096, PT, 4, 4096
    p.n_layers, p.n_kv_heads, p.k_dim, p.v_dim, p.window = 1, 1024, 1 << 20, 1 << 20, 0
    out = ffi.new("aotx_kv_pool **")
    check(lib.aotx_kv_new(p, out))
    kv = out[0]
    try:
        s = stats(kv)
        assert s.page_bytes == PT * 1024 * (2 << 20) * 4 == 1 << 37
        assert s.n_pages * s.page_bytes > 1 << 47     # more than x86-64 user space
        a = new_seq(kv)
        check(lib.aotx_kv_seq_reserve(kv, a, 100))
        check(lib.aotx_kv_seq_grow(kv, a, 64))
        d, shared = ffi.new("uint32_t *"), ffi.new("int32_t *")
        check(lib.aotx_kv_seq_fork(kv, a, 64, d, shared))
        assert stats(kv).shared_pages == 4 and locate(kv, d[0], 0, 63) == locate(kv, a, 0, 63)
        check(lib.aotx_kv_seq_free(kv, a))
        check(lib.aotx_kv_seq_free(kv, d[0]))
        assert stats(kv).free_pages == 4096
    finally:
        lib.aotx_kv_free(kv)


def test_storage_geometry_overflow_is_refused() -> None:
    p = ffi.new("aotx_kv_params *")
    p.n_pages, p.page_tokens, p.max_seqs, p.max_tokens = 4, 1 << 30, 1, 16
    p.n_layers, p.n_kv_heads, p.k_dim, p.v_dim = 1 << 20, 1 << 20, 1 << 20, 1
    out = ffi.new("aotx_kv_pool **")
    assert lib.aotx_kv_new(p, out) == lib.AOTX_E_KV_PARAMS


def test_fork_refuses_released_window_pages() -> None:
    kv = make(n_pages=100, window=16, n_layers=2, sliding=[1, 0])
    try:
        a = new_seq(kv)
        check(lib.aotx_kv_seq_grow(kv, a, 100))
        check(lib.aotx_kv_seq_trim(kv, a))
        d, shared = ffi.new("uint32_t *"), ffi.new("int32_t *")
        assert lib.aotx_kv_seq_fork(kv, a, 48, d, shared) == lib.AOTX_R_KV_PREFIX_RELEASED
        check(lib.aotx_kv_seq_fork(kv, a, 96, d, shared))
        assert shared[0] == 96
    finally:
        lib.aotx_kv_free(kv)


def test_bad_ids_and_params(pool: Any) -> None:
    assert lib.aotx_kv_seq_grow(pool, 7, 1) == lib.AOTX_E_KV_SEQ
    assert lib.aotx_kv_seq_free(pool, 99) == lib.AOTX_E_KV_SEQ
    s = new_seq(pool)
    assert lib.aotx_kv_seq_grow(pool, s, 2000) == lib.AOTX_E_KV_CONTEXT
    p = ffi.new("aotx_kv_params *")
    out = ffi.new("aotx_kv_pool **")
    assert lib.aotx_kv_new(p, out) == lib.AOTX_E_KV_PARAMS
    for _ in range(7):
        new_seq(pool)
    sid = ffi.new("uint32_t *")
    assert lib.aotx_kv_seq_new(pool, sid) == lib.AOTX_R_KV_SEQS_EXHAUSTED


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40)), min_size=1, max_size=30))
def test_accounting_invariants(ops: list[tuple[int, int]]) -> None:
    kv = make(n_pages=48, window=20, n_layers=3, sliding=[1, 1, 0], max_seqs=4)
    try:
        live: list[int] = []
        for op, n in ops:
            if op == 0 and len(live) < 4:
                live.append(new_seq(kv))
            elif op == 1 and live:
                q = live[n % len(live)]
                rc = lib.aotx_kv_seq_grow(kv, q, n)
                assert rc in (0, lib.AOTX_R_KV_PAGES_EXHAUSTED)
                check(lib.aotx_kv_seq_trim(kv, q))
            elif op == 2 and live:
                check(lib.aotx_kv_seq_free(kv, live.pop(n % len(live))))
            elif op == 3 and live:
                rc = lib.aotx_kv_seq_reserve(kv, live[0], n)
                assert rc in (0, lib.AOTX_R_KV_PAGES_EXHAUSTED)
            s = stats(kv)
            assert s.used_pages + s.free_pages + s.reserved_pages == 48
            assert s.n_seqs == len(live)
            # waste: per sequence and group only the last page is partly empty
            assert s.slots_held - s.slots_live < len(live) * s.n_groups * PT + 1
        for q in live:
            check(lib.aotx_kv_seq_free(kv, q))
        s = stats(kv)
        assert s.used_pages == 0 and s.reserved_pages == 0
    finally:
        lib.aotx_kv_free(kv)
