"""Small synthetic GGUF models for the decoder tests (random weights).

``write_model(path, Spec(arch=..., types=...))`` writes a gemma3, gemma2,
llama, qwen2, qwen3 or phi3 model (each with its family's tensors and metadata:
QK-norms, post-norms, soft-caps, fused qkv / gate_up, partial and long RoPE)
with gguf-py's GGUFWriter: every matrix in one of the tensor types the
kernels support (Q2_K .. Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, F16, BF16,
F32; or Q8_1, which they do not, for the refusal tests).  gguf-py cannot quantize
k-quants or the IQ4 types, so their blocks are random bytes with bounded scales, which
is a valid (if unusual) tensor.  The vocabulary is
SentencePiece-style: 4 specials, 256 byte tokens, then word pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

__all__ = ["ALL_TYPES", "COMMON_TYPES", "FLOAT_TYPES", "Q", "Spec", "Vocab", "encode", "tiny",
           "vocab", "write_model"]

ALL_TYPES: tuple[Q, ...] = (Q.Q4_K, Q.Q5_0, Q.Q6_K, Q.Q8_0, Q.F16, Q.BF16, Q.F32, Q.Q5_K, Q.Q4_0)
# the quant types added with the common set (issue 26): Q4_1 / Q5_1 quantized by gguf-py,
# the others random blocks
COMMON_TYPES: tuple[Q, ...] = (Q.Q4_1, Q.Q2_K, Q.IQ4_NL, Q.Q5_1, Q.Q3_K, Q.IQ4_XS)

# random-byte types: (byte offset, fp16 value) of each float field of a block, chosen so
# that the weights come out about as large as the quantized ones (|w| <~ 0.1)
_RANDOM_SCALES: dict[Q, tuple[tuple[int, float], ...]] = {
    Q.Q2_K: ((80, 0.004), (82, 0.004)),
    Q.Q3_K: ((108, 0.0005),),
    Q.IQ4_NL: ((0, 0.0005),),
    Q.IQ4_XS: ((0, 0.00002),),
    Q.Q8_1: ((0, 0.0005), (2, 0.0)),
}
FLOAT_TYPES: tuple[Q, ...] = (Q.F32,)

WORDS = ("the", "capital", "of", "France", "is", "Paris", "a", "city", "and", "in", "to",
         "it", "was", "on", "for", "with", "as", "by", "at", "from", "Hello", "world")


@dataclass
class Vocab:
    """A vocabulary written instead of vocab(n_vocab): tokenizer.ggml.model `model` (with
    `pre` and `merges` for "gpt2"), the token arrays (no scores: none written) and
    add_space_prefix."""
    tokens: Sequence[str]
    types: Sequence[int]
    scores: Sequence[float] | None = None
    model: str = "llama"
    pre: str | None = None
    merges: Sequence[str] | None = None
    space_prefix: bool = False


@dataclass
class Spec:
    arch: str = "gemma3"
    d_model: int = 256
    n_layers: int = 6
    d_ff: int = 512
    n_heads: int = 4
    n_kv_heads: int = 1
    head_dim: int = 64
    window: int = 8
    n_vocab: int = 512
    types: Sequence[Q] = field(default_factory=lambda: ALL_TYPES)
    embd_type: Q = Q.Q8_0
    tied: bool = True
    qkv_bias: bool = False
    seed: int = 0
    eos_id: int = 1
    zero_output_norm: bool = False   # every logit 0: greedy picks token 0
    n_rot: int = 0                   # rope.dimension_count (0: not written, all of head_dim)
    attn_softcap: float = 0.0        # gemma2: attn_logit_softcapping (0: not written)
    final_softcap: float = 0.0       # gemma2: final_logit_softcapping (0: not written)
    fused: bool = True               # phi3: attn_qkv and a gate_up ffn_up of 2 * d_ff rows
    long_rope: bool = False          # phi3: rope_factors_long/short, original context 512
    vocabulary: Vocab | None = None  # instead of vocab(n_vocab); n_vocab is then its size
    attn_factor: float = 1.1         # with long_rope: rope.scaling.attn_factor (0: not written)

    chat_template: str | None = None  # tokenizer.chat_template
    controls: dict[int, str] = field(default_factory=dict)   # id -> a control piece instead


def tiny(arch: str, vocabulary: Vocab, **kw: object) -> Spec:
    """A small float model of `arch` around a given vocabulary (tokenizer tests)."""
    args: dict[str, object] = {"n_layers": 1, "d_model": 64, "d_ff": 128, "n_heads": 2,
                               "n_kv_heads": 1, "head_dim": 32, "types": FLOAT_TYPES}
    return Spec(arch=arch, vocabulary=vocabulary, **(args | kw))  # type: ignore[arg-type]


def vocab(n: int) -> tuple[list[str], list[float], list[int]]:
    toks = ["<pad>", "<eos>", "<bos>", "<unk>"]
    types = [3, 3, 3, 2]
    toks += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    pieces = ["\u2581" + w for w in WORDS] + list(WORDS)
    pieces += ["\u2581", "<end_of_turn>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    k = 0
    while len(toks) < n:
        p = pieces[k] if k < len(pieces) else f"\u2581w{k}"
        toks.append(p)
        types.append(3 if p == "<end_of_turn>" else 1)
        k += 1
    scores = [0.0] * 4 + [-1000.0] * 256 + [-float(len(t)) * 0.0 - i * 0.01 for i, t in
                                            enumerate(toks[260:])]
    return toks[:n], scores[:n], types[:n]


def _kquant_blocks(rng: np.random.Generator, rows: int, cols: int, qt: Q) -> np.ndarray:
    nb = rows * cols // 256
    if qt == Q.Q6_K:
        b = rng.integers(0, 256, size=(nb, 210), dtype=np.uint8)
        b[:, 192:208] = rng.integers(-24, 25, size=(nb, 16)).astype(np.int8).view(np.uint8)
        b[:, 208:210] = np.full(nb, 0.0004, np.float16).view(np.uint8).reshape(nb, 2)
    else:
        size = 144 if qt == Q.Q4_K else 176
        b = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
        d = 0.0012 if qt == Q.Q4_K else 0.0006
        b[:, 0:2] = np.full(nb, d, np.float16).view(np.uint8).reshape(nb, 2)
        b[:, 2:4] = np.full(nb, d * 8, np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, -1)


def _random_blocks(rng: np.random.Generator, rows: int, cols: int, qt: Q) -> np.ndarray:
    be, bb = gguf.GGML_QUANT_SIZES[qt]
    nb = rows * cols // be
    b = rng.integers(0, 256, size=(nb, bb), dtype=np.uint8)
    for off, v in _RANDOM_SCALES[qt]:
        b[:, off:off + 2] = np.full(nb, v, np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(rows, -1)


def encode(rng: np.random.Generator, w: np.ndarray, qt: Q) -> np.ndarray:
    """Tensor data for GGUFWriter.add_tensor(raw_dtype=qt)."""
    rows, cols = w.shape
    if qt in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        return _kquant_blocks(rng, rows, cols, qt)
    if qt in _RANDOM_SCALES:
        return _random_blocks(rng, rows, cols, qt)
    if qt == Q.F32:
        return w.astype(np.float32)
    if qt == Q.F16:
        return w.astype(np.float16)
    return np.asarray(quants.quantize(w.astype(np.float32), qt))


def write_model(path: Path, spec: Spec) -> Path:
    rng = np.random.default_rng(spec.seed)
    a = spec.arch
    voc = spec.vocabulary
    if voc is None:
        toks, scores, types = vocab(spec.n_vocab)
        voc = Vocab(toks, types, scores)
    n_vocab = len(voc.tokens)
    wr = gguf.GGUFWriter(str(path), a)
    wr.add_uint32(f"{a}.context_length", 1024)
    wr.add_uint32(f"{a}.embedding_length", spec.d_model)
    wr.add_uint32(f"{a}.block_count", spec.n_layers)
    wr.add_uint32(f"{a}.feed_forward_length", spec.d_ff)
    wr.add_uint32(f"{a}.attention.head_count", spec.n_heads)
    wr.add_uint32(f"{a}.attention.head_count_kv", spec.n_kv_heads)
    wr.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    wr.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    wr.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    wr.add_float32(f"{a}.rope.freq_base", 1e6 if a == "gemma3" else 1e4)
    if a in ("gemma3", "gemma2", "phi3") and spec.window:
        wr.add_uint32(f"{a}.attention.sliding_window", spec.window)
    if spec.chat_template is not None:
        wr.add_chat_template(spec.chat_template)
    toks, ttypes = list(voc.tokens), list(voc.types)
    for i, piece in spec.controls.items():
        toks[i], ttypes[i] = piece, 3
    if spec.n_rot:
        wr.add_uint32(f"{a}.rope.dimension_count", spec.n_rot)
    if spec.attn_softcap:
        wr.add_float32(f"{a}.attn_logit_softcapping", spec.attn_softcap)
    if spec.final_softcap:
        wr.add_float32(f"{a}.final_logit_softcapping", spec.final_softcap)
    if spec.long_rope:
        wr.add_uint32(f"{a}.rope.scaling.original_context_length", 512)
        if spec.attn_factor:
            wr.add_float32(f"{a}.rope.scaling.attn_factor", spec.attn_factor)
    wr.add_tokenizer_model(voc.model)
    if voc.pre is not None:
        wr.add_tokenizer_pre(voc.pre)
    if voc.merges is not None:
        wr.add_token_merges(voc.merges)
    wr.add_token_list(toks)
    if voc.scores is not None:
        wr.add_token_scores(voc.scores)
    wr.add_token_types(ttypes)
    wr.add_bos_token_id(2)
    wr.add_eos_token_id(spec.eos_id)
    wr.add_unk_token_id(3)
    wr.add_pad_token_id(0)
    wr.add_add_bos_token(True)
    wr.add_add_space_prefix(voc.space_prefix)
    d, hd = spec.d_model, spec.head_dim
    k = 0

    def mat(name: str, rows: int, cols: int, qt: Q | None = None, scale: float = 0.06) -> None:
        nonlocal k
        if qt is None:
            qt = spec.types[k % len(spec.types)]
            k += 1
        w = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        wr.add_tensor(name, encode(rng, w, qt), raw_dtype=qt)

    def vec(name: str, n: int, base: float = 1.0) -> None:
        wr.add_tensor(name, (base + 0.1 * rng.standard_normal(n)).astype(np.float32))

    gem = a in ("gemma3", "gemma2")
    mat("token_embd.weight", n_vocab, d, spec.embd_type, scale=0.05 if gem else 1.0)
    if not spec.tied:
        mat("output.weight", n_vocab, d)
    if spec.zero_output_norm:
        wr.add_tensor("output_norm.weight", np.zeros(d, dtype=np.float32))
    else:
        vec("output_norm.weight", d)
    if spec.long_rope:
        half = (spec.n_rot or hd) // 2
        wr.add_tensor("rope_factors_long.weight",
                      np.linspace(1.0, 12.0, half, dtype=np.float32))
        wr.add_tensor("rope_factors_short.weight",
                      np.linspace(1.0, 1.5, half, dtype=np.float32))
    fused = a == "phi3" and spec.fused
    for layer in range(spec.n_layers):
        p = f"blk.{layer}."
        if fused:
            mat(p + "attn_qkv.weight", (spec.n_heads + 2 * spec.n_kv_heads) * hd, d)
        else:
            mat(p + "attn_q.weight", spec.n_heads * hd, d)
            mat(p + "attn_k.weight", spec.n_kv_heads * hd, d)
            mat(p + "attn_v.weight", spec.n_kv_heads * hd, d)
        mat(p + "attn_output.weight", d, spec.n_heads * hd)
        if fused:
            mat(p + "ffn_up.weight", 2 * spec.d_ff, d)
        else:
            mat(p + "ffn_gate.weight", spec.d_ff, d)
            mat(p + "ffn_up.weight", spec.d_ff, d)
        mat(p + "ffn_down.weight", d, spec.d_ff)
        vec(p + "attn_norm.weight", d)
        vec(p + "ffn_norm.weight", d)
        if gem:
            vec(p + "post_attention_norm.weight", d)
            vec(p + "post_ffw_norm.weight", d)
        if a in ("gemma3", "qwen3"):
            vec(p + "attn_q_norm.weight", hd)
            vec(p + "attn_k_norm.weight", hd)
        if spec.qkv_bias:
            vec(p + "attn_q.bias", spec.n_heads * hd, 0.0)
            vec(p + "attn_k.bias", spec.n_kv_heads * hd, 0.0)
            vec(p + "attn_v.bias", spec.n_kv_heads * hd, 0.0)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
