"""An independent numpy forward pass of the decoder (the tests' oracle).

Reads a GGUF file with gguf-py, dequantizes every tensor with
``gguf.quants.dequantize`` and runs the decoder in
float64 over a whole token sequence, returning logits at every position:
gemma3, gemma2, llama/mistral, qwen2, qwen3 and phi3 as their GGUF metadata
and tensors describe them.
Written from the public architecture descriptions, not from csrc/.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import quants

F = np.float64


K_QUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}
LEGACY_QUANTS = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"}


def quantize_act(x: np.ndarray, block: int) -> np.ndarray:
    """Activations as the kernels see them: per block of `block` values,
    d = max|x| / 127, q = round-half-even(x / d) in [-127, 127], x' = d * q
    (float32 arithmetic as in the C code)."""
    x32 = np.asarray(x, dtype=np.float32)
    shp = x32.shape
    b = x32.reshape(-1, block)
    d = (np.abs(b).max(axis=1, keepdims=True) / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.clip(np.rint(b * inv), -127, 127)
    return np.asarray((q.astype(F) * d.astype(F)).reshape(shp))


def act_residual(x: np.ndarray, block: int) -> np.ndarray:
    """What quantize_act leaves out, x - quantize_act(x), in float32 (rounded once, as
    the engine's FMA computes it)."""
    x32 = np.asarray(x, dtype=np.float32)
    return np.asarray((x32.astype(F) - quantize_act(x32, block)).astype(np.float32))


class Reference:
    """act_quant=True reproduces the kernels' Q8 activations (one scale per 32 values
    before every quantized weight type: Q8_K32 before k-quants, whose 32-blocks are
    quantized like the Q8_0 family's before Q4_0/Q5_0/Q8_0), so
    quantized models can be compared tightly too; with act_residual (the engine's
    AOTX_ACT_RESIDUAL=1; off by default, as in the engine) ffn_down multiplies quantize_act(x) and
    quantize_act(r) of the residual r = x - quantize_act(x), as csrc/engine/model/model_fwd.c
    does."""

    def __init__(self, path: Path | str, act_quant: bool = False,
                 act_residual: bool = False) -> None:
        self.act_quant = act_quant
        self.act_residual = act_residual
        self.types: dict[str, str] = {}
        r = gguf.GGUFReader(str(path))
        self.meta: dict[str, Any] = {}
        for k, f in r.fields.items():
            if k.startswith("tokenizer.ggml.") and k.endswith(("tokens", "scores", "token_type")):
                continue
            self.meta[k] = f.contents()
        self.w: dict[str, np.ndarray] = {}
        for t in r.tensors:
            deq = quants.dequantize(t.data, t.tensor_type)
            self.w[t.name] = np.asarray(deq, dtype=F).reshape([int(x) for x in t.shape[::-1]])
            self.types[t.name] = t.tensor_type.name
        self.arch = str(self.meta["general.architecture"])
        a = self.arch

        def hp(name: str, default: Any = None) -> Any:
            return self.meta.get(f"{a}.{name}", default)

        self.gemma = a in ("gemma2", "gemma3")   # x sqrt(d) embeddings, post-norms, gelu
        self.d = int(hp("embedding_length"))
        self.n_layers = int(hp("block_count"))
        self.n_heads = int(hp("attention.head_count"))
        self.n_kv = int(hp("attention.head_count_kv", self.n_heads))
        self.hd = int(hp("attention.key_length", self.d // self.n_heads))
        self.vd = int(hp("attention.value_length", self.hd))
        self.n_rot = int(hp("rope.dimension_count", self.hd))
        self.eps = float(hp("attention.layer_norm_rms_epsilon", 1e-6))
        self.base = float(hp("rope.freq_base", 1e6 if a == "gemma3" else 1e4))
        self.window = (int(hp("attention.sliding_window", 0))
                       if a in ("gemma2", "gemma3", "phi3") else 0)
        # Gemma 2 27B (46 blocks) scales queries by 1/sqrt(d_model / n_heads)
        q_pre = self.d / self.n_heads if a == "gemma2" and self.n_layers == 46 else self.hd
        self.scale = float(hp("attention.scale", 1.0 / np.sqrt(q_pre)))
        # Gemma 2's soft-caps: 50 and 30 unless the file says otherwise
        self.attn_softcap = float(hp("attn_logit_softcapping", 50.0)) if a == "gemma2" else 0.0
        self.final_softcap = float(hp("final_logit_softcapping", 30.0)) if a == "gemma2" else 0.0
        # LongRoPE (phi3): per-frequency divisors, the long set when the context the engine
        # serves (min(context_length, 4096) unless given)
        # exceeds the original one (default context_length); cos and sin x attn_factor
        # (default sqrt(1 + ln(s) / ln(original)), s = context_length / original, if s > 1)
        train = int(hp("context_length", 2048))
        self.ctx = min(train, 4096)
        self.orig_ctx = int(hp("rope.scaling.original_context_length", train))
        s = train / self.orig_ctx
        dflt = np.sqrt(1 + np.log(s) / np.log(self.orig_ctx)) if s > 1 else 1.0
        self.attn_factor = float(hp("rope.scaling.attn_factor", dflt))

    def sliding(self, li: int) -> bool:
        """Whether layer li attends to the last `window` positions only."""
        if self.window <= 0:
            return False
        if self.arch == "gemma3":
            return (li + 1) % 6 != 0
        if self.arch == "gemma2":
            return li % 2 == 0
        return self.arch == "phi3"

    def rope_factors(self) -> np.ndarray | None:
        name = ("rope_factors_long.weight" if self.orig_ctx and self.ctx > self.orig_ctx
                else "rope_factors_short.weight")
        f = self.w.get(name)
        return None if f is None else np.asarray(f, dtype=F).reshape(-1)

    def mm(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W.T for the matrix `name`, activations quantized like the kernels."""
        if self.act_quant:
            t = self.types[name]
            block = 32 if t in K_QUANTS or t in LEGACY_QUANTS else 0
            if block and self.act_residual and name.endswith("ffn_down.weight"):
                r = act_residual(x, block)
                return np.asarray(quantize_act(x, block) @ self.w[name].T
                                  + quantize_act(r, block) @ self.w[name].T)
            if block:
                x = quantize_act(x, block)
        return np.asarray(x @ self.w[name].T)

    def rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return np.asarray(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w)

    def rope(self, x: np.ndarray, pos: np.ndarray, base: float) -> np.ndarray:
        """x: [T, heads, hd]; the first n_rot dims rotate (NeoX halves of them, or
        adjacent pairs for llama), the rest pass through."""
        n, half = self.n_rot, self.n_rot // 2
        inv = base ** (-np.arange(half, dtype=F) * 2.0 / n)
        factors = self.rope_factors()
        if factors is not None:
            inv = inv / factors
        ang = pos[:, None].astype(F) * inv[None, :]
        m = self.attn_factor if factors is not None else 1.0
        c, s = (np.cos(ang) * m)[:, None, :], (np.sin(ang) * m)[:, None, :]
        out = x.copy()
        r = x[..., :n]
        if self.arch == "llama":
            a, b = r[..., 0::2], r[..., 1::2]
            out[..., 0:n:2] = a * c - b * s
            out[..., 1:n:2] = a * s + b * c
            return out
        a, b = r[..., :half], r[..., half:]
        out[..., :n] = np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        return out

    def qkv(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """q, k, v of a layer, from attn_q/k/v or the fused attn_qkv (phi3), with biases."""
        w = self.w
        if p + "attn_qkv.weight" in w:
            y = self.mm(h, p + "attn_qkv.weight")
            nq, nk = self.n_heads * self.hd, self.n_kv * self.hd
            return y[:, :nq], y[:, nq:nq + nk], y[:, nq + nk:]
        return tuple(self.mm(h, p + f"attn_{n}.weight") + w.get(p + f"attn_{n}.bias", 0.0)
                     for n in "qkv")  # type: ignore[return-value]

    def gate_up(self, h: np.ndarray, p: str) -> tuple[np.ndarray, np.ndarray]:
        """gate and up, from ffn_gate/ffn_up or the fused ffn_up of twice the rows (phi3)."""
        if p + "ffn_gate.weight" in self.w:
            return self.mm(h, p + "ffn_gate.weight"), self.mm(h, p + "ffn_up.weight")
        y = self.mm(h, p + "ffn_up.weight")
        ff = y.shape[1] // 2
        return y[:, :ff], y[:, ff:]

    def forward(self, tokens: list[int], last: int = 0) -> np.ndarray:
        """Logits [T, n_vocab] for the sequence starting at position 0 (with last > 0:
        only the last `last` positions' rows, [last, n_vocab])."""
        w, T = self.w, len(tokens)
        gem = self.gemma
        x = w["token_embd.weight"][tokens].copy()
        if gem:
            x *= np.sqrt(self.d)
        pos = np.arange(T)
        for li in range(self.n_layers):
            p = f"blk.{li}."
            h = self.rms(x, w[p + "attn_norm.weight"])
            q, k, v = self.qkv(h, p)
            q = q.reshape(T, self.n_heads, self.hd)
            k = k.reshape(T, self.n_kv, self.hd)
            v = v.reshape(T, self.n_kv, self.vd)
            base = self.base
            if p + "attn_q_norm.weight" in w:
                q = self.rms(q, w[p + "attn_q_norm.weight"])
                k = self.rms(k, w[p + "attn_k_norm.weight"])
            if self.arch == "gemma3" and (li + 1) % 6 != 0:
                base = 10000.0
            q, k = self.rope(q, pos, base), self.rope(k, pos, base)
            mask = pos[None, :] <= pos[:, None]
            if self.sliding(li):
                mask &= pos[:, None] - pos[None, :] < self.window
            group = self.n_heads // self.n_kv
            out = np.zeros((T, self.n_heads, self.vd))
            for hh in range(self.n_heads):
                kh = k[:, hh // group, :]
                sc = (q[:, hh, :] @ kh.T) * self.scale
                if self.attn_softcap > 0:
                    sc = self.attn_softcap * np.tanh(sc / self.attn_softcap)
                sc = np.where(mask, sc, -np.inf)
                sc = np.exp(sc - sc.max(axis=1, keepdims=True))
                sc /= sc.sum(axis=1, keepdims=True)
                out[:, hh, :] = sc @ v[:, hh // group, :]
            o = self.mm(out.reshape(T, -1), p + "attn_output.weight")
            if gem:
                o = self.rms(o, w[p + "post_attention_norm.weight"])
            x = x + o
            h = self.rms(x, w[p + "ffn_norm.weight"])
            g, u = self.gate_up(h, p)
            if gem:
                act = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
            else:
                act = g / (1 + np.exp(-g))
            f = self.mm(act * u, p + "ffn_down.weight")
            if gem:
                f = self.rms(f, w[p + "post_ffw_norm.weight"])
            x = x + f
        x = self.rms(x[-last:] if last > 0 else x, w["output_norm.weight"])
        logits = self.mm(x, "output.weight" if "output.weight" in w else "token_embd.weight")
        if self.final_softcap > 0:
            logits = self.final_softcap * np.tanh(logits / self.final_softcap)
        return logits
