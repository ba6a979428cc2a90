"""The inference engine: the Python face of csrc/engine/model/model*.c, kv.c and sample.c.

``Engine.load(path)`` maps a GGUF model (Gemma 3 or the llama family) and
owns its thread pool, paged KV pool and tokenizer.  Two levels of API:

* ``generate(prompt, ...)`` yields the exact bytes of one completion as they
  are produced (prefill in chunks, then one decode step per token, stopping
  at EOS, an end-of-turn token (``<end_of_turn>``, ``<|im_end|>``, the chat template's)
  or ``max_tokens``);
* the batched API the scheduler drives: ``add_sequence`` / ``fork_sequence``
  / ``reserve`` / ``step`` (many sequences in one native step, each a
  prefill chunk or one decode token; the GIL is released for the whole step)
  / ``sample`` / ``release``.

An Engine is not thread-safe: one thread (the executor) calls it at a time.
Native codes become exceptions through :func:`aotx_trio.native.lib.check`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from aotx_trio.native.chat_template import ChatTemplate, TurnTokens, turn_tokens
from aotx_trio.native.gguf import GGUFFile
from aotx_trio.native.lib import check, ffi, lib
from aotx_trio.native.tokenizer import Tokenizer

_ERR_CAP = 512
PAGE_TOKENS = 8
"""Default KV page size in positions (Engine.load, the runtime, the router's descriptor):
at 8 the last partly filled page of each layer group wastes < 4 % of the slots of 8
short sequences (docs/benchmarks.md, "KV waste")."""


@dataclass(frozen=True)
class ModelInfo:
    arch: str
    n_vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    window: int
    ctx_train: int
    max_tokens: int
    max_batch_tokens: int
    max_seqs: int
    n_threads: int
    bos_id: int
    eos_id: int
    eot_id: int


@dataclass(frozen=True)
class KVStats:
    n_pages: int
    free_pages: int
    reserved_pages: int
    used_pages: int
    shared_pages: int
    n_seqs: int
    page_tokens: int
    n_groups: int
    page_bytes: int
    tokens_held: int
    slots_held: int
    slots_live: int
    elem_bytes: int = 4      # bytes per K/V element: 4 (float32) or 2 (binary16, kv_f16)

    @property
    def waste(self) -> float:
        """Fraction of held page slots that hold no position."""
        return 0.0 if self.slots_held == 0 else 1.0 - self.slots_live / self.slots_held


@dataclass
class EngineStats:
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0

    @property
    def prefill_tok_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else 0.0


@dataclass
class Generation:
    """What the last ``generate`` call did (filled while it runs)."""

    prompt_tokens: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    text: bytes = b""
    stop_reason: str = ""
    stats: EngineStats = field(default_factory=EngineStats)


class EngineSequence:
    """One KV sequence: its id in the pool, its PRNG and its detokenizer."""

    def __init__(self, engine: Engine, seq_id: int, seed: int) -> None:
        self.engine = engine
        self.id = seq_id
        self.rng: Any = ffi.new("aotx_rng *")
        lib.aotx_rng_seed(self.rng, seed & 0xFFFFFFFFFFFFFFFF)
        self.detok: Any = ffi.new("aotx_detok *")
        lib.aotx_detok_init(self.detok)
        self.released = False

    @property
    def length(self) -> int:
        info = ffi.new("aotx_kv_seq_info *")
        check(lib.aotx_kv_seq_info_get(self.engine._kv, self.id, info))
        return int(info.length)


class StepResult:
    """Logits of one step: row i belongs to the i-th sequence that asked for logits."""

    def __init__(self, buf: Any, rows: int, n_vocab: int) -> None:
        self._buf = buf
        self.rows = rows
        self.n_vocab = n_vocab

    def row_ptr(self, i: int) -> Any:
        if not 0 <= i < self.rows:
            raise IndexError(i)
        return self._buf + i * self.n_vocab

    def logits(self, i: int) -> np.ndarray:
        """A float32 copy of row i."""
        ptr = self.row_ptr(i)
        return np.frombuffer(ffi.buffer(ptr, self.n_vocab * 4), dtype=np.float32).copy()


_ARCH = {0: "gemma3", 1: "llama", 2: "qwen2", 3: "qwen3", 4: "gemma2", 5: "phi3"}


def backends() -> list[str]:
    """The compute backends this build of the native library carries, default first."""
    out: list[str] = []
    while (name := lib.aotx_backend_name(len(out))) != ffi.NULL:
        out.append(ffi.string(name).decode())
    return out


class Engine:
    def __init__(self, handle: Any, path: Path, offset: int = 0, length: int = 0,
                 name: str | None = None) -> None:
        self._m: Any = handle
        self.path = path
        #: the model's name in messages (a runtime file's component name; else the file's)
        self.name = name or path.name
        self._kv: Any = lib.aotx_model_kv(handle)
        self._tok: Any = lib.aotx_model_tokenizer(handle)
        self.backend: str = ffi.string(lib.aotx_model_backend(handle)).decode()
        raw = ffi.new("aotx_model_info *")
        lib.aotx_model_info_get(handle, raw)
        self.info = ModelInfo(
            arch=_ARCH.get(int(raw.arch), "?"), n_vocab=raw.n_vocab, d_model=raw.d_model,
            n_layers=raw.n_layers, n_heads=raw.n_heads, n_kv_heads=raw.n_kv_heads,
            head_dim=raw.head_dim, window=raw.window, ctx_train=raw.ctx_train,
            max_tokens=raw.max_tokens, max_batch_tokens=raw.max_batch_tokens,
            max_seqs=raw.max_seqs, n_threads=raw.n_threads, bos_id=raw.bos_id,
            eos_id=raw.eos_id, eot_id=raw.eot_id)
        #: the GGUF's ``tokenizer.chat_template``, compiled (None: the file has none, or
        #: no vocabulary); ``turns``: the chat turns as tokens (native/chat_template.py)
        self.chat_template: ChatTemplate | None = None
        self.turns: TurnTokens | None = None
        if self._tok != ffi.NULL:
            self._load_chat(offset, length)
        #: generation stops at these: EOS, the built-in end-of-turn token, and the
        #: control tokens that close a model turn in the chat template
        self.stop_ids = frozenset(i for i in (raw.eos_id, raw.eot_id) if i >= 0) | (
            self.turns.end_of_turn if self.turns is not None else frozenset())
        n = self.info.n_vocab
        self._probs: Any = ffi.new("float[]", n)
        self._idx: Any = ffi.new("int32_t[]", n)
        self._logits: Any = ffi.new("float[]", self.info.max_seqs * n)
        self._err: Any = ffi.new("char[]", _ERR_CAP)
        self.stats = EngineStats()
        self.last = Generation()

    # ---- life cycle ----

    @classmethod
    def load(cls, path: str | Path, threads: int = 0, kv_pages: int = 0, max_seqs: int = 16,
             max_tokens: int = 0, max_batch_tokens: int = 512, page_tokens: int = PAGE_TOKENS,
             backend: str | None = None, *, offset: int = 0, length: int = 0,
             kv_f16: bool = False, name: str | None = None) -> Engine:
        """Map the GGUF at ``path`` (or the extent [offset, offset + length) of it, as a
        runtime file holds its models: mapped in place, never copied).  ``backend``: the
        compute backend by name (None: the default, "cpu"; :func:`backends` lists the
        ones this build carries).  ``kv_f16``: K/V pages hold IEEE binary16 (half the
        KV memory per position; attention still sums in float32).  ``name``: the model's
        name in messages (default: the file's)."""
        p = ffi.new("aotx_model_params *")
        lib.aotx_model_default_params(p)
        p.n_threads, p.kv_pages, p.max_seqs = threads, kv_pages, max_seqs
        p.max_tokens, p.max_batch_tokens, p.page_tokens = max_tokens, max_batch_tokens, page_tokens
        p.file_offset, p.file_length = offset, length
        p.kv_f16 = int(kv_f16)
        c_backend = ffi.new("char[]", backend.encode()) if backend is not None else ffi.NULL
        p.backend = c_backend
        out = ffi.new("aotx_model **")
        err = ffi.new("char[]", _ERR_CAP)
        rc = lib.aotx_model_load(str(path).encode(), p, out, err, _ERR_CAP)
        check(rc, f"{path}: {ffi.string(err).decode(errors='replace')}")
        return cls(out[0], Path(path), offset, length, name)   # a failed __init__: __del__ frees

    def _load_chat(self, offset: int, length: int) -> None:
        with GGUFFile.open(self.path, offset, length) as g:
            source = g.string("tokenizer.chat_template")
        if source is not None:
            tok = Tokenizer.from_handle(self._tok, self)

            def piece(i: int) -> str:
                return tok.piece(i).decode("utf-8", "replace") if i >= 0 else ""

            self.chat_template = ChatTemplate(source, name=self.name,
                                              bos_token=piece(tok.bos_id),
                                              eos_token=piece(tok.eos_id))
        self.turns = turn_tokens(
            self.chat_template, lambda t: self.tokenize(t, False, parse_special=True),
            lambda t: self.tokenize(t, False, parse_special=False), self.info.bos_id)

    def close(self) -> None:
        if self._m is not None:
            lib.aotx_model_free(self._m)
            self._m = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    # ---- tokens ----

    def _need_tokenizer(self) -> None:
        if self._tok == ffi.NULL:
            check(lib.AOTX_E_MODEL_VOCAB, f"{self.path} has no vocabulary")

    def tokenize(self, text: str | bytes, add_bos: bool = True,
                 parse_special: bool = False) -> list[int]:
        self._need_tokenizer()
        data = text.encode() if isinstance(text, str) else text
        cap = len(data) + 8
        for _ in range(2):
            out = ffi.new("int32_t[]", cap)
            n = ffi.new("int64_t *")
            rc = lib.aotx_tokenize_ex(self._tok, data, len(data), int(add_bos), int(parse_special),
                                      out, cap, n)
            if rc == lib.AOTX_E_BUFFER_TOO_SMALL:
                cap = int(n[0])
                continue
            check(rc)
            return list(out[0:n[0]])
        raise AssertionError("tokenizer asked for more room twice")

    def token_bytes(self, token: int) -> bytes:
        self._need_tokenizer()
        ptr = ffi.new("const uint8_t **")
        n = ffi.new("int32_t *")
        check(lib.aotx_token_bytes_ref(self._tok, token, ptr, n))
        return bytes(ffi.buffer(ptr[0], n[0]))

    def detokenize(self, ids: Sequence[int]) -> bytes:
        return b"".join(self.token_bytes(i) for i in ids)

    def detok_push(self, seq: EngineSequence, token: int) -> bytes:
        """The bytes ``token`` completes in ``seq``'s output (held back while a UTF-8
        character is incomplete)."""
        return self._detok_push(seq, token)

    def detok_flush(self, seq: EngineSequence) -> bytes:
        """Whatever ``seq``'s detokenizer still holds (an incomplete character)."""
        return self._detok_flush(seq)

    def _detok_push(self, seq: EngineSequence, token: int) -> bytes:
        buf = ffi.new("uint8_t[]", 256)
        n = ffi.new("int64_t *")
        rc = lib.aotx_detok_push_ex(self._tok, seq.detok, token, buf, 256, n)
        if rc == lib.AOTX_E_BUFFER_TOO_SMALL:
            buf = ffi.new("uint8_t[]", int(n[0]))
            rc = lib.aotx_detok_push_ex(self._tok, seq.detok, token, buf, int(n[0]), n)
        check(rc)
        return bytes(ffi.buffer(buf, n[0]))

    def _detok_flush(self, seq: EngineSequence) -> bytes:
        buf = ffi.new("uint8_t[]", 8)
        n = lib.aotx_detok_flush(seq.detok, buf, 8)
        return bytes(ffi.buffer(buf, n)) if n > 0 else b""

    # ---- the batched API ----

    def add_sequence(self, seed: int = 0) -> EngineSequence:
        sid = ffi.new("uint32_t *")
        check(lib.aotx_kv_seq_new(self._kv, sid))
        return EngineSequence(self, int(sid[0]), seed)

    def fork_sequence(self, src: EngineSequence, n_tokens: int,
                      seed: int = 0) -> tuple[EngineSequence, int]:
        """A new sequence sharing src's first n_tokens (rounded down to whole
        pages); returns it and how many positions it shares."""
        sid = ffi.new("uint32_t *")
        shared = ffi.new("int32_t *")
        check(lib.aotx_kv_seq_fork(self._kv, src.id, n_tokens, sid, shared))
        return EngineSequence(self, int(sid[0]), seed), int(shared[0])

    def reserve(self, seq: EngineSequence, n_tokens: int) -> None:
        check(lib.aotx_kv_seq_reserve(self._kv, seq.id, n_tokens))

    def pages_needed(self, length: int, n_tokens: int) -> int:
        return int(lib.aotx_kv_pages_needed(self._kv, length, n_tokens))

    def release(self, seq: EngineSequence) -> None:
        if not seq.released:
            check(lib.aotx_kv_seq_free(self._kv, seq.id))
            seq.released = True

    def step(self, feeds: Sequence[tuple[EngineSequence, Sequence[int]]],
             want_logits: Sequence[bool] | None = None) -> StepResult:
        """One native step over every (sequence, tokens) pair."""
        n = len(feeds)
        if n == 0:
            return StepResult(self._logits, 0, self.info.n_vocab)
        seqs = ffi.new("uint32_t[]", [s.id for s, _ in feeds])
        n_tok = ffi.new("int32_t[]", [len(t) for _, t in feeds])
        toks = ffi.new("int32_t[]", [int(x) for _, t in feeds for x in t])
        want = None if want_logits is None else ffi.new("int32_t[]", [int(w) for w in want_logits])
        b = ffi.new("aotx_batch *")
        b.n_seqs, b.seq, b.n_tok, b.tokens = n, seqs, n_tok, toks
        b.want_logits = want if want is not None else ffi.NULL
        b.logits = self._logits
        rc = lib.aotx_model_step(self._m, b, self._err, _ERR_CAP)
        check(rc, ffi.string(self._err).decode(errors="replace"))
        rows = n if want_logits is None else sum(1 for w in want_logits if w)
        return StepResult(self._logits, rows, self.info.n_vocab)

    def sample(self, seq: EngineSequence, result: StepResult, row: int, temperature: float = 0.0,
               top_p: float = 1.0) -> int:
        p = ffi.new("aotx_sample_params *")
        p.temperature, p.top_p = temperature, top_p
        tok = lib.aotx_sample(result.row_ptr(row), self.info.n_vocab, p, seq.rng, self._probs,
                              self._idx)
        check(min(int(tok), 0))
        return int(tok)

    def kv_stats(self) -> KVStats:
        s = ffi.new("aotx_kv_stats *")
        lib.aotx_kv_stats_get(self._kv, s)
        return KVStats(s.n_pages, s.free_pages, s.reserved_pages, s.used_pages, s.shared_pages,
                       s.n_seqs, s.page_tokens, s.n_groups, s.page_bytes, s.tokens_held,
                       s.slots_held, s.slots_live, s.elem_bytes)

    # ---- one completion ----

    def prefill(self, seq: EngineSequence, tokens: Sequence[int]) -> StepResult:
        """Feeds tokens in chunks of max_batch_tokens; logits of the last one."""
        chunk = self.info.max_batch_tokens
        res = StepResult(self._logits, 0, self.info.n_vocab)
        for i in range(0, len(tokens), chunk):
            part = tokens[i:i + chunk]
            last = i + chunk >= len(tokens)
            res = self.step([(seq, part)], [last])
        return res

    def generate(self, prompt: str | bytes | Sequence[int], max_tokens: int = 128,
                 temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> Iterator[bytes]:
        """Yields the completion's bytes as they become complete UTF-8; the
        whole record lands in ``self.last``."""
        ids = list(prompt) if not isinstance(prompt, (str, bytes)) else self.tokenize(prompt)
        if not ids:
            check(lib.AOTX_E_INVALID_ARGUMENT, "the prompt has no tokens")
        gen = Generation(prompt_tokens=ids)
        self.last = gen
        seq = self.add_sequence(seed)
        try:
            t0 = time.perf_counter()
            res = self.prefill(seq, ids)
            tok = self.sample(seq, res, 0, temperature, top_p)
            gen.stats.prefill_tokens, gen.stats.prefill_s = len(ids), time.perf_counter() - t0
            self.stats.prefill_tokens += len(ids)
            self.stats.prefill_s += gen.stats.prefill_s
            t1 = time.perf_counter()
            steps = 0
            while True:
                if tok in self.stop_ids:
                    gen.stop_reason = "stop"
                    break
                gen.tokens.append(tok)
                piece = self._detok_push(seq, tok)
                if piece:
                    gen.text += piece
                    yield piece
                if len(gen.tokens) >= max_tokens:
                    gen.stop_reason = "length"
                    break
                if seq.length >= self.info.max_tokens:
                    gen.stop_reason = "context"
                    break
                res = self.step([(seq, [tok])])
                steps += 1
                tok = self.sample(seq, res, 0, temperature, top_p)
            tail = self._detok_flush(seq)
            if tail:
                gen.text += tail
                yield tail
            gen.stats.decode_tokens, gen.stats.decode_s = steps, time.perf_counter() - t1
            self.stats.decode_tokens += steps
            self.stats.decode_s += gen.stats.decode_s
        finally:
            self.release(seq)
