"""BERT WordPiece tokenization as ``tokenizer.json`` describes it (docs/embeddings.md,
"Tokenization"): BertNormalizer, BertPreTokenizer, greedy longest-match-first
WordPiece, added tokens, [CLS] ... [SEP].  Python reads and validates the file; C
(csrc/tokenizer/tokenizer_wordpiece.c) tokenizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aotx_trio import errors
from aotx_trio.native._bert_config import read_json
from aotx_trio.native._safetensors import is_uint
from aotx_trio.native.lib import check, ffi, lib

_MAX_ID = 2**31 - 1


def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")   # JSON may carry lone surrogates


class WordPiece:
    """BERT tokenization as tokenizer.json describes it (BertNormalizer,
    BertPreTokenizer, WordPiece greedy longest-match-first, [CLS] ... [SEP]).

    This class reads and validates tokenizer.json; the tokenization itself runs in
    C (csrc/tokenizer/tokenizer_wordpiece.c, the GIL released).  tests/wordpiece_oracle.py
    keeps a pure-Python version of the same steps as the test oracle."""

    def __init__(self, path: Path, max_len: int) -> None:
        raw = read_json(path)
        model = raw.get("model") or {}
        if not isinstance(model, dict) or model.get("type") != "WordPiece" or \
                not isinstance(model.get("vocab"), dict):
            raise errors.ConfigError(f"{path}: model.type must be WordPiece with a vocab",
                                     code="embed_config_invalid", key="model")

        def bad(key: str, what: str, value: object) -> errors.ConfigError:
            return errors.ConfigError(f"{path}: {key} = {value!r} is not {what}",
                                      code="embed_config_invalid", key=key)

        for k, v in model["vocab"].items():
            if not is_uint(v) or v > _MAX_ID:
                raise bad(f"model.vocab[{k!r}]", "a non-negative 31-bit integer id", v)
        self.vocab: dict[str, int] = {str(k): int(v) for k, v in model["vocab"].items()}
        prefix = model.get("continuing_subword_prefix", "##")
        if not isinstance(prefix, str):
            raise bad("model.continuing_subword_prefix", "a string", prefix)
        self.prefix = prefix
        max_chars = model.get("max_input_chars_per_word", 100)
        if not is_uint(max_chars):
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
                    and is_uint(t.get("id")) and t["id"] <= _MAX_ID):
                raise bad(f"added_tokens[{i}]", "an object with a string content and an id", t)
        added = [(t["content"], int(t["id"])) for t in tokens
                 if not t.get("normalized", False) and t["content"]]
        self.added = dict(added)
        self._native = self._build()

    def _special(self, path: Path, token: str) -> int:
        if token not in self.vocab:
            raise errors.ConfigError(f"{path}: vocab lacks the special token {token!r}",
                                     code="embed_config_invalid", key="model.vocab")
        return self.vocab[token]

    def _build(self) -> Any:
        """The C tokenizer over this vocabulary (it copies what it needs)."""
        pieces = [_utf8(k) for k in self.vocab]
        added = [_utf8(k) for k in self.added]
        keep = [ffi.new("char[]", b) for b in pieces + added]
        p = ffi.new("aotx_wordpiece_params *")
        p.n_vocab = len(pieces)
        p.tokens = tokens = ffi.new("char *[]", keep[:len(pieces)])
        p.token_lens = lens = ffi.new("int32_t[]", [len(b) for b in pieces])
        p.ids = ids = ffi.new("int32_t[]", list(self.vocab.values()))
        prefix = _utf8(self.prefix)
        p.prefix = pre = ffi.new("char[]", prefix)
        p.prefix_len = len(prefix)
        p.max_chars = min(self.max_chars, _MAX_ID)
        p.unk_id = self.unk
        p.clean_text, p.chinese = int(self.clean_text), int(self.chinese)
        p.strip_accents, p.lowercase = int(self.strip_accents), int(self.lowercase)
        p.n_added = len(added)
        p.added = a_tok = ffi.new("char *[]", keep[len(pieces):])
        p.added_lens = a_len = ffi.new("int32_t[]", [len(b) for b in added])
        p.added_ids = a_ids = ffi.new("int32_t[]", list(self.added.values()))
        out = ffi.new("aotx_wordpiece **")
        check(lib.aotx_wordpiece_new(p, out), "WordPiece tokenizer")
        del tokens, lens, ids, pre, a_tok, a_len, a_ids, keep   # copied by C
        return ffi.gc(out[0], lib.aotx_wordpiece_free)

    def pieces(self, text: str, limit: int | None = None) -> list[int]:
        """Word-piece ids of ``text`` without [CLS]/[SEP]; the first ``limit`` (all if None)."""
        data = _utf8(text)
        cap = limit if limit is not None else 2 * len(data) + 16
        n = ffi.new("int64_t *")
        buf = ffi.new("int32_t[]", max(cap, 1))
        rc = lib.aotx_wordpiece_encode(self._native, data, len(data),
                                       -1 if limit is None else limit, buf, cap, n)
        if rc == lib.AOTX_E_BUFFER_TOO_SMALL:
            cap = int(n[0])
            buf = ffi.new("int32_t[]", cap)
            rc = lib.aotx_wordpiece_encode(self._native, data, len(data), -1, buf, cap, n)
        check(rc, "WordPiece encode")
        return list(ffi.unpack(buf, int(n[0])))

    def encode(self, text: str) -> list[int]:
        """[CLS] + word pieces (truncated to max_len - 2) + [SEP]."""
        return [self.cls, *self.pieces(text, self.max_len - 2), self.sep]
