"""Batch invariance (issue 13 item 4): a sequence's logits do not depend on what else is in
the step, on its position in the batch, or on the thread count -- bit for bit, on every
kernel path this CPU runs (ref, avx2, avx512vnni; AVX-512 in its invariant mode,
AOTX_INVARIANT=1, the others always).  What makes a journaled generation
reproducible byte for byte.

16 prompts of 3..18 tokens are each generated greedily for 6 tokens: alone, in batches of
4 and of 8 (prefilled together in one step, then decoded together; the batch of 8 also in
reverse order), with 2 threads and with 1.  Every step's logits row must be identical.
The synthetic model has every tensor type the kernels run and an FFN wide enough for two
K slabs (1536 columns) in its down projection."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import synth_gguf as sg

from aotx_trio.native.engine import Engine
from aotx_trio.native.lib import lib

pytestmark = pytest.mark.timeout(300)

N_PROMPTS, N_GEN = 16, 6
PROMPTS = [[int(t) for t in np.random.default_rng(100 + i).integers(4, 512, 3 + i)]
           for i in range(N_PROMPTS)]
SPEC = sg.Spec(d_ff=1536, seed=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sg.write_model(tmp_path_factory.mktemp("inv") / "inv.gguf", SPEC)


@pytest.fixture(params=["ref", "avx2", "avx512vnni"])
def path(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    rc = lib.aotx_kernel_force(name.encode())
    if rc == lib.AOTX_E_UNSUPPORTED:
        pytest.skip(f"this CPU does not run {name}")
    assert rc == 0
    assert lib.aotx_kernel_invariant(1) == 0   # AOTX_INVARIANT=1: only AVX-512 changes
    assert lib.aotx_kernel_is_invariant() == 1
    yield name
    assert lib.aotx_kernel_invariant(0) == 0
    assert lib.aotx_kernel_force(b"auto") == 0


def generate(eng: Engine, group: Sequence[int]) -> dict[int, list[np.ndarray]]:
    """Prompts `group` (indices) in one batch: one prefill step for all, then N_GEN
    batched decode steps; {prompt index: [logits of each step]} (greedy)."""
    seqs = [eng.add_sequence() for _ in group]
    out: dict[int, list[np.ndarray]] = {i: [] for i in group}
    res = eng.step([(s, PROMPTS[i]) for s, i in zip(seqs, group, strict=True)])
    for _ in range(N_GEN):
        toks = []
        for row, i in enumerate(group):
            out[i].append(res.logits(row))
            toks.append(int(np.argmax(out[i][-1])))
        res = eng.step([(s, [t]) for s, t in zip(seqs, toks, strict=True)])
    for s in seqs:
        eng.release(s)
    return out


def run(model: Path, threads: int, batch: int, reverse: bool = False
        ) -> dict[int, list[np.ndarray]]:
    order = list(range(N_PROMPTS))[::-1] if reverse else list(range(N_PROMPTS))
    got: dict[int, list[np.ndarray]] = {}
    with Engine.load(model, threads=threads, max_seqs=8, max_tokens=64, kv_pages=512) as eng:
        for at in range(0, N_PROMPTS, batch):
            got.update(generate(eng, order[at:at + batch]))
    return got


def test_logits_bit_identical_across_batches_positions_and_threads(model: Path,
                                                                   path: str) -> None:
    alone = run(model, threads=2, batch=1)
    for i in range(N_PROMPTS):
        assert all(np.all(np.isfinite(r)) for r in alone[i])
    configs = {"alone, 1 thread": run(model, threads=1, batch=1),
               "batches of 4, 2 threads": run(model, threads=2, batch=4),
               "batches of 8, 2 threads": run(model, threads=2, batch=8),
               "batches of 8 reversed, 1 thread": run(model, threads=1, batch=8, reverse=True)}
    for label, got in configs.items():
        for i in range(N_PROMPTS):
            for k, (g, w) in enumerate(zip(got[i], alone[i], strict=True)):
                assert np.array_equal(g.view(np.uint32), w.view(np.uint32)), (
                    f"{path}: prompt {i} step {k} differs {label} "
                    f"(max |diff| {float(np.max(np.abs(g - w))):.3g})")


@pytest.mark.parametrize("off", [("AOTX_HEAD_PACK",), ("AOTX_BODY_PACK",),
                                 ("AOTX_HEAD_PACK", "AOTX_BODY_PACK")],
                         ids=lambda v: "+".join(x.split("_")[1].lower() for x in v))
@pytest.mark.parametrize("kernels", ["avx2", "avx512vnni"])
def test_weight_copies_give_the_mapping_bits(model: Path, off: tuple[str, ...], kernels: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The Q8_0 output head and the body's projections run from re-blocked copies made at
    load (AVX2: Q4_0 / Q5_0 / Q8_0 / Q4_K / Q6_K; AVX-512 VNNI: Q4_0 / Q5_0 / Q8_0;
    AOTX_HEAD_PACK=0 / AOTX_BODY_PACK=0: from the mapping): alone and in batches of 8 with
    2 threads, the logits are the mapping's bit for bit (AVX-512 in its batch-invariant
    mode, whose one-token products are the tiles' as the copies' are)."""
    if lib.aotx_kernel_force(kernels.encode()) != 0:
        pytest.skip(f"this CPU cannot run the {kernels} kernels")
    try:
        lib.aotx_kernel_invariant(1)
        for var in off:
            monkeypatch.setenv(var, "0")
        mapped = {b: run(model, threads=2, batch=b) for b in (1, 8)}
        for var in off:
            monkeypatch.delenv(var)
        for b, want in mapped.items():
            got = run(model, threads=2, batch=b)
            for i in range(N_PROMPTS):
                for k, (g, w) in enumerate(zip(got[i], want[i], strict=True)):
                    assert np.array_equal(g.view(np.uint32), w.view(np.uint32)), (b, i, k)
    finally:
        lib.aotx_kernel_invariant(0)
        assert lib.aotx_kernel_force(b"auto") == 0
