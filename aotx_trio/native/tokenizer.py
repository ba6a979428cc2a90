"""The text tokenizer of a GGUF vocabulary: "llama" (SentencePiece-style BPE) or
"gpt2" (byte-level BPE by merge rank, :meth:`Tokenizer.from_bpe`).

A typed wrapper over the native tokenizer (csrc/tokenizer/tokenizer*.c, docs/tokenizer.md)::

    tok = Tokenizer.from_vocab(tokens, scores, types, bos_id=2, eos_id=1, add_bos=True)
    ids = tok.encode("Hello world")              # [2, 9259, 1902]
    tok.decode(ids[1:]) == b"Hello world"
    d = tok.detokenizer()
    out = b"".join(d.push(i) for i in ids) + d.flush()   # exact bytes, whole characters

The model loader builds the native handle itself and hands it out with
:meth:`Tokenizer.from_handle`.  :meth:`Tokenizer.from_gguf_fields` reads the
``tokenizer.ggml.*`` fields of a ``gguf.GGUFReader`` (tests and tools; the
``gguf`` package is never imported by this module).
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any

from aotx_trio import errors
from aotx_trio.native.lib import check, ffi, lib

# token_type values as GGUF stores them
NORMAL = 1
UNKNOWN = 2
CONTROL = 3
USER_DEFINED = 4
UNUSED = 5
BYTE = 6

_E_BUFFER_TOO_SMALL = int(lib.AOTX_E_BUFFER_TOO_SMALL)
_BYTE_PIECE = re.compile(rb"<0x[0-9A-Fa-f]{2}>")
# tokenizer.ggml.pre names of the byte-level pre-tokenizers
PRE_NAMES: dict[str, int] = {"default": 0, "gpt2": 0, "llama-bpe": 1, "llama3": 1, "qwen2": 2,
                             "smollm": 3}
_PRE_CANON = ("gpt2", "llama3", "qwen2", "smollm")


def _invalid(field: str, message: str) -> errors.InvalidInput:
    return errors.InvalidInput(f"{field}: {message}", code="invalid_argument", field=field)


def _check_vocab(n: int, types: Sequence[int] | None, ids: dict[str, int]) -> None:
    """Shared checks of both constructors: a non-empty vocabulary, one type per token,
    types in range, special ids inside the vocabulary (or -1)."""
    if n == 0:
        raise _invalid("tokens", "the vocabulary is empty")
    if types is not None and len(types) != n:
        raise _invalid("types", f"{len(types)} token types for {n} tokens")
    for name, value in ids.items():
        if not -1 <= value < n:
            raise _invalid(name, f"{value} is outside the vocabulary of {n} tokens")
    if types is not None:
        for i, ty in enumerate(types):
            if not 0 <= ty <= BYTE:
                raise _invalid("types", f"token {i} has token_type {ty} (0..6 allowed)")


def _packed(items: list[bytes]) -> tuple[Any, Any]:
    """(blob, offsets) cffi buffers: item i is blob[offsets[i]:offsets[i+1]]."""
    offsets = array("q", [0])
    offsets.extend(accumulate(len(p) for p in items))
    return (ffi.from_buffer("uint8_t[]", b"".join(items) or b"\0"),
            ffi.from_buffer("int64_t[]", offsets))


class Tokenizer:
    """A tokenizer handle: owned (built here, freed with this object) or borrowed."""

    def __init__(self, handle: Any, owner: object | None) -> None:
        """Use :meth:`from_vocab`, :meth:`from_handle` or :meth:`from_gguf_fields`."""
        self._h = handle
        self._owner = owner
        params = ffi.new("aotx_tokenizer_params *")
        lib.aotx_tokenizer_params_get(handle, params)
        self.n_vocab: int = int(lib.aotx_tokenizer_n_vocab(handle))
        self.bos_id: int = int(params.bos_id)
        self.eos_id: int = int(params.eos_id)
        self.unk_id: int = int(params.unk_id)
        self.pad_id: int = int(params.pad_id)
        self.add_bos: bool = bool(params.add_bos)
        self.add_space_prefix: bool = bool(params.add_space_prefix)
        self.max_token_bytes: int = int(lib.aotx_tokenizer_max_token_bytes(handle))
        bpe = int(lib.aotx_tokenizer_model(handle)) == int(lib.AOTX_TOK_MODEL_BPE)
        #: tokenizer.ggml.model: "llama" (SentencePiece-style) or "gpt2" (byte-level)
        self.model: str = "gpt2" if bpe else "llama"
        #: the byte-level pre-tokenizer ("gpt2", "llama3", "qwen2"); None in llama mode
        self.pre: str | None = _PRE_CANON[int(lib.aotx_tokenizer_pre(handle))] if bpe else None

    # -- construction ---------------------------------------------------------------

    @classmethod
    def from_vocab(cls, tokens: Sequence[bytes | str], scores: Sequence[float] | None = None,
                   types: Sequence[int] | None = None, *, bos_id: int = -1, eos_id: int = -1,
                   unk_id: int = -1, pad_id: int = -1, add_bos: bool = False,
                   add_space_prefix: bool = False) -> Tokenizer:
        """Build a tokenizer from vocabulary arrays (the native side keeps copies)."""
        n = len(tokens)
        _check_vocab(n, types, {"bos_id": bos_id, "eos_id": eos_id, "unk_id": unk_id,
                                "pad_id": pad_id})
        if scores is not None and len(scores) != n:
            raise _invalid("scores", f"{len(scores)} scores for {n} tokens")
        pieces = [t.encode() if isinstance(t, str) else bytes(t) for t in tokens]
        blob, offsets = _packed(pieces)
        params = ffi.new("aotx_tokenizer_params *", {
            "bos_id": bos_id, "eos_id": eos_id, "unk_id": unk_id, "pad_id": pad_id,
            "add_bos": int(add_bos), "add_space_prefix": int(add_space_prefix)})
        c_scores = ffi.NULL if scores is None else ffi.from_buffer("float[]", array("f", scores))
        c_types = ffi.NULL if types is None else ffi.from_buffer("int32_t[]", array("i", types))
        out = ffi.new("aotx_tokenizer **")
        rc = lib.aotx_tokenizer_new_packed(
            params, n, blob, offsets, c_scores, c_types, out)
        if rc != 0:
            check(rc, cls._vocab_detail(rc, pieces, types))
        return cls(ffi.gc(out[0], lib.aotx_tokenizer_free), None)

    @classmethod
    def from_bpe(cls, tokens: Sequence[bytes | str], merges: Sequence[bytes | str],
                 types: Sequence[int] | None = None, *, pre: str = "default", bos_id: int = -1,
                 eos_id: int = -1, unk_id: int = -1, pad_id: int = -1, add_bos: bool = False,
                 add_space_prefix: bool = False) -> Tokenizer:
        """A byte-level BPE tokenizer (GGUF ``tokenizer.ggml.model = "gpt2"``): ``tokens``
        are byte-level strings, ``merges`` "left right" strings (rank = position),
        ``pre`` the ``tokenizer.ggml.pre`` name."""
        n = len(tokens)
        if pre not in PRE_NAMES:
            raise errors.UnsupportedProfile(
                f"tokenizer.ggml.pre = {pre!r} is not supported ({', '.join(PRE_NAMES)})",
                code="tokenizer_pre_unsupported", field="tokenizer.ggml.pre")
        _check_vocab(n, types, {"bos_id": bos_id, "eos_id": eos_id, "unk_id": unk_id,
                                "pad_id": pad_id})
        pieces = [t.encode() if isinstance(t, str) else bytes(t) for t in tokens]
        mpieces = [m.encode() if isinstance(m, str) else bytes(m) for m in merges]
        known = set(pieces)
        for j, m in enumerate(mpieces):
            left, sep, right = m.partition(b" ")
            if not sep or not left or not right or left + right not in known or \
                    left not in known or right not in known:
                raise _invalid("merges", f"merges[{j}] = {m!r} is not 'left right' over "
                               "vocabulary pieces whose join is a piece")
        blob, offsets = _packed(pieces)
        mblob, moffsets = _packed(mpieces)
        params = ffi.new("aotx_tokenizer_params *", {
            "bos_id": bos_id, "eos_id": eos_id, "unk_id": unk_id, "pad_id": pad_id,
            "add_bos": int(add_bos), "add_space_prefix": int(add_space_prefix)})
        c_types = ffi.NULL if types is None else ffi.from_buffer("int32_t[]", array("i", types))
        out = ffi.new("aotx_tokenizer **")
        rc = lib.aotx_tokenizer_new_bpe_packed(
            params, PRE_NAMES[pre], n, blob, offsets, c_types, len(mpieces), mblob, moffsets,
            out)
        if rc != 0:
            check(rc, cls._vocab_detail(rc, pieces, types))
        return cls(ffi.gc(out[0], lib.aotx_tokenizer_free), None)

    @staticmethod
    def _vocab_detail(rc: int, pieces: list[bytes], types: Sequence[int] | None) -> str:
        if rc == int(lib.AOTX_E_TOKENIZER_VOCAB) and types is not None:
            for i, (p, ty) in enumerate(zip(pieces, types, strict=True)):
                if ty == BYTE and not _BYTE_PIECE.fullmatch(p):
                    return f"tokens[{i}] = {p!r} is a byte token not spelled <0xNN>"
        return "tokens"

    @classmethod
    def from_handle(cls, ptr: Any, owner: object) -> Tokenizer:
        """Wrap a borrowed native ``aotx_tokenizer *``; ``owner`` keeps it alive."""
        if ptr == ffi.NULL:
            raise _invalid("ptr", "NULL tokenizer handle")
        return cls(ptr, owner)

    @classmethod
    def from_gguf_fields(cls, reader: Any) -> Tokenizer:
        """Build from the ``tokenizer.ggml.*`` fields of a ``gguf.GGUFReader``."""
        fields = reader.fields

        def array_field(name: str) -> list[Any] | None:
            f = fields.get(name)
            if f is None:
                return None
            return [f.parts[i] for i in f.data]

        def scalar(name: str, default: int) -> int:
            f = fields.get(name)
            return default if f is None else int(f.parts[f.data[0]][0])

        def string(name: str) -> str | None:
            f = fields.get(name)
            return None if f is None else bytes(f.parts[f.data[0]]).decode()

        kind = string("tokenizer.ggml.model") or "llama"
        if kind not in ("llama", "gpt2"):
            raise errors.UnsupportedProfile(
                f"tokenizer.ggml.model = {kind!r}: only 'llama' and 'gpt2' vocabularies are "
                "supported", code="unsupported_profile", field="tokenizer.ggml.model")
        raw_tokens = array_field("tokenizer.ggml.tokens")
        if raw_tokens is None:
            raise _invalid("tokenizer.ggml.tokens", "missing")
        raw_scores = array_field("tokenizer.ggml.scores")
        raw_types = array_field("tokenizer.ggml.token_type")
        specials: dict[str, Any] = {
            "bos_id": scalar("tokenizer.ggml.bos_token_id", -1),
            "eos_id": scalar("tokenizer.ggml.eos_token_id", -1),
            "unk_id": scalar("tokenizer.ggml.unknown_token_id", -1),
            "pad_id": scalar("tokenizer.ggml.padding_token_id", -1),
            "add_bos": bool(scalar("tokenizer.ggml.add_bos_token", 0)),
            "add_space_prefix": bool(scalar("tokenizer.ggml.add_space_prefix", 0)),
        }
        tokens = [bytes(p) for p in raw_tokens]
        types = None if raw_types is None else [int(p[0]) for p in raw_types]
        if kind == "gpt2":
            raw_merges = array_field("tokenizer.ggml.merges") or []
            return cls.from_bpe(tokens, [bytes(m) for m in raw_merges], types,
                                pre=string("tokenizer.ggml.pre") or "default", **specials)
        return cls.from_vocab(
            tokens, None if raw_scores is None else [float(p[0]) for p in raw_scores], types,
            **specials)

    @property
    def handle(self) -> Any:
        """The native ``aotx_tokenizer *`` (valid while this object lives)."""
        return self._h

    # -- encoding -------------------------------------------------------------------

    def encode(self, text: str | bytes, add_bos: bool | None = None,
               parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos`` None means the vocabulary's add_bos_token."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        bos = self.add_bos if add_bos is None else add_bos
        n_out = ffi.new("int64_t *")
        cap = len(data) + 2
        while True:
            out = ffi.new("int32_t[]", cap)
            rc = lib.aotx_tokenize_ex(self._h, data, len(data), int(bos), int(parse_special),
                                      out, cap, n_out)
            if rc != _E_BUFFER_TOO_SMALL:
                break
            cap = int(n_out[0])
        check(rc, "text")
        return list(ffi.unpack(out, int(n_out[0])))

    # -- tokens ---------------------------------------------------------------------

    def _ref(self, token_id: int, fn: Any) -> bytes:
        if not 0 <= token_id < self.n_vocab:
            raise errors.InvalidInput(
                f"token id {token_id} is outside the vocabulary of {self.n_vocab} tokens",
                code="token_id_invalid", field="token_id")
        ptr = ffi.new("const uint8_t **")
        n = ffi.new("int32_t *")
        check(fn(self._h, token_id, ptr, n), "token_id")
        return bytes(ffi.buffer(ptr[0], n[0]))

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes a token stands for (control tokens: b"")."""
        return self._ref(token_id, lib.aotx_token_bytes_ref)

    def piece(self, token_id: int) -> bytes:
        """The vocabulary piece as GGUF spells it (b"\\xe2\\x96\\x81the", b"<0x0A>", b"<bos>")."""
        return self._ref(token_id, lib.aotx_token_piece)

    def token_type(self, token_id: int) -> int:
        """The token_type (NORMAL, CONTROL, BYTE, ...)."""
        rc = int(lib.aotx_token_type(self._h, token_id))
        check(rc, "token_id", ok_positive=True)
        return rc

    def decode(self, ids: Iterable[int]) -> bytes:
        """The bytes of a token sequence (what a :class:`Detokenizer` streams)."""
        d = self.detokenizer()
        parts = [d.push(i) for i in ids]
        parts.append(d.flush())
        return b"".join(parts)

    def detokenizer(self) -> Detokenizer:
        return Detokenizer(self)


class Detokenizer:
    """Streams token ids to bytes that never end inside a UTF-8 character."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._d = ffi.new("aotx_detok *")
        lib.aotx_detok_init(self._d)
        self._cap = tokenizer.max_token_bytes + 4
        self._buf = ffi.new("uint8_t[]", self._cap)
        self._n = ffi.new("int64_t *")

    def push(self, token_id: int) -> bytes:
        """The bytes that are complete after this token (possibly b"")."""
        rc = lib.aotx_detok_push_ex(self._tok.handle, self._d, token_id, self._buf, self._cap,
                                    self._n)
        if rc != 0:
            check(rc, f"token id {token_id}", field="token_id")
        return bytes(ffi.buffer(self._buf, self._n[0]))

    def flush(self) -> bytes:
        """Whatever is still held (an unfinished character, as is); starts a new stream."""
        n = int(lib.aotx_detok_flush(self._d, self._buf, self._cap))
        return bytes(ffi.buffer(self._buf, n))
