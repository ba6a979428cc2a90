"""Sentence embeddings: BERT encoder (C, csrc/embed*.c) + WordPiece tokenizer (here).

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
"""

from __future__ import annotations

import json
import mmap
import re
import struct
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from aotx_trio import errors
from aotx_trio.native import check, ffi, lib

F32Array = npt.NDArray[np.float32]

_MAX_TOKENS = 2048  # packed tokens per C call (scratch size); a call splits larger batches


# --------------------------------------------------------------------------- safetensors


def _is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class SafeTensors:
    """A safetensors file mapped read-only: u64 LE header length, JSON header, data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        size = len(self._map)
        if size < 8:
            raise errors.FormatError(f"{path}: {size} bytes, shorter than the 8-byte header length",
                                     code="safetensors_truncated", offset=0)
        (n,) = struct.unpack_from("<Q", self._map, 0)
        if n > size - 8:
            raise errors.FormatError(f"{path}: header length {n} runs past the end ({size} bytes)",
                                     code="safetensors_truncated", offset=0)
        try:
            header = json.loads(bytes(self._map[8:8 + n]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise errors.FormatError(f"{path}: header JSON is malformed: {exc}",
                                     code="safetensors_corrupt", offset=8) from exc
        if not isinstance(header, dict):
            raise errors.FormatError(f"{path}: header is not a JSON object",
                                     code="safetensors_corrupt", offset=8)
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.header: dict[str, Any] = header

    def names(self) -> list[str]:
        return list(self.header)

    def tensor(self, name: str, shape: tuple[int, ...]) -> F32Array:
        """The F32 tensor ``name`` (shape checked) as a read-only view of the map."""
        entry = self.header.get(name)
        if not isinstance(entry, dict):
            raise errors.FormatError(f"{self.path}: tensor {name!r} is missing",
                                     code="embed_tensor_missing", tensor=name)
        dtype = entry.get("dtype")
        if dtype != "F32":
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has dtype {dtype!r}; only F32 is supported",
                code="embed_dtype_unsupported", tensor=name)
        raw_shape = entry.get("shape")
        if not (isinstance(raw_shape, list) and all(_is_uint(d) for d in raw_shape)):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has shape {raw_shape!r}, not a list of "
                "non-negative integers", code="safetensors_corrupt", tensor=name)
        got = tuple(raw_shape)
        if got != shape:
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has shape {list(got)}, config needs {list(shape)}",
                code="embed_shape_invalid", tensor=name)
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_uint, offsets))):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} data_offsets {offsets!r} are not two "
                "non-negative integers", code="safetensors_corrupt", tensor=name)
        begin, end = offsets
        count = int(np.prod(shape))
        start = self.data_start + int(begin)
        if int(end) - int(begin) != 4 * count or start + 4 * count > len(self._map):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} data_offsets {[begin, end]} do not hold "
                f"{count} floats inside the file", code="safetensors_corrupt",
                tensor=name, offset=start)
        arr = np.frombuffer(self._map, dtype="<f4", count=count, offset=start).reshape(shape)
        if start % 4:  # unaligned floats: C wants aligned pointers
            arr = arr.copy()
        return arr


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    intermediate: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        raw = _read_json(path)
        act = raw.get("hidden_act", "gelu")
        if act != "gelu":
            raise errors.ConfigError(f"{path}: hidden_act {act!r}; only 'gelu' (erf) is supported",
                                     code="embed_config_invalid", key="hidden_act")
        pos_type = raw.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise errors.ConfigError(f"{path}: position_embedding_type {pos_type!r} unsupported",
                                     code="embed_config_invalid", key="position_embedding_type")

        def num(key: str, kind: type[int] | type[float] = int) -> Any:
            value = raw.get(key)
            ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
            if isinstance(value, bool) or not ok or not isinstance(value, int | float) \
                    or value <= 0:
                raise errors.ConfigError(f"{path}: {key} must be a positive number, got {value!r}",
                                         code="embed_config_invalid", key=key)
            return kind(value)

        cfg = cls(num("vocab_size"), num("hidden_size"), num("num_hidden_layers"),
                  num("num_attention_heads"), num("intermediate_size"),
                  num("max_position_embeddings"), num("type_vocab_size"),
                  num("layer_norm_eps", float))
        if cfg.hidden % cfg.n_heads:
            raise errors.ConfigError(
                f"{path}: hidden_size {cfg.hidden} is not a multiple of num_attention_heads "
                f"{cfg.n_heads}", code="embed_config_invalid", key="num_attention_heads")
        return cfg


def _read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise errors.ConfigError(f"{path} is missing", code="embed_file_missing",
                                 key=path.name) from exc
    except json.JSONDecodeError as exc:
        raise errors.ConfigError(f"{path}: malformed JSON: {exc}", code="embed_config_invalid",
                                 key=path.name) from exc
    if not isinstance(raw, dict):
        raise errors.ConfigError(f"{path}: not a JSON object", code="embed_config_invalid",
                                 key=path.name)
    return raw


# --------------------------------------------------------------------------- tokenizer

# Unicode White_Space (what the Rust tokenizers' char::is_whitespace tests).
_WHITESPACE = frozenset("\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
                        "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
_ASCII_PUNCT = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")


def _is_cjk(cp: int) -> bool:
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _is_control(ch: str) -> bool:
    # Cc, Cf, Co, Cs; unassigned code points (Cn) are kept, as the reference does
    cat = unicodedata.category(ch)
    return cat[0] == "C" and cat != "Cn"


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


class WordPiece:
    """BERT tokenization as tokenizer.json describes it (BertNormalizer,
    BertPreTokenizer, WordPiece greedy longest-match-first, [CLS] ... [SEP])."""

    def __init__(self, path: Path, max_len: int) -> None:
        raw = _read_json(path)
        model = raw.get("model") or {}
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or \
                not isinstance(model.get("vocab"), dict):
            raise errors.ConfigError(f"{path}: model.type must be WordPiece with a vocab",
                                     code="embed_config_invalid", key="model")

        def bad(key: str, what: str, value: object) -> errors.ConfigError:
            return errors.ConfigError(f"{path}: {key} = {value!r} is not {what}",
                                      code="embed_config_invalid", key=key)

        for k, v in model["vocab"].items():
            if not _is_uint(v):
                raise bad(f"model.vocab[{k!r}]", "a non-negative integer id", v)
        self.vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
        prefix = model.get("continuing_subword_prefix", "##")
        if not isinstance(prefix, str):
            raise bad("model.continuing_subword_prefix", "a string", prefix)
        self.prefix = prefix
        max_chars = model.get("max_input_chars_per_word", 100)
        if not _is_uint(max_chars):
            raise bad("model.max_input_chars_per_word", "a non-negative integer", max_chars)
        self.max_chars = int(max_chars)
        norm = raw.get("normalizer") or {}
        if not isinstance(norm, dict):
            raise bad("normalizer", "an object", norm)
        self.clean_text = bool(norm.get("clean_text", True))
        self.chinese = bool(norm.get("handle_chinese_chars", True))
        self.lowercase = bool(norm.get("lowercase", True))
        strip = norm.get("strip_accents")
        self.strip_accents = self.lowercase if strip is None else bool(strip)
        unk = model.get("unk_token", "[UNK]")
        if not isinstance(unk, str):
            raise bad("model.unk_token", "a string", unk)
        self.unk = self._special(path, unk)
        self.cls = self._special(path, "[CLS]")
        self.sep = self._special(path, "[SEP]")
        self.pad = self._special(path, "[PAD]")
        self.max_len = max_len  # word pieces including [CLS] and [SEP]
        # Added tokens with normalized=false match the raw text before anything else.
        tokens = raw.get("added_tokens") or []
        if not isinstance(tokens, list):
            raise bad("added_tokens", "a list", tokens)
        for i, t in enumerate(tokens):
            if not (isinstance(t, dict) and isinstance(t.get("content"), str)
                    and _is_uint(t.get("id"))):
                raise bad(f"added_tokens[{i}]", "an object with a string content and an id", t)
        added = [(t["content"], int(t["id"])) for t in tokens
                 if not t.get("normalized", False) and t["content"]]
        self.added = dict(added)
        words = sorted(self.added, key=len, reverse=True)
        self._added_re = re.compile("|".join(map(re.escape, words))) if words else None
        self._cache: dict[str, list[int]] = {}

    def _special(self, path: Path, token: str) -> int:
        if token not in self.vocab:
            raise errors.ConfigError(f"{path}: vocab lacks the special token {token!r}",
                                     code="embed_config_invalid", key="model.vocab")
        return self.vocab[token]

    def normalize(self, text: str) -> str:
        if self.clean_text:
            text = "".join(" " if c in _WHITESPACE else c for c in text
                           if c in "\t\n\r" or not (c == "\ufffd" or _is_control(c)))
        if self.chinese:
            text = "".join(f" {c} " if _is_cjk(ord(c)) else c for c in text)
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
        if self.lowercase:
            # per character, like the reference (str.lower() would apply final-sigma rules)
            text = "".join(c.lower() for c in text) if "\u03a3" in text else text.lower()
        return text

    @staticmethod
    def pre_tokenize(text: str) -> list[str]:
        words: list[str] = []
        for chunk in "".join(" " if c in _WHITESPACE else c for c in text).split(" "):
            start = 0
            for i, c in enumerate(chunk):
                if _is_punct(c):
                    if i > start:
                        words.append(chunk[start:i])
                    words.append(c)
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def word_ids(self, word: str) -> list[int]:
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        ids = self._greedy(word)
        if len(self._cache) < 200_000:
            self._cache[word] = ids
        return ids

    def _greedy(self, word: str) -> list[int]:
        if len(word) > self.max_chars:
            return [self.unk]
        ids: list[int] = []
        start, n = 0, len(word)
        while start < n:
            end = n
            found = -1
            while end > start:
                piece = word[start:end] if start == 0 else self.prefix + word[start:end]
                found = self.vocab.get(piece, -1)
                if found >= 0:
                    break
                end -= 1
            if found < 0:
                return [self.unk]
            ids.append(found)
            start = end
        return ids

    def pieces(self, text: str, limit: int | None = None) -> list[int]:
        """Word-piece ids of ``text`` without [CLS]/[SEP]; the first ``limit`` (all if None)."""
        ids: list[int] = []
        parts = [text] if self._added_re is None else self._split_added(text)
        for part in parts:
            if limit is not None and len(ids) >= limit:
                break
            if part in self.added:
                ids.append(self.added[part])
                continue
            for word in self.pre_tokenize(self.normalize(part)):
                ids.extend(self.word_ids(word))
                if limit is not None and len(ids) >= limit:
                    break
        return ids if limit is None else ids[:limit]

    def _split_added(self, text: str) -> list[str]:
        assert self._added_re is not None
        out: list[str] = []
        pos = 0
        for m in self._added_re.finditer(text):
            if m.start() > pos:
                out.append(text[pos:m.start()])
            out.append(m.group())
            pos = m.end()
        if pos < len(text):
            out.append(text[pos:])
        return out

    def encode(self, text: str) -> list[int]:
        """[CLS] + word pieces (truncated to max_len - 2) + [SEP]."""
        return [self.cls, *self.pieces(text, self.max_len - 2), self.sep]


# --------------------------------------------------------------------------- embedder

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


def _pooling_and_normalize(model_dir: Path) -> bool:
    """Checks the pipeline is mean pooling; returns whether a Normalize module follows."""
    modules_path = model_dir / "modules.json"
    normalize = True
    if modules_path.exists():
        try:
            modules = json.loads(modules_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise errors.ConfigError(f"{modules_path}: malformed JSON: {exc}",
                                     code="embed_config_invalid", key="modules.json") from exc
        if not isinstance(modules, list):
            raise errors.ConfigError(f"{modules_path}: not a JSON list",
                                     code="embed_config_invalid", key="modules.json")
        types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
        normalize = any(t.endswith("Normalize") for t in types)
    pool_path = model_dir / "1_Pooling" / "config.json"
    if pool_path.exists():
        pool = _read_json(pool_path)
        modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode") and v is True)
        if modes != ["pooling_mode_mean_tokens"]:
            raise errors.ConfigError(
                f"{pool_path}: pooling modes {modes}; only pooling_mode_mean_tokens is supported",
                code="embed_config_invalid", key="pooling_mode_mean_tokens")
    return normalize


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
        max_len = config.max_positions
        sb_path = model_dir / "sentence_bert_config.json"
        if sb_path.exists():
            value = _read_json(sb_path).get("max_seq_length", max_len)
            if not isinstance(value, int) or value < 3:
                raise errors.ConfigError(f"{sb_path}: max_seq_length must be an integer >= 3",
                                         code="embed_config_invalid", key="max_seq_length")
            max_len = min(value, config.max_positions)
        normalize = _pooling_and_normalize(model_dir)
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
