"""csrc/engine/sampling/sample.c: greedy, temperature, top-p, seeded determinism."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aotx_trio.native.lib import ffi, lib


class Sampler:
    def __init__(self, n: int, seed: int) -> None:
        self.rng = ffi.new("aotx_rng *")
        lib.aotx_rng_seed(self.rng, seed)
        self.probs = ffi.new("float[]", n)
        self.idx = ffi.new("int32_t[]", n)
        self.p = ffi.new("aotx_sample_params *")

    def __call__(self, logits: Any, temperature: float, top_p: float = 1.0) -> int:
        arr = np.ascontiguousarray(logits, dtype=np.float32)
        self.p.temperature, self.p.top_p = temperature, top_p
        return int(lib.aotx_sample(ffi.from_buffer("float[]", arr), len(arr), self.p, self.rng,
                                   self.probs, self.idx))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-50, 50, allow_nan=False, width=32), min_size=1, max_size=300))
def test_greedy_is_argmax(values: list[float]) -> None:
    x = np.array(values, dtype=np.float32)
    s = Sampler(len(x), 1)
    want = int(np.argmax(x))   # numpy: first maximum, as we specify
    assert s(x, 0.0) == want
    assert s(x, -1.0) == want
    assert lib.aotx_argmax(ffi.from_buffer("float[]", x), len(x)) == want


def test_nan_counts_as_minus_infinity() -> None:
    x = np.array([np.nan, 1.0, 3.0, np.nan], dtype=np.float32)
    assert Sampler(4, 0)(x, 0.0) == 2
    assert all(Sampler(4, k)(x, 1.0) in (1, 2) for k in range(20))


def test_same_seed_same_tokens() -> None:
    rng = np.random.default_rng(3)
    logits = [rng.standard_normal(1000).astype(np.float32) for _ in range(50)]
    runs = []
    for seed in (7, 7, 8):
        s = Sampler(1000, seed)
        runs.append([s(x, 0.9, 0.95) for x in logits])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_rng_stream_is_fixed() -> None:
    """The PRNG is part of the contract (seeded runs reproduce across builds)."""
    r = ffi.new("aotx_rng *")
    lib.aotx_rng_seed(r, 0)
    first = [int(lib.aotx_rng_next(r)) for _ in range(3)]
    lib.aotx_rng_seed(r, 0)
    assert [int(lib.aotx_rng_next(r)) for _ in range(3)] == first
    u = [lib.aotx_rng_uniform(r) for _ in range(1000)]
    assert 0.0 <= min(u) and max(u) < 1.0 and abs(sum(u) / 1000 - 0.5) < 0.05


def test_temperature_follows_the_softmax() -> None:
    x = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float32))
    s = Sampler(3, 11)
    counts = np.bincount([s(x, 1.0) for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(counts, [0.5, 0.3, 0.2], atol=0.03)
    # a high temperature flattens the distribution
    counts = np.bincount([s(x, 100.0) for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(counts, [1 / 3] * 3, atol=0.03)


def test_top_p_keeps_the_shortest_prefix() -> None:
    x = np.log(np.array([0.2, 0.5, 0.3], dtype=np.float32))
    s = Sampler(3, 5)
    assert {s(x, 1.0, 0.5) for _ in range(200)} == {1}            # 0.5 reaches 0.5
    assert {s(x, 1.0, 0.55) for _ in range(300)} == {1, 2}        # needs 0.5 + 0.3
    assert {s(x, 1.0, 0.81) for _ in range(500)} == {0, 1, 2}
    assert {s(x, 1.0, 1e-6) for _ in range(100)} == {1}           # tiny top_p: the top token
    assert {s(x, 1.0, 0.0) for _ in range(100)} == {1}            # 0: greedy
    counts = np.bincount([s(x, 1.0, 0.55) for _ in range(4000)], minlength=3) / 4000
    assert np.allclose(counts, [0, 0.5 / 0.8, 0.3 / 0.8], atol=0.03)


def test_top_p_ties_prefer_lower_ids() -> None:
    x = np.zeros(4, dtype=np.float32)                 # four tokens at 0.25
    s = Sampler(4, 9)
    assert {s(x, 1.0, 0.5) for _ in range(300)} == {0, 1}


def test_top_p_on_a_large_flat_tail() -> None:
    """The candidate search widens until it holds the nucleus."""
    n = 50000
    x = np.zeros(n, dtype=np.float32)
    x[123] = math.log(n * 0.3)        # one token with ~23% of the mass
    s = Sampler(n, 2)
    got = {s(x, 1.0, 0.9) for _ in range(300)}
    assert 123 in got and len(got) > 50
    assert {s(x, 1.0, 0.2) for _ in range(50)} == {123}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-4, 4, allow_nan=False, width=32), min_size=2, max_size=60),
       st.floats(0.05, 0.99), st.integers(0, 2**32))
@example([-2.220446049250313e-16, 0.0], 0.5, 0)   # two tokens tied in float32
def test_top_p_draws_only_from_the_nucleus(values: list[float], top_p: float, seed: int) -> None:
    x = np.array(values, dtype=np.float32)
    p = np.exp((x - x.max()).astype(np.float64))
    p /= p.sum()
    order = sorted(range(len(x)), key=lambda i: (-p[i], i))
    cum, nucleus = 0.0, set()
    for i in order:
        nucleus.add(i)
        cum += p[i]
        if cum >= top_p - 1e-5:   # float32 probabilities in C: allow one more at the edge
            break
    edge = {order[len(nucleus)]} if len(nucleus) < len(order) else set()
    s = Sampler(len(x), seed)
    got = {s(x, 1.0, top_p) for _ in range(200)}
    assert got <= nucleus | edge
    # the most probable token is drawn (or one tied with it in the C sampler's float32)
    top = {i for i in order if np.float32(p[i]) == np.float32(p[order[0]])}
    assert got & top or len(nucleus) > 1
