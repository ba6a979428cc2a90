"""The engine's backend seam (aotx.h, engine section; csrc/engine/backend/backend_cpu.c).

The decoder reaches kernels and KV storage only through one backend table,
picked by name at load; KV page accounting (kv.c) holds no K/V memory (its own
tests, tests/test_kv.py, run on pools without any storage).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import synth_gguf as sg

from aotx_trio import errors
from aotx_trio.native.engine import Engine, backends
from aotx_trio.native.lib import ffi, lib

CSRC = Path(__file__).resolve().parent.parent / "csrc"


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sg.write_model(tmp_path_factory.mktemp("m") / "g.gguf", sg.Spec())


def test_the_decoder_reports_its_backend(model: Path) -> None:
    assert backends() == ["cpu"]
    with Engine.load(model, threads=1, max_seqs=2) as eng:
        assert eng.backend == "cpu"
    with Engine.load(model, threads=1, max_seqs=2, backend="cpu") as eng:
        assert eng.backend == "cpu"
        seq = eng.add_sequence()
        assert eng.step([(seq, [5, 6, 7])]).logits(0).shape == (512,)


def test_an_unknown_backend_is_refused_by_name(model: Path) -> None:
    with pytest.raises(errors.AotxError) as ei:
        Engine.load(model, threads=1, backend="gpu9")
    assert ei.value.code == "unsupported" and "gpu9" in ei.value.message


def kv_row(eng: Engine, seq: int, layer: int, pos: int, v: int = 0) -> tuple[int, np.ndarray]:
    """The backend's storage address and contents of one K (or V) row."""
    p = lib.aotx_model_kv_row(eng._m, seq, layer, pos, 0, v)
    assert p != ffi.NULL
    n = eng.info.head_dim
    return int(ffi.cast("uintptr_t", p)), np.frombuffer(ffi.buffer(p, 4 * n), np.float32).copy()


def test_storage_is_the_backends_and_pages_are_shared_by_the_accounting(model: Path) -> None:
    with Engine.load(model, threads=2, max_seqs=4) as eng:
        a = eng.add_sequence()
        eng.step([(a, list(range(10, 42)))])             # 32 positions: whole pages of 8
        child, shared = eng.fork_sequence(a, 32)
        assert shared == 32
        for layer, pos in ((5, 3), (5, 31), (0, 28)):    # layer 5 global, 0 sliding (window 8)
            addr, k = kv_row(eng, a.id, layer, pos)
            assert kv_row(eng, child.id, layer, pos)[0] == addr   # one copy in storage
            assert np.isfinite(k).all() and np.abs(k).sum() > 0   # written by the step
            assert kv_row(eng, a.id, layer, pos, v=1)[0] != addr
        eng.step([(a, [50]), (child, [60])])             # each writes its own next page
        pa, ka = kv_row(eng, a.id, 5, 32)
        pc, kc = kv_row(eng, child.id, 5, 32)
        assert pa != pc and not np.array_equal(ka, kc)
        assert lib.aotx_model_kv_row(eng._m, a.id, 5, 33, 0, 0) == ffi.NULL   # not held


def _code(path: Path) -> str:
    """C source without comments."""
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(), flags=re.S)


def test_the_decoder_reaches_kernels_and_kv_memory_only_through_the_table() -> None:
    decoder = {p.name: _code(p) for p in sorted((CSRC / "engine" / "model").glob("model*.c"))}
    assert set(decoder) == {"model.c", "model_fwd.c", "model_load.c"}
    for name, src in decoder.items():
        for direct in ("aotx_matmul_rows", "aotx_act_prepare", "aotx_sgemm_rows",
                       "aotx_kv_view_get", "aotx_backend_cpu."):
            assert direct not in src, f"{name} calls {direct} past the backend table"
    uses = set(re.findall(r"be_ops->(\w+)", "".join(decoder.values())))
    assert uses == {"matmul", "attention", "kv_write", "kv_alloc_pages", "kv_free_pages",
                    "kv_page_ptr", "reserve", "init", "free", "name"}
    kv = _code(CSRC / "engine" / "kv" / "kv.c")
    assert re.search(r"\bfloat\b", kv) is None      # accounting: page ids and counts only
