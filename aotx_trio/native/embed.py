"""Sentence embeddings: BERT encoder (csrc/embed/embed*.c) + WordPiece
(csrc/tokenizer/tokenizer_wordpiece.c).

A model folder in the sentence-transformers layout (all-MiniLM-L6-v2)::

    config.json               BERT hyperparameters (hidden_size, num_hidden_layers, ...)
    model.safetensors         F32 weights, mapped read-only and handed to C as pointers
    tokenizer.json            WordPiece vocabulary, normalizer and special tokens
    sentence_bert_config.json max_seq_length (word pieces incl. [CLS]/[SEP])
    1_Pooling/config.json     must say mean pooling
    modules.json              a ...Normalize module means L2-normalised output

``Embedder.load(dir).embed(texts)`` returns float32 ``[n, hidden]``: mean pooled
over each sentence's tokens, L2-normalised when modules.json says so.  Batches
are sorted by length and padded in Python; C packs the valid tokens, so the
padding never takes part.  The GIL is released while C runs (cffi API mode).

The pieces live by concern: ``_safetensors`` (the weight file), ``_bert_config``
(the folder's JSON), ``_wordpiece`` (the tokenizer); this module is the wrapper and
re-exports their public names.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from aotx_trio import errors
from aotx_trio.native._bert_config import BertConfig, max_seq_length, pooling_and_normalize
from aotx_trio.native._safetensors import F32Array, SafeTensors
from aotx_trio.native._wordpiece import WordPiece
from aotx_trio.native.lib import check, ffi, lib

__all__ = ["BertConfig", "Embedder", "F32Array", "SafeTensors", "WordPiece"]

_MAX_TOKENS = 2048  # packed tokens per C call (scratch size); a call splits larger batches

_LAYER_TENSORS = (
    ("q_w", "attention.self.query.weight", "hh"), ("q_b", "attention.self.query.bias", "h"),
    ("k_w", "attention.self.key.weight", "hh"), ("k_b", "attention.self.key.bias", "h"),
    ("v_w", "attention.self.value.weight", "hh"), ("v_b", "attention.self.value.bias", "h"),
    ("ao_w", "attention.output.dense.weight", "hh"), ("ao_b", "attention.output.dense.bias", "h"),
    ("ln1_w", "attention.output.LayerNorm.weight", "h"),
    ("ln1_b", "attention.output.LayerNorm.bias", "h"),
    ("i_w", "intermediate.dense.weight", "ih"), ("i_b", "intermediate.dense.bias", "i"),
    ("o_w", "output.dense.weight", "hi"), ("o_b", "output.dense.bias", "h"),
    ("ln2_w", "output.LayerNorm.weight", "h"), ("ln2_b", "output.LayerNorm.bias", "h"),
)


class Embedder:
    """A loaded embedding model: tokenizer, mapped weights and the C encoder."""

    def __init__(self, model_dir: Path, config: BertConfig, tokenizer: WordPiece,
                 weights: SafeTensors, handle: Any, keep: list[Any], normalize: bool) -> None:
        self.model_dir = model_dir
        self.config = config
        self.tokenizer = tokenizer
        self.normalize = normalize
        self._weights = weights
        self._keep = keep  # arrays and cdata C points into
        self._handle = handle
        self._lock = threading.Lock()  # one batch at a time per handle (shared scratch)

    @classmethod
    def load(cls, model_dir: str | Path, threads: int = 0) -> Embedder:
        model_dir = Path(model_dir)
        if threads < 0:
            raise errors.InvalidInput(f"threads must be >= 0, got {threads}", field="threads")
        config = BertConfig.from_json(model_dir / "config.json")
        max_len = max_seq_length(model_dir, config)
        normalize = pooling_and_normalize(model_dir)
        tokenizer = WordPiece(model_dir / "tokenizer.json", max_len)
        if max(tokenizer.vocab.values()) >= config.vocab_size:
            raise errors.ConfigError(f"tokenizer ids reach beyond vocab_size {config.vocab_size}",
                                     code="embed_config_invalid", key="vocab_size")
        weights = SafeTensors(model_dir / "model.safetensors")
        handle, keep = _native_encoder(config, weights, max_len, threads)
        return cls(model_dir, config, tokenizer, weights, handle, keep, normalize)

    @property
    def dim(self) -> int:
        return self.config.hidden

    @property
    def threads(self) -> int:
        return int(lib.aotx_embed_threads(self._handle))

    @property
    def max_len(self) -> int:
        return self.tokenizer.max_len

    def tokenize(self, text: str) -> list[int]:
        """Token ids the encoder sees: [CLS] word pieces [SEP], truncated to max_len."""
        return self.tokenizer.encode(text)

    def embed(self, texts: list[str], batch_size: int = 32) -> F32Array:
        """Embeddings ``[len(texts), dim]`` float32, in the order of ``texts``."""
        encoded = [self.tokenize(t) for t in texts]
        return self.embed_ids(encoded, batch_size)

    def embed_ids(self, encoded: list[list[int]], batch_size: int = 32) -> F32Array:
        """Embeddings of already tokenized sequences (each 1..max_len ids)."""
        if batch_size < 1:
            raise errors.InvalidInput(f"batch_size must be >= 1, got {batch_size}",
                                      field="batch_size")
        out = np.zeros((len(encoded), self.dim), dtype=np.float32)
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
        start = 0
        while start < len(order):
            batch = [order[start]]
            tokens = len(encoded[order[start]])
            while (start + len(batch) < len(order) and len(batch) < batch_size
                   and tokens + len(encoded[order[start + len(batch)]]) <= _MAX_TOKENS):
                tokens += len(encoded[order[start + len(batch)]])
                batch.append(order[start + len(batch)])
            out[batch] = self._run([encoded[i] for i in batch])
            start += len(batch)
        return out

    def _run(self, seqs: list[list[int]]) -> F32Array:
        stride = max(len(s) for s in seqs)
        ids = np.full((len(seqs), stride), self.tokenizer.pad, dtype=np.int32)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
        lens = np.array([len(s) for s in seqs], dtype=np.int32)
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        flags = lib.AOTX_EMBED_NORMALIZE if self.normalize else 0
        with self._lock:
            if self._handle is None:
                raise errors.InvalidInput("the embedder is closed", field="embedder")
            rc = lib.aotx_embed_run(self._handle, ffi.from_buffer("int32_t[]", ids), stride,
                                    ffi.from_buffer("int32_t[]", lens), len(seqs), flags,
                                    ffi.from_buffer("float[]", out))
        check(rc, f"batch of {len(seqs)} sequences, longest {stride}")
        return out

    def close(self) -> None:
        with self._lock:
            if self._handle is not None:
                ffi.release(self._handle)  # runs aotx_embed_free now, not at collection
                self._handle = None
                self._keep.clear()  # the weight views; the map closes once unreferenced

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _tensor_prefix(weights: SafeTensors) -> str:
    """'' or 'bert.' (checkpoints saved from BertForX carry the model under 'bert.')."""
    if "embeddings.word_embeddings.weight" in weights.header:
        return ""
    if "bert.embeddings.word_embeddings.weight" in weights.header:
        return "bert."
    return ""


def _native_encoder(config: BertConfig, weights: SafeTensors, max_len: int,
                    threads: int) -> tuple[Any, list[Any]]:
    keep: list[Any] = []
    pre = _tensor_prefix(weights)
    dims = {"h": config.hidden, "i": config.intermediate}

    def ptr(name: str, shape: tuple[int, ...]) -> Any:
        arr = weights.tensor(pre + name, shape)
        buf = ffi.from_buffer("float[]", arr)
        keep.extend((arr, buf))
        return buf

    h = config.hidden
    c_cfg = ffi.new("aotx_bert_config *", {
        "vocab_size": config.vocab_size, "hidden": h, "n_layers": config.n_layers,
        "n_heads": config.n_heads, "intermediate": config.intermediate,
        "max_positions": config.max_positions, "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.layer_norm_eps})
    layers = ffi.new("aotx_bert_layer[]", config.n_layers)
    for i in range(config.n_layers):
        for field, suffix, shape in _LAYER_TENSORS:
            setattr(layers[i], field, ptr(f"encoder.layer.{i}.{suffix}",
                                          tuple(dims[c] for c in shape)))
    c_w = ffi.new("aotx_bert_weights *", {
        "word_emb": ptr("embeddings.word_embeddings.weight", (config.vocab_size, h)),
        "pos_emb": ptr("embeddings.position_embeddings.weight", (config.max_positions, h)),
        "type_emb": ptr("embeddings.token_type_embeddings.weight", (config.type_vocab_size, h)),
        "emb_ln_w": ptr("embeddings.LayerNorm.weight", (h,)),
        "emb_ln_b": ptr("embeddings.LayerNorm.bias", (h,)),
        "layers": layers})
    out = ffi.new("aotx_embed **")
    check(lib.aotx_embed_new(c_cfg, c_w, max(_MAX_TOKENS, max_len), max_len, threads, out),
          "embedding encoder")
    handle = ffi.gc(out[0], lib.aotx_embed_free)
    return handle, keep
