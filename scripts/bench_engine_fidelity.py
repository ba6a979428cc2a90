#!/usr/bin/env python3
"""How faithful the engine's logits are: aotx and llama.cpp against the exact model.

    .venv/bin/python scripts/bench_engine.py --fidelity [--model GGUF] [--configs ...]
    .venv/bin/python scripts/bench_engine_fidelity.py [--model GGUF] [--prompts 10]

The exact model is tests/reference_decoder.py: every tensor dequantized by gguf-py and the
forward pass in float64 (no activation quantization).  For each of ~10 short prompts it
generates a greedy continuation of N_CONT tokens, then every engine is teacher-forced on
prompt + continuation (the prompt in one prefill, then one forced token per step, the
way decode runs) and gives a logits row at each of the N_CONT positions.  Per engine:
top-1 agreement with the exact model (the engine's argmax equals the exact argmax) and
the mean KL(exact || engine) in nats over the whole vocabulary, with its standard error
over the prompts (the positions of one prompt are correlated, so the prompt is the unit).

Engines (each in its own child process, so AOTX_KERNELS is read fresh):
``aotx:<kernels>:<kv>[:res|:res6|:nores]`` with kernels auto | avx2 | ref, kv f32 | f16;
``res`` for AOTX_ACT_RESIDUAL=1 (ffn_down also on its Q8 residual,
csrc/engine/model/model_fwd.c), ``res6``
for AOTX_ACT_RESIDUAL=6 (only on ffn_down weights of 6 bits or more), none (or ``nores``)
for the default, AOTX_ACT_RESIDUAL=0; and
``llama.cpp``
(llama-cpp-python, its default KV type f16, 1 thread), skipped when not importable.
Children write their float32 rows to a temporary .npy file; the parent scores them.
Not a test: a measurement, printed as a table.

What the engines quantize: aotx multiplies every quantized weight type with int8
activations that have one float scale per 32 values (before k-quants the Q8_K32 format of
csrc/engine/aotx_kernels.h: Q8_K's quants and 16-sums with 8 scales per 256 values; before
Q4_0/Q5_0/Q8_0 its Q8_0 pairs); llama.cpp's CPU kernels use Q8_K (one scale per 256
values) before k-quants and Q8_0 before the others.  The ratio lines give the KL
difference to llama.cpp in combined standard errors (sqrt(se_a^2 + se_b^2), unpaired).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# the reference makes ~130 small BLAS calls per forward: OpenBLAS threads spinning on a
# loaded machine cost ~0.1 s each (measured: 12 s instead of 0.7 s per forward)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

DEFAULT = Path.home() / ".cache" / "aotx-trio" / "gemma-3-270m-q4_k_m.gguf"
CACHE = Path.home() / ".cache" / "aotx-trio" / "bench"
PROMPTS = [
    "The capital of France is",
    "Q: What is the boiling point of water?\nA:",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "In 1969, the first humans",
    "Photosynthesis is the process by which",
    "To make a cup of tea, first",
    "The quick brown fox",
    "Machine learning models are trained by",
    "Dear Sir or Madam, I am writing to",
    "The largest planet in the solar system is",
]
N_CONT = 12
DEFAULT_CONFIGS = ("aotx:auto:f32", "aotx:auto:f16", "aotx:avx2:f32", "aotx:avx2:f16",
                   "llama.cpp")


# ---- the exact model (parent) ------------------------------------------------------------

def exact(model: Path, prompts: list[list[int]]) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy continuations of the float64 reference and its log-probabilities at the
    N_CONT positions of each (rows: after the prompt, after each forced token but the
    last).  Kept in CACHE (keyed by the model's and the prompts' sha256; the logits as
    float32, ~1e-6 of a logit) since dequantizing the model alone takes minutes."""
    h = hashlib.sha256()
    with model.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    h.update(json.dumps([prompts, N_CONT]).encode())
    cached = CACHE / f"fidelity-{h.hexdigest()[:24]}.npz"
    if cached.exists():
        z = np.load(cached)
        conts = [list(map(int, c)) for c in z["conts"]]
        return conts, [log_softmax(r) for r in z["logits"]]
    from reference_decoder import Reference

    ref = Reference(model)
    conts, logits = [], []
    for ids in prompts:
        seq = list(ids)
        for _ in range(N_CONT - 1):
            seq.append(int(np.argmax(ref.forward(seq, last=1)[-1])))
        rows = ref.forward(seq, last=N_CONT)      # positions len(ids)-1 .. len(seq)-1
        seq.append(int(np.argmax(rows[-1])))
        conts.append(seq[len(ids):])
        logits.append(rows)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.savez(cached, conts=np.array(conts), logits=np.array(logits, dtype=np.float32))
    return conts, [log_softmax(r) for r in logits]


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return np.asarray(x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True)))


def score(exact_lp: list[np.ndarray], rows: np.ndarray) -> dict[str, float]:
    """Top-1 agreement and mean KL(exact || engine) over all positions of all prompts."""
    ex = np.concatenate(exact_lp)
    lp = log_softmax(rows)
    kl = (np.exp(ex) * (ex - lp)).sum(axis=-1)
    agree = (ex.argmax(axis=-1) == lp.argmax(axis=-1)).mean()
    # standard error of the mean over prompts (positions of one prompt are correlated)
    per = kl.reshape(len(exact_lp), -1).mean(axis=1)
    se = float(per.std(ddof=1) / np.sqrt(len(per))) if len(per) > 1 else float("nan")
    return {"top1": float(agree), "kl": float(kl.mean()), "kl_se": se,
            "kl_max": float(kl.max()), "n": int(ex.shape[0])}


# ---- the engines (children) --------------------------------------------------------------

def child_aotx(model: Path, kv: str, work: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    from aotx_trio.native.engine import Engine
    from aotx_trio.native.lib import ffi, lib

    rows = []
    with Engine.load(model, threads=1, max_seqs=1, kv_f16=kv == "f16") as eng:
        for item in work:
            s = eng.add_sequence()
            rows.append(eng.prefill(s, item["prompt"]).logits(0))
            for tok in item["cont"][:-1]:
                rows.append(eng.step([(s, [tok])]).logits(0))
            eng.release(s)
        elem = eng.kv_stats().elem_bytes
    np.save(out, np.stack(rows))
    return {"kernels": ffi.string(lib.aotx_kernel_impl(12)).decode(),
            "kv_impl": ffi.string(lib.aotx_kv_f16_impl()).decode() if elem == 2 else "f32",
            "elem_bytes": elem}


def child_peer(model: Path, work: list[dict[str, Any]], out: Path) -> dict[str, Any]:
    import ctypes

    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    m = L.llama_model_load_from_file(str(model).encode(), L.llama_model_default_params())
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = 512, 512, 512, 1
    cp.n_threads = cp.n_threads_batch = 1
    ctx = L.llama_init_from_model(m, cp)
    if not m or not ctx:
        raise RuntimeError("llama.cpp cannot load the model")
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(512, 0, 1)

    def decode(toks: list[int], at: int) -> np.ndarray:
        batch.n_tokens = len(toks)
        for i, tk in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tk, at + i, 1
            batch.seq_id[i][0], batch.logits[i] = 0, int(i == len(toks) - 1)
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        ptr = L.llama_get_logits_ith(ctx, len(toks) - 1)
        return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).astype(np.float32)

    rows = []
    for item in work:
        L.llama_memory_clear(mem, True)
        p = item["prompt"]
        rows.append(decode(p, 0))
        for k, tok in enumerate(item["cont"][:-1]):
            rows.append(decode([tok], len(p) + k))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(m)
    np.save(out, np.stack(rows))
    return {"version": L.__version__, "kv": "f16 (default)",
            "system": L.llama_print_system_info().decode(errors="replace").strip()}


def run_config(cfg: str, model: Path, work_file: Path, out: Path) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--model", str(model), "--child", cfg,
            "--work", str(work_file), "--out", str(out)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    if cfg.startswith("aotx:"):
        env["AOTX_KERNELS"] = cfg.split(":")[1]
        env["AOTX_ACT_RESIDUAL"] = ("1" if cfg.endswith(":res") else
                                    "6" if cfg.endswith(":res6") else "0")
    p = subprocess.run(argv, capture_output=True, text=True, check=False, env=env, timeout=1800)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}"}
    doc: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return doc


def peer_importable() -> bool:
    p = subprocess.run([sys.executable, "-c", "import llama_cpp"], capture_output=True,
                       check=False)
    return p.returncode == 0


def fidelity(model: Path, n_prompts: int, configs: list[str]) -> int:
    from aotx_trio.native.engine import Engine

    t0 = time.perf_counter()
    with Engine.load(model, threads=1, max_seqs=1) as eng:
        prompts = [eng.tokenize(t) for t in PROMPTS[:n_prompts]]
    conts, logps = exact(model, prompts)
    print(f"exact model (tests/reference_decoder.py, float64): {len(prompts)} prompts of "
          f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens, greedy continuations of "
          f"{N_CONT} tokens, {time.perf_counter() - t0:.0f} s")
    print("activations: aotx one int8 scale per 32 values before every quantized product "
          "(Q8_K32 before k-quants); llama.cpp Q8_K (per 256) before k-quants, Q8_0 (per 32) "
          "before Q4_0/Q5_0/Q8_0")
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="aotx-fidelity-") as tmp:
        work_file = Path(tmp) / "work.json"
        work_file.write_text(json.dumps([{"prompt": p, "cont": c}
                                         for p, c in zip(prompts, conts, strict=True)]))
        for cfg in configs:
            if cfg == "llama.cpp" and not peer_importable():
                results[cfg] = {"error": "llama_cpp not importable (see docs/benchmarks.md, "
                                "'The peer')"}
                continue
            out = Path(tmp) / "rows.npy"
            doc = run_config(cfg, model, work_file, out)
            if "error" not in doc:
                doc.update(score(logps, np.load(out)))
                out.unlink()
            results[cfg] = doc
            print(f"  {cfg}: done", flush=True)
    print("| engine | kernels | KV | top-1 agreement | mean KL(exact \\|\\| engine), nats "
          "| s.e. over prompts | max KL |")
    print("|---|---|---|---:|---:|---:|---:|")
    for cfg, r in results.items():
        if "error" in r:
            print(f"| {cfg} | | | failed: {r['error']} | | | |")
            continue
        if cfg == "llama.cpp":
            kern, kv = f"llama.cpp {r['version']}", r["kv"]
        else:
            kern = f"AOTX_KERNELS={cfg.split(':')[1]} (Q4_K {r['kernels']})"
            if cfg.endswith((":res", ":res6")):
                kern += f", AOTX_ACT_RESIDUAL={'1' if cfg.endswith(':res') else '6'}"
            kv = "f32" if r["elem_bytes"] == 4 else f"f16 ({r['kv_impl']})"
        print(f"| {cfg} | {kern} | {kv} | {100 * r['top1']:.1f}% of {r['n']} | "
              f"{r['kl']:.5f} | {r['kl_se']:.5f} | {r['kl_max']:.4f} |")
    peer = results.get("llama.cpp", {})
    if "kl" in peer:
        for cfg, r in results.items():
            if cfg != "llama.cpp" and "kl" in r:
                se = (r["kl_se"] ** 2 + peer["kl_se"] ** 2) ** 0.5
                print(f"{cfg}: KL / llama.cpp's = {r['kl'] / peer['kl']:.3f} "
                      f"({'<=' if r['kl'] <= peer['kl'] else '>'} llama.cpp; difference "
                      f"{(peer['kl'] - r['kl']) / se if se > 0 else 0.0:+.1f} s.e.)")
        print(f"llama.cpp system info: {peer['system']}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                    help="comma-separated: aotx:<auto|avx2|ref>:<f32|f16>[:nores|:res6], "
                    "llama.cpp")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        work = json.loads(a.work.read_text())
        if a.child == "llama.cpp":
            doc = child_peer(a.model, work, a.out)
        else:
            doc = child_aotx(a.model, a.child.split(":")[2], work, a.out)
        print(json.dumps(doc))
        return 0
    return fidelity(a.model, a.prompts, a.configs.split(","))


if __name__ == "__main__":
    raise SystemExit(main())
