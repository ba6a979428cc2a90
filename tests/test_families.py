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
from test_batch_invariance import run
from test_model import CHUNKS, TOKENS, rel, run_chunks
from test_tokenizer_bpe import cached, write_bpe_model

from aotx_trio import errors
from aotx_trio.native.engine import Engine
from aotx_trio.native.lib import lib

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
    # Phi-3: fused attn_qkv and gate|up ffn_up, NeoX RoPE, a sliding window on every layer
    "phi3_f32": sg.Spec(arch="phi3", n_kv_heads=4, tied=False, **F32),
    "phi3_all": sg.Spec(arch="phi3", n_kv_heads=2, tied=False, embd_type=sg.Q.Q8_0, seed=14),
    # separate q/k/v and gate/up tensors, no window
    "phi3_unfused": sg.Spec(arch="phi3", fused=False, window=0, tied=False, seed=15, **F32),
    # partial RoPE (32 of 64 dims) with LongRoPE factors (original context 512 of 1024),
    # tied embeddings (Phi-4-mini's shape); the second without rope.scaling.attn_factor
    "phi3_long": sg.Spec(arch="phi3", n_rot=32, long_rope=True, window=0, seed=16, **F32),
    "phi3_long_default": sg.Spec(arch="phi3", n_rot=32, long_rope=True, attn_factor=0,
                                 window=0, n_layers=2, seed=17, **F32),
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
                                      ("gemma2_default_caps", 1e-3), ("phi3_f32", 1e-3),
                                      ("phi3_all", 5e-2), ("phi3_unfused", 1e-3),
                                      ("phi3_long", 1e-3), ("phi3_long_default", 1e-3)])
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


def test_qwen3_with_its_byte_level_vocabulary(tmp_path: Path) -> None:
    """Qwen3's GGUF vocabulary: GPT-2 byte-level BPE with the qwen2 pre-tokenizer (ids as
    the `tokenizers` library's; tests/test_tokenizer_bpe.py covers the tokenizer itself)."""
    p = cached("qwen2")
    path = write_bpe_model(tmp_path / "qwen3.gguf", p, "qwen2", arch="qwen3")
    with Engine.load(path, threads=1, max_seqs=2) as e:
        assert e.info.arch == "qwen3"
        for text in ("Hello world, it's 2024!", "東京 😀 café\n\n  x 123456"):
            assert e.tokenize(text, add_bos=False) == p.ref.encode(text).ids
        ids = e.tokenize("the capital of France", add_bos=False)
        seq = e.add_sequence()
        logits = e.step([(seq, ids)]).logits(0)
    want = Reference(path, act_quant=True).forward(ids)[-1]   # Q8_0 embeddings
    assert rel(logits, want) < 1e-3


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


def test_phi3_window_on_every_layer(models: dict[str, Path]) -> None:
    path = models["phi3_f32"]
    ref = Reference(path)
    assert all(ref.sliding(li) for li in range(ref.n_layers))
    with Engine.load(path, threads=1) as eng:
        assert eng.info.arch == "phi3" and eng.info.window == 8
        got = run_chunks(eng, TOKENS, [20])[0]
    assert rel(got, ref.forward(TOKENS)[-1]) < 1e-3
    ref.window = 0
    assert rel(got, ref.forward(TOKENS)[-1]) > 1e-2


def test_phi3_long_rope_set_follows_the_served_context(models: dict[str, Path]) -> None:
    """max_tokens 1024 (the default: context_length) > original 512: the long factors;
    max_tokens 256: the short ones, and the two answers differ."""
    path = models["phi3_long"]
    ref = Reference(path, act_quant=True)
    assert ref.ctx == 1024 and ref.orig_ctx == 512 and ref.attn_factor == pytest.approx(1.1)
    check(path, 1e-3, ref)
    short = Reference(path, act_quant=True)
    short.ctx = 256
    check(path, 1e-3, short, max_tokens=256)
    assert rel(short.forward(TOKENS)[-1], ref.forward(TOKENS)[-1]) > 1e-2
    plain = Reference(path)                      # no factors, no attn_factor
    del plain.w["rope_factors_long.weight"], plain.w["rope_factors_short.weight"]
    with Engine.load(path, threads=1) as eng:
        got = run_chunks(eng, TOKENS, [20])[0]
    assert rel(got, plain.forward(TOKENS)[-1]) > 1e-2
    default = Reference(models["phi3_long_default"])
    assert default.attn_factor == pytest.approx(np.sqrt(1 + np.log(2) / np.log(512)))


def test_phi3_end_of_turn(tmp_path: Path) -> None:
    """Phi-3's chat turns end with <|end|>: the engine stops on it as on eos."""
    toks, scores, types = sg.vocab(400)
    toks = ["<|end|>" if t == "<end_of_turn>" else t for t in toks]
    path = sg.write_model(tmp_path / "phi3-end.gguf",
                          sg.tiny("phi3", sg.Vocab(toks, types, scores)))
    with Engine.load(path, threads=1) as eng:
        assert eng.info.eot_id == toks.index("<|end|>")
        assert eng.stop_ids == {eng.info.eos_id, eng.info.eot_id}
        assert eng.tokenize("<|end|>", add_bos=False, parse_special=True) == [eng.info.eot_id]


def test_phi3_refusals_name_the_tensor(tmp_path: Path) -> None:
    """A fused ffn_up of the wrong height, LongRoPE with only the other factor set; and
    outside phi3 no fused gate: a llama without ffn_gate is refused naming it."""
    import gguf

    def rewrite(src: Path, name: str, drop: str, shrink: str = "") -> Path:
        r = gguf.GGUFReader(str(src))
        out = tmp_path / name
        w = gguf.GGUFWriter(str(out), str(r.fields["general.architecture"].contents()))
        for k, f in r.fields.items():
            if k.startswith("GGUF.") or k == "general.architecture":
                continue
            vt = f.types[0]
            if vt == gguf.GGUFValueType.ARRAY:
                w.add_array(k, f.contents())
            else:
                w.add_key_value(k, f.contents(), vt)
        for t in r.tensors:
            if t.name == drop:
                continue
            data = np.asarray(t.data)
            if t.name == shrink:
                data = data[: data.shape[0] // 2]
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return out

    src = sg.write_model(tmp_path / "src.gguf", sg.Spec(arch="phi3", n_layers=1, n_rot=32,
                                                        long_rope=True, **F32))
    with pytest.raises(errors.AotxError, match=r"rope_factors_long\.weight is missing"):
        Engine.load(rewrite(src, "no-long.gguf", "rope_factors_long.weight"))
    with Engine.load(rewrite(src, "no-long-short-ctx.gguf", "rope_factors_long.weight"),
                     max_tokens=256) as eng:          # the short set is all it needs
        assert eng.info.arch == "phi3"
    with pytest.raises(errors.AotxError, match=r"blk\.0\.ffn_up\.weight has shape"):
        Engine.load(rewrite(src, "half-up.gguf", "", shrink="blk.0.ffn_up.weight"))
    llama = sg.write_model(tmp_path / "llama.gguf", sg.Spec(arch="llama", n_layers=1, **F32))
    with pytest.raises(errors.AotxError, match=r"blk\.0\.ffn_gate\.weight is missing"):
        Engine.load(rewrite(llama, "no-gate.gguf", "blk.0.ffn_gate.weight"))


@pytest.mark.parametrize("name", ["gemma2_all", "phi3_all"])
def test_batch_invariance_and_weight_copies(models: dict[str, Path], name: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/test_batch_invariance.py's check on the new paths (the soft-capped scores
    on every attention path; fused q/k/v and gate/up row ranges, re-blocked at load):
    alone, in batches of 8 and reversed with 1 thread, and from the mapping
    (AOTX_BODY_PACK=0), a sequence's logits are the same bits."""
    assert lib.aotx_kernel_invariant(1) == 0
    try:
        alone = run(models[name], threads=2, batch=1)
        others = [run(models[name], threads=2, batch=8),
                  run(models[name], threads=1, batch=8, reverse=True)]
        monkeypatch.setenv("AOTX_BODY_PACK", "0")
        others.append(run(models[name], threads=2, batch=8))
    finally:
        assert lib.aotx_kernel_invariant(0) == 0
    for got in others:
        for i in alone:
            for g, w in zip(got[i], alone[i], strict=True):
                assert np.array_equal(g.view(np.uint32), w.view(np.uint32)), i
