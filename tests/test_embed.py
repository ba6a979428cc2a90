"""The embedding encoder (csrc/embed/embed*.c) and aotx_trio.native.embed: against an
independent numpy forward pass (tests/reference_bert.py), the `tokenizers`
library for WordPiece ids, and tiny synthetic models for config handling."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from reference_bert import (
    cosines,
    erf64,
    extract_real_model,
    read_safetensors,
    reference_embed,
    tiny_config,
    write_safetensors,
    write_tiny_model,
)

from aotx_trio import errors
from aotx_trio.native.embed import Embedder
from aotx_trio.native.lib import ffi, lib


@pytest.fixture(scope="session")
def real_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return extract_real_model(tmp_path_factory.mktemp("minilm"))


@pytest.fixture(scope="session")
def real(real_dir: Path) -> Embedder:
    return Embedder.load(real_dir, threads=2)


@pytest.fixture(scope="session")
def hf_tokenizer(real_dir: Path) -> object:
    tok = tokenizers.Tokenizer.from_file(str(real_dir / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=256)
    return tok


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny")


SHORT = ["Hello world", "hi", "A cat sat on the mat.", "Embeddings are useful!"]
LONG_PARAGRAPH = (
    "Persistent shared conversations let several participants read and write the same "
    "thread while a language model answers; every admitted operation is journaled, "
    "fsynced and replayed after a crash, so nothing acknowledged is ever lost. ") * 3
VERY_LONG = "The quick brown fox jumps over the lazy dog, again and again. " * 40  # truncated
CJK = "你好，世界！ 日本語のテキスト 한국어 텍스트"  # noqa: RUF001


def test_reference_erf_is_exact() -> None:
    import math
    xs = np.linspace(-9.0, 9.0, 20001)
    np.testing.assert_allclose(erf64(xs), [math.erf(v) for v in xs], rtol=0, atol=1e-13)


# ------------------------------------------------------- tokenization (more: test_wordpiece.py)


def test_truncation_to_max_seq_length(real: Embedder, hf_tokenizer: object) -> None:
    ids = real.tokenize(VERY_LONG)
    assert real.max_len == 256
    assert len(ids) == 256
    assert ids[0] == real.tokenizer.cls and ids[-1] == real.tokenizer.sep
    assert ids == hf_tokenizer.encode(VERY_LONG).ids  # type: ignore[attr-defined]


# ------------------------------------------------------------------ the real encoder


@pytest.mark.slow
def test_real_model_matches_reference(real: Embedder, real_dir: Path) -> None:
    texts = [SHORT[0], LONG_PARAGRAPH, SHORT[1], CJK, SHORT[2], VERY_LONG]
    seqs = [real.tokenize(t) for t in texts]
    assert [len(s) for s in seqs] == [4, 131, 3, 31, 9, 256]  # padding exercised
    got = real.embed(texts)
    assert got.shape == (len(texts), 384) and got.dtype == np.float32
    # the reference pads the first five to 131 (its own mask); the 256-token one alone
    ref = np.concatenate([reference_embed(real_dir, seqs[:5]), reference_embed(real_dir, seqs[5:])])
    assert np.all(cosines(got, ref) >= 0.9999), cosines(got, ref)
    np.testing.assert_allclose(got, ref, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_padding_is_irrelevant(real: Embedder) -> None:
    texts = [SHORT[1], LONG_PARAGRAPH, SHORT[0], VERY_LONG, SHORT[3]]
    batch = real.embed(texts, batch_size=32)
    for i, text in enumerate(texts):
        alone = real.embed([text])
        assert cosines(alone, batch[i: i + 1])[0] >= 0.99999
        np.testing.assert_allclose(alone[0], batch[i], atol=2e-5)


def test_unnormalised_pooling_matches_reference(real_dir: Path) -> None:
    with Embedder.load(real_dir, threads=1) as emb:
        emb.normalize = False
        seqs = [emb.tokenize(t) for t in SHORT]
        got = emb.embed_ids(seqs)
    ref = reference_embed(real_dir, seqs, normalize=False)
    assert np.all(cosines(got, ref) >= 0.9999)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(ref, axis=1),
                               rtol=1e-4)
    assert not np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)


def test_semantics_are_sane(real: Embedder) -> None:
    v = real.embed(["A man is eating food.", "A man is eating a piece of bread.",
                    "The stock market fell sharply today."])
    assert float(v[0] @ v[1]) > 0.6 > float(v[0] @ v[2])


# ------------------------------------------------------------------ tiny synthetic model


def tiny_seqs(n: int, rng: np.random.Generator, lo: int = 1, hi: int = 40) -> list[list[int]]:
    vocab = tiny_config()["vocab_size"]
    return [[2, *rng.integers(5, vocab, size=int(rng.integers(lo - 1, hi - 1))).tolist(), 3]
            for _ in range(n)]


def test_tiny_model_reads_config_and_matches_reference(tiny_dir: Path) -> None:
    with Embedder.load(tiny_dir, threads=1) as emb:
        assert emb.dim == 16 and emb.config.n_layers == 2 and emb.config.n_heads == 4
        assert emb.config.intermediate == 40 and emb.max_len == 40
        seqs = tiny_seqs(9, np.random.default_rng(1))
        got = emb.embed_ids(seqs, batch_size=4)
    assert got.shape == (9, 16)
    ref = reference_embed(tiny_dir, seqs)
    np.testing.assert_allclose(got, ref, atol=2e-5)


@pytest.mark.parametrize("over", [
    {"hidden_size": 24, "num_attention_heads": 3, "num_hidden_layers": 3, "intermediate_size": 7},
    {"hidden_size": 8, "num_attention_heads": 1, "num_hidden_layers": 1, "layer_norm_eps": 1e-5},
])
def test_tiny_model_other_shapes(tmp_path: Path, over: dict[str, float]) -> None:
    root = write_tiny_model(tmp_path / "m", seed=3, **over)
    seqs = tiny_seqs(5, np.random.default_rng(2))
    with Embedder.load(root, threads=2) as emb:
        got = emb.embed_ids(seqs)
    assert got.shape == (5, over["hidden_size"])
    np.testing.assert_allclose(got, reference_embed(root, seqs), atol=2e-5)


def test_tiny_batches_split_and_keep_order(tiny_dir: Path) -> None:
    rng = np.random.default_rng(5)
    seqs = tiny_seqs(130, rng, lo=20, hi=40)  # > 2048 packed tokens: several C calls
    with Embedder.load(tiny_dir, threads=2) as emb:
        got = emb.embed_ids(seqs, batch_size=50)
        one_by_one = np.concatenate([emb.embed_ids([s]) for s in seqs[:10]])
        reversed_ = emb.embed_ids(seqs[:10][::-1], batch_size=3)[::-1]
    np.testing.assert_allclose(got[:10], one_by_one, atol=1e-5)
    np.testing.assert_allclose(reversed_, one_by_one, atol=1e-5)
    np.testing.assert_allclose(got[100:110], reference_embed(tiny_dir, seqs[100:110]), atol=2e-5)


def test_tiny_threads_agree(tiny_dir: Path) -> None:
    seqs = tiny_seqs(12, np.random.default_rng(7))
    with Embedder.load(tiny_dir, threads=1) as one, Embedder.load(tiny_dir, threads=2) as two:
        assert one.threads == 1
        np.testing.assert_allclose(one.embed_ids(seqs), two.embed_ids(seqs), atol=1e-6)


def test_tiny_without_normalize_module(tmp_path: Path) -> None:
    root = write_tiny_model(tmp_path / "m", normalize=False)
    seqs = tiny_seqs(4, np.random.default_rng(8))
    with Embedder.load(root) as emb:
        assert not emb.normalize
        got = emb.embed_ids(seqs)
    np.testing.assert_allclose(got, reference_embed(root, seqs, normalize=False), atol=1e-4)


def test_bert_prefixed_tensor_names(tmp_path: Path) -> None:
    plain = write_tiny_model(tmp_path / "plain", seed=4)
    prefixed = write_tiny_model(tmp_path / "prefixed", seed=4, prefix="bert.")
    seqs = tiny_seqs(3, np.random.default_rng(9))
    with Embedder.load(plain) as a, Embedder.load(prefixed) as b:
        np.testing.assert_array_equal(a.embed_ids(seqs), b.embed_ids(seqs))


def test_tiny_tokenizer_and_embed_text(tiny_dir: Path) -> None:
    with Embedder.load(tiny_dir) as emb:
        vocab = emb.tokenizer.vocab
        assert emb.tokenize("The cats, runs!") == [
            vocab["[CLS]"], vocab["the"], vocab["cat"], vocab["##s"], vocab[","], vocab["run"],
            vocab["##s"], vocab["!"], vocab["[SEP]"]]
        assert emb.tokenize("running") == [vocab["[CLS]"], vocab["[UNK]"], vocab["[SEP]"]]
        assert emb.tokenize("zebra") == [vocab["[CLS]"], vocab["[UNK]"], vocab["[SEP]"]]
        assert len(emb.tokenize("cat " * 100)) == 40
        v = emb.embed(["the cat sat", "hello world", ""])
        assert emb.embed([]).shape == (0, 16)
    assert v.shape == (3, 16)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)


def test_concurrent_callers_share_one_handle(tiny_dir: Path) -> None:
    seqs = tiny_seqs(20, np.random.default_rng(10))
    with Embedder.load(tiny_dir, threads=1) as emb:
        expected = emb.embed_ids(seqs)
        results: list[np.ndarray] = []

        def work() -> None:
            for _ in range(5):
                results.append(emb.embed_ids(seqs, batch_size=7))

        workers = [threading.Thread(target=work) for _ in range(3)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert len(results) == 15
    for r in results:
        np.testing.assert_allclose(r, expected, atol=1e-6)


# ------------------------------------------------------------------ refusals


def test_non_f32_tensor_is_refused_by_name(tiny_dir: Path) -> None:
    path = tiny_dir / "model.safetensors"
    t = dict(read_safetensors(path))
    name = "encoder.layer.1.intermediate.dense.weight"
    t[name] = t[name].astype(np.float16)
    write_safetensors(path, t)
    with pytest.raises(errors.FormatError, match=name) as info:
        Embedder.load(tiny_dir)
    assert info.value.code == "embed_dtype_unsupported" and info.value.fields["tensor"] == name


def test_missing_and_misshapen_tensors_are_refused(tiny_dir: Path) -> None:
    path = tiny_dir / "model.safetensors"
    t = dict(read_safetensors(path))
    del t["encoder.layer.0.output.LayerNorm.bias"]
    write_safetensors(path, t)
    with pytest.raises(errors.FormatError, match=r"output\.LayerNorm\.bias") as info:
        Embedder.load(tiny_dir)
    assert info.value.code == "embed_tensor_missing"
    t["encoder.layer.0.output.LayerNorm.bias"] = np.zeros(15, dtype=np.float32)
    write_safetensors(path, t)
    with pytest.raises(errors.FormatError, match=r"shape \[15\]") as info:
        Embedder.load(tiny_dir)
    assert info.value.code == "embed_shape_invalid"


def test_truncated_safetensors_is_refused(tiny_dir: Path) -> None:
    path = tiny_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(errors.FormatError):
        Embedder.load(tiny_dir)


@pytest.mark.parametrize(("key", "value"), [
    ("num_attention_heads", 5), ("hidden_size", 0), ("layer_norm_eps", "x"),
    ("hidden_act", "relu"), ("num_hidden_layers", None)])
def test_bad_config_is_refused_by_key(tiny_dir: Path, key: str, value: object) -> None:
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg[key] = value
    (tiny_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(errors.ConfigError) as info:
        Embedder.load(tiny_dir)
    assert info.value.fields["key"] == key


def test_non_mean_pooling_is_refused(tiny_dir: Path) -> None:
    pool = tiny_dir / "1_Pooling" / "config.json"
    cfg = json.loads(pool.read_text())
    cfg["pooling_mode_cls_token"], cfg["pooling_mode_mean_tokens"] = True, False
    pool.write_text(json.dumps(cfg))
    with pytest.raises(errors.ConfigError, match="pooling"):
        Embedder.load(tiny_dir)


def test_bad_token_ids_and_lengths_are_refused(tiny_dir: Path) -> None:
    with Embedder.load(tiny_dir) as emb:
        vocab = emb.config.vocab_size
        with pytest.raises(errors.InvalidInput) as info:
            emb.embed_ids([[2, vocab, 3]])
        assert info.value.code == "embed_token_invalid"
        with pytest.raises(errors.InvalidInput) as info:
            emb.embed_ids([[2, -1, 3]])
        assert info.value.code == "embed_token_invalid"
        with pytest.raises(errors.InvalidInput) as info:
            emb.embed_ids([[2, 3], []])
        assert info.value.code == "embed_length_invalid"
        with pytest.raises(errors.InvalidInput) as info:
            emb.embed_ids([[5] * 41])
        assert info.value.code == "embed_length_invalid"
        with pytest.raises(errors.InvalidInput):
            emb.embed(["a"], batch_size=0)
        with pytest.raises(errors.InvalidInput):
            Embedder.load(tiny_dir, threads=-1)
        assert emb.embed_ids([[5] * 40]).shape == (1, 16)  # still usable after refusals


def test_native_codes_are_named() -> None:
    assert lib.AOTX_R_EMBED_BATCH_FULL > 0 > lib.AOTX_E_EMBED_TOKEN_INVALID
    from aotx_trio.native.lib import code_name
    assert code_name(lib.AOTX_E_EMBED_CONFIG_INVALID) == "embed_config_invalid"
    assert code_name(lib.AOTX_R_EMBED_BATCH_FULL) == "embed_batch_full"


def _raw_encoder_parts(h: int = 8, im: int = 12, layers: int = 1) -> tuple[object, ...]:
    """cffi config + weights (all zeros, LayerNorm weight 1) for the C-level checks."""
    keep = []

    def buf(n: int, fill: float = 0.0) -> object:
        arr = np.full(n, fill, dtype=np.float32)
        keep.append(arr)
        return ffi.from_buffer("float[]", arr)

    cfg = ffi.new("aotx_bert_config *", {"vocab_size": 10, "hidden": h, "n_layers": layers,
                                         "n_heads": 2, "intermediate": im, "max_positions": 16,
                                         "type_vocab_size": 1, "layer_norm_eps": 1e-6})
    lay = ffi.new("aotx_bert_layer[]", layers)
    for i in range(layers):
        for f, n in (("q_w", h * h), ("k_w", h * h), ("v_w", h * h), ("ao_w", h * h),
                     ("i_w", im * h), ("o_w", h * im), ("i_b", im)):
            setattr(lay[i], f, buf(n))
        for f in ("q_b", "k_b", "v_b", "ao_b", "o_b", "ln1_b", "ln2_b"):
            setattr(lay[i], f, buf(h))
        lay[i].ln1_w, lay[i].ln2_w = buf(h, 1.0), buf(h, 1.0)
    w = ffi.new("aotx_bert_weights *", {"word_emb": buf(10 * h, 0.5), "pos_emb": buf(16 * h),
                                        "type_emb": buf(h), "emb_ln_w": buf(h, 1.0),
                                        "emb_ln_b": buf(h), "layers": lay})
    return cfg, w, lay, keep


def test_native_new_refuses_bad_config_and_missing_weights() -> None:
    cfg, w, lay, _keep = _raw_encoder_parts()
    out = ffi.new("aotx_embed **")
    cfg.n_heads = 3  # 8 % 3 != 0
    assert lib.aotx_embed_new(cfg, w, 32, 16, 1, out) == lib.AOTX_E_EMBED_CONFIG_INVALID
    cfg.n_heads = 2
    assert lib.aotx_embed_new(cfg, w, 32, 17, 1, out) == lib.AOTX_E_EMBED_CONFIG_INVALID
    assert lib.aotx_embed_new(cfg, w, 8, 16, 1, out) == lib.AOTX_E_EMBED_CONFIG_INVALID
    saved = lay[0].o_b
    lay[0].o_b = ffi.NULL
    assert lib.aotx_embed_new(cfg, w, 32, 16, 1, out) == lib.AOTX_E_EMBED_WEIGHT_MISSING
    assert out[0] == ffi.NULL  # untouched on failure
    lay[0].o_b = saved
    assert lib.aotx_embed_new(cfg, w, 32, 16, 1, out) == 0
    lib.aotx_embed_free(out[0])


def test_native_run_refuses_oversized_batch_without_writing() -> None:
    cfg, w, _lay, _keep = _raw_encoder_parts()
    out = ffi.new("aotx_embed **")
    assert lib.aotx_embed_new(cfg, w, 20, 16, 1, out) == 0
    enc = ffi.gc(out[0], lib.aotx_embed_free)
    ids = np.ones((2, 16), dtype=np.int32)
    lens = np.array([16, 5], dtype=np.int32)
    res = np.full((2, 8), 7.0, dtype=np.float32)
    args = (ffi.from_buffer("int32_t[]", ids), 16, ffi.from_buffer("int32_t[]", lens), 2)
    rc = lib.aotx_embed_run(enc, *args, 1, ffi.from_buffer("float[]", res))
    assert rc == lib.AOTX_R_EMBED_BATCH_FULL
    assert np.all(res == 7.0)
    lens[1] = 4
    assert lib.aotx_embed_run(enc, *args, 1, ffi.from_buffer("float[]", res)) == 0
    assert np.all(np.isfinite(res)) and not np.any(res == 7.0)
    assert lib.aotx_embed_run(enc, *args, 2, ffi.from_buffer("float[]", res)) \
        == lib.AOTX_E_INVALID_ARGUMENT  # unknown flag bit
