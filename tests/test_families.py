"""The model families beyond Gemma 3 / Llama / Qwen2 (csrc/engine/model/model*.c)
against the float64 reference (tests/reference_decoder.py), each on a tiny
random-weight GGUF written by tests/synth_gguf.py with its family's tensors and
metadata.  Tolerances as in tests/test_model.py: float weights < 1e-3, every
kernel type < 5e-2 (the Q8 activation roundings the reference reproduces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import synth_gguf as sg
from reference_decoder import Reference
from test_model import CHUNKS, TOKENS, rel, run_chunks

from aotx_trio.native.engine import Engine

F32 = {"types": (sg.Q.F32,), "embd_type": sg.Q.F32}

SPECS = {
    # Qwen3: per-head QK RMSNorm, no qkv bias, key_length (128) != d_model / heads (64),
    # tied embeddings
    "qwen3_f32": sg.Spec(arch="qwen3", head_dim=128, n_kv_heads=2, **F32),
    "qwen3_all": sg.Spec(arch="qwen3", head_dim=128, n_kv_heads=2, embd_type=sg.Q.Q6_K,
                         seed=11),
    # Gemma 2: embeddings x sqrt(d), post-norms, gelu, alternating sliding layers (0, 2, 4),
    # attention and final soft-caps small enough to bend these random nets' scores and logits
    "gemma2_f32": sg.Spec(arch="gemma2", attn_softcap=1.5, final_softcap=1.0, **F32),
    "gemma2_all": sg.Spec(arch="gemma2", attn_softcap=1.5, final_softcap=1.0, seed=12),
    # no soft-cap keys: the architecture's 50 and 30
    "gemma2_default_caps": sg.Spec(arch="gemma2", n_layers=2, seed=13, **F32),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("families")
    return {k: sg.write_model(d / f"{k}.gguf", s) for k, s in SPECS.items()}


def check(path: Path, tol: float, ref: Reference | None = None, **load: int) -> list[float]:
    """Relative errors of the engine's logits (prefill then decode chunks) against the
    reference at the chunk ends; asserts they are below tol."""
    ref = ref or Reference(path, act_quant=True)
    want = ref.forward(TOKENS)
    with Engine.load(path, threads=2, max_seqs=4, **load) as eng:
        got = run_chunks(eng, TOKENS, CHUNKS)
    ends = np.cumsum(CHUNKS) - 1
    errs = [rel(g, want[e]) for g, e in zip(got, ends, strict=True)]
    assert max(errs) < tol, errs
    return errs


@pytest.mark.parametrize("name,tol", [("qwen3_f32", 1e-3), ("qwen3_all", 5e-2),
                                      ("gemma2_f32", 1e-3), ("gemma2_all", 5e-2),
                                      ("gemma2_default_caps", 1e-3)])
def test_logits_match_reference(models: dict[str, Path], name: str, tol: float) -> None:
    check(models[name], tol)


def test_qwen3_qk_norm_is_applied(models: dict[str, Path]) -> None:
    """The reference without its QK-norms is far from the engine: the norms matter."""
    path = models["qwen3_f32"]
    ref = Reference(path)
    for li in range(ref.n_layers):
        del ref.w[f"blk.{li}.attn_q_norm.weight"], ref.w[f"blk.{li}.attn_k_norm.weight"]
    with Engine.load(path, threads=1) as eng:
        assert eng.info.arch == "qwen3" and eng.info.head_dim == 128
        got = run_chunks(eng, TOKENS, [20])[0]
    assert rel(got, ref.forward(TOKENS)[-1]) > 1e-2


def test_gemma2_soft_caps_and_alternating_window(models: dict[str, Path]) -> None:
    """Each Gemma 2 trait the engine follows changes the answer: the reference without
    the attention cap, without the final cap, or without the window is far from it."""
    path = models["gemma2_f32"]
    with Engine.load(path, threads=1) as eng:
        assert eng.info.arch == "gemma2" and eng.info.window == 8
        got = run_chunks(eng, TOKENS, [20])[0]
    ref = Reference(path)
    assert rel(got, ref.forward(TOKENS)[-1]) < 1e-3
    assert [ref.sliding(li) for li in range(ref.n_layers)] == [True, False] * 3
    assert np.abs(got).max() < 1.0      # final cap 1.0: |logit| < 1
    for field in ("attn_softcap", "final_softcap", "window"):
        off = Reference(path)
        setattr(off, field, 0)
        assert rel(got, off.forward(TOKENS)[-1]) > 1e-2, field
