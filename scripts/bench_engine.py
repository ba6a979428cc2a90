#!/usr/bin/env python3
"""Benchmark the native engine against llama.cpp (llama-cpp-python) on the same GGUF.

    AOTX_NATIVE_DIR=build/dev-x .venv/bin/python scripts/bench_engine.py \
        [--model GGUF] [--threads 2] [--rounds 3] [--no-embed] [--kernels avx2] [--invariant]
        [--kv-f32]
    .venv/bin/python scripts/bench_engine.py --fidelity [--model GGUF]

``--fidelity`` runs scripts/bench_engine_fidelity.py instead: top-1 agreement and mean
KL(exact || engine) against the float64 reference decoder, for aotx on each kernel path
with float32 and float16 KV, and llama.cpp, side by side.

``--kernels ref|avx2|auto`` sets AOTX_KERNELS for our side (the AVX2 path on an AVX-512
machine); ``--invariant`` sets AOTX_INVARIANT=1 (AVX-512's batch-invariant mode; the
AVX2 and reference paths always are).  The header prints the CPU flags and the kernel
path each type ran.

Our K/V pages are IEEE binary16 by default (the runtime's default for the text models
``aotx pack`` adds, and llama.cpp's default KV type, so like for like); ``--kv-f32``
measures float32 pages instead (``--kv-f16``, the old opt-in, is accepted and does
nothing).  The header prints the KV type of each side.

Each round runs one child process per side (aotx, then llama.cpp; the order
alternates between rounds so that load from other processes hits both alike),
so that each side's peak RSS is its own.  Every child loads the model and
measures, on the same token ids (our tokenizer's, checked against llama.cpp's):

- prefill tok/s: a ~430-token prompt in one sequence (best of 2 in the child);
- decode tok/s: 128 greedy tokens following that prompt;
- aggregate decode tok/s with 1, 4 and 8 concurrent sequences (prompts of
  16+i tokens, then 3 blocks of 32 batched steps, best block);
- peak RSS (ru_maxrss of the child) and KV held versus allocated;
- batch invariance on the real model: 8 prompts (16+i tokens) x 4 greedy steps, each
  alone (the run's threads and 1 thread), all 8 in one batch, and in 2 batches of 4 in
  reverse order: every logits row bit-identical or not;
- KV waste of the page accounting for 1, 8 and 64 sequences of mixed lengths (page
  sizes 4, 8, 16 and the run's), on a pool with the model's layer geometry.

The peer uses llama.cpp's low-level llama_batch API (n_seq_max 8, one unified
4096-cell cache, n_batch = n_ubatch = 512, n_threads = n_threads_batch), greedy
argmax on its logits, mmap on both sides.  The table gives the median and the
best of the rounds for each side and their ratio, with the issue's targets.
Embeddings/s come from scripts/bench_embed.py (a child process; its peer is
sentence-transformers, not llama.cpp).  Not a test: numbers depend on the
machine and its load, which is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = Path.home() / ".cache" / "aotx-trio" / "gemma-3-270m-q4_k_m.gguf"
TEXT = ("The history of the city begins with a small settlement on the river, where traders "
        "from the north met farmers from the valleys to exchange grain, wool and salt. Over "
        "the centuries the market grew into a town with walls, churches and a university, "
        "and the town became the seat of a duke who built a palace on the hill. ")
PROMPT = TEXT * 12
N_PROMPT, N_DECODE, N_STEPS, N_BLOCKS = 430, 128, 32, 3
SEQ_COUNTS = (1, 4, 8)
PEER_CTX, PEER_SEQS, BATCH = 4096, 8, 512


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def multi_prompts(ids: Sequence[int], n: int) -> list[list[int]]:
    """Sequence i gets a distinct prompt of 16+i tokens (lengths not page-aligned): BOS,
    then 15+i tokens of the text from offset 1+3i."""
    return [[ids[0], *ids[1 + 3 * i:16 + 4 * i]] for i in range(n)]


# ---- one side, in a child process ----------------------------------------------------------

def child_ours(path: Path, threads: int, page_tokens: int, kv_f16: bool) -> dict[str, Any]:
    """Our side's measures; ``kv_f16``: binary16 K/V pages (Engine.load's kv_f16)."""
    sys.path.insert(0, str(ROOT))
    from aotx_trio.native.engine import Engine

    r: dict[str, Any] = {}
    with Engine.load(path, threads=threads, max_seqs=PEER_SEQS, max_batch_tokens=BATCH,
                     page_tokens=page_tokens, kv_f16=kv_f16) as eng:
        ids = eng.tokenize(PROMPT)[:N_PROMPT]
        r["ids"] = ids
        w = eng.add_sequence()
        eng.sample(w, eng.prefill(w, ids[:32]), 0)   # warm-up
        eng.release(w)
        best = 1e9
        for rep in range(2):   # the second prompt stays for the decode below
            s = eng.add_sequence()
            t = time.perf_counter()
            res = eng.prefill(s, ids)
            tok = eng.sample(s, res, 0)
            best = min(best, time.perf_counter() - t)
            if rep == 0:
                eng.release(s)
        r["prefill"] = len(ids) / best
        out = [tok]
        t = time.perf_counter()
        for _ in range(N_DECODE):
            tok = eng.sample(s, eng.step([(s, [tok])]), 0)
            out.append(tok)
        r["decode"] = N_DECODE / (time.perf_counter() - t)
        r["greedy"] = out
        st = eng.kv_stats()
        r["kv1"] = kv_doc(st)
        r["kv_type"] = "f16" if st.elem_bytes == 2 else "f32"
        eng.release(s)
        for n in SEQ_COUNTS:
            seqs = [eng.add_sequence() for _ in range(n)]
            toks = [eng.sample(q, eng.prefill(q, p), 0)
                    for q, p in zip(seqs, multi_prompts(ids, n), strict=True)]
            best = 1e9
            for _ in range(N_BLOCKS):
                t = time.perf_counter()
                for _ in range(N_STEPS):
                    res = eng.step([(q, [tk]) for q, tk in zip(seqs, toks, strict=True)])
                    toks = [eng.sample(q, res, i) for i, q in enumerate(seqs)]
                best = min(best, time.perf_counter() - t)
            r[f"agg{n}"] = n * N_STEPS / best
            if n == max(SEQ_COUNTS):
                r["kv8"] = kv_doc(eng.kv_stats())
                r["last8"] = toks
            for q in seqs:
                eng.release(q)
        pool = eng.kv_stats()
        r["kv_pool_mb"] = pool.n_pages * pool.page_bytes / 2**20
        r["rss_mb"] = rss_mb()   # before the invariance check maps the model a second time
        r["invariance"] = invariance(eng, path, threads, page_tokens, kv_f16, ids)
        r["kv_waste"] = {str(pt): kv_waste_mixed(eng.info, pt)
                         for pt in sorted({4, 8, 16, page_tokens})}
    r["kernels"] = kernel_names()
    return r


def kernel_names() -> dict[str, str]:
    from aotx_trio.native.lib import ffi, lib

    names = {t: ffi.string(lib.aotx_kernel_impl(n)).decode()
             for t, n in (("Q8_0", 8), ("Q5_0", 6), ("Q4_K", 12), ("Q6_K", 14))}
    names["F32"] = ffi.string(lib.aotx_sgemm_impl()).decode()
    if hasattr(lib, "aotx_kernel_is_invariant"):   # builds before issue 13 lack it
        names["invariant"] = "yes" if lib.aotx_kernel_is_invariant() else "no"
    return names


INV_STEPS = 4


def inv_generate(eng: Any, prompts: list[list[int]], group: list[int]) -> dict[int, list[bytes]]:
    """Prompts `group` in one batch (one prefill step, INV_STEPS greedy batched steps):
    {prompt index: [logits row bytes of each step]}."""
    import numpy as np

    seqs = [eng.add_sequence() for _ in group]
    out: dict[int, list[bytes]] = {i: [] for i in group}
    res = eng.step([(q, prompts[i]) for q, i in zip(seqs, group, strict=True)])
    for _ in range(INV_STEPS):
        toks = []
        for row, i in enumerate(group):
            lg = res.logits(row)
            out[i].append(lg.tobytes())
            toks.append(int(np.argmax(lg)))
        res = eng.step([(q, [t]) for q, t in zip(seqs, toks, strict=True)])
    for q in seqs:
        eng.release(q)
    return out


def invariance(eng: Any, path: Path, threads: int, page_tokens: int, kv_f16: bool,
               ids: list[int]) -> dict[str, Any]:
    """Batch invariance on the real model: each config's logits rows against the rows
    of each prompt generated alone with `threads` threads."""
    from aotx_trio.native.engine import Engine

    prompts = multi_prompts(ids, PEER_SEQS)
    n = len(prompts)
    alone: dict[int, list[bytes]] = {}
    t = time.perf_counter()
    for i in range(n):
        alone.update(inv_generate(eng, prompts, [i]))
    t_alone = time.perf_counter() - t
    t = time.perf_counter()
    configs = {"batch of 8": inv_generate(eng, prompts, list(range(n)))}
    t_batch = time.perf_counter() - t
    rev = list(range(n))[::-1]
    fours = inv_generate(eng, prompts, rev[:4])
    fours.update(inv_generate(eng, prompts, rev[4:]))
    configs["batches of 4, reversed"] = fours
    with Engine.load(path, threads=1, max_seqs=PEER_SEQS, max_batch_tokens=BATCH,
                     page_tokens=page_tokens, kv_f16=kv_f16) as one:
        solo: dict[int, list[bytes]] = {}
        for i in range(n):
            solo.update(inv_generate(one, prompts, [i]))
    configs["alone, 1 thread"] = solo
    differ = {k: sum(a != b for i in range(n) for a, b in zip(v[i], alone[i], strict=True))
              for k, v in configs.items()}
    return {"rows": n * INV_STEPS, "differ": differ,
            "alone_s": t_alone, "batch8_s": t_batch}


def kv_waste_mixed(info: Any, page_tokens: int) -> dict[str, float]:
    """Waste (1 - positions / page slots held) of the page accounting alone for 1, 8 and
    64 sequences of mixed lengths, on a pool with the model's layer geometry (gemma3:
    layer i global when (i + 1) % 6 == 0)."""
    import random

    from aotx_trio.native.lib import check, ffi, lib

    sets = {"1": [N_PROMPT + N_DECODE],
            "8": [len(p) + N_BLOCKS * N_STEPS for p in multi_prompts(list(range(64)), 8)]}
    rnd = random.Random(13)
    sets["64"] = [rnd.randint(20, 2000) for _ in range(64)]
    sliding = ffi.new("uint8_t[]", [int(info.window > 0 and (i + 1) % 6 != 0)
                                    for i in range(info.n_layers)])
    out: dict[str, float] = {}
    for name, lengths in sets.items():
        p = ffi.new("aotx_kv_params *")
        p.page_tokens, p.max_seqs = page_tokens, len(lengths)
        p.max_tokens = max(max(lengths), 1)
        p.n_pages = info.n_layers * sum(-(-n // page_tokens) for n in lengths) + 16
        p.n_layers, p.n_kv_heads = info.n_layers, info.n_kv_heads
        p.k_dim = p.v_dim = info.head_dim
        p.window, p.sliding = info.window, sliding
        kv = ffi.new("aotx_kv_pool **")
        check(lib.aotx_kv_new(p, kv))
        try:
            for n in lengths:
                sid = ffi.new("uint32_t *")
                check(lib.aotx_kv_seq_new(kv[0], sid))
                check(lib.aotx_kv_seq_grow(kv[0], sid[0], n), ok_positive=False)
                check(lib.aotx_kv_seq_trim(kv[0], sid[0]))
            st = ffi.new("aotx_kv_stats *")
            lib.aotx_kv_stats_get(kv[0], st)
            out[name] = 0.0 if st.slots_held == 0 else 1.0 - st.slots_live / st.slots_held
        finally:
            lib.aotx_kv_free(kv[0])
    return out


def kv_doc(st: Any) -> dict[str, Any]:
    return {"pages": st.used_pages, "page_tokens": st.page_tokens, "groups": st.n_groups,
            "tokens": st.tokens_held, "slots_held": st.slots_held, "slots_live": st.slots_live,
            "waste": st.waste}


def child_peer(path: Path, threads: int, ids: list[int]) -> dict[str, Any]:
    import ctypes

    import llama_cpp as L
    import numpy as np

    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    mp = L.llama_model_default_params()   # mmap on, like ours; no mlock
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise RuntimeError("llama_model_load_from_file failed")
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = PEER_CTX, BATCH, BATCH, PEER_SEQS
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("llama_init_from_model failed")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(BATCH, 0, PEER_SEQS)

    buf = (L.llama_token * 4096)()
    n = L.llama_tokenize(vocab, PROMPT.encode(), len(PROMPT.encode()), buf, 4096, True, False)
    peer_ids = list(buf[:min(n, N_PROMPT)])

    def decode(entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """entries: (seq, pos, token, want logits)."""
        batch.n_tokens = len(entries)
        for i, (sq, pos, tk, want) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tk, pos, 1
            batch.seq_id[i][0], batch.logits[i] = sq, int(want)
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def greedy(i: int) -> int:
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
        return int(row.argmax())

    def prefill(sq: int, toks: Sequence[int]) -> int:
        for at in range(0, len(toks), BATCH):
            part = toks[at:at + BATCH]
            last = at + BATCH >= len(toks)
            decode([(sq, at + j, tk, last and j == len(part) - 1) for j, tk in enumerate(part)])
        return greedy(len(toks) - 1 - (len(toks) - 1) // BATCH * BATCH)

    # ggml_type 0 is F32, 1 F16 (llama.cpp's default for both K and V)
    types = {0: "f32", 1: "f16"}
    r: dict[str, Any] = {"peer_ids": peer_ids, "n_ctx": PEER_CTX, "version": L.__version__,
                         "kv_type": "/".join(types.get(int(t), f"ggml type {t}")
                                             for t in dict.fromkeys((cp.type_k, cp.type_v))),
                         "system": L.llama_print_system_info().decode(errors="replace").strip()}
    prefill(0, ids[:32])   # warm-up
    L.llama_memory_clear(mem, True)
    best = 1e9
    for _ in range(2):
        L.llama_memory_clear(mem, True)
        t = time.perf_counter()
        tok = prefill(0, ids)
        best = min(best, time.perf_counter() - t)
    r["prefill"] = len(ids) / best
    out = [tok]
    t = time.perf_counter()
    for k in range(N_DECODE):
        decode([(0, len(ids) + k, tok, True)])
        tok = greedy(0)
        out.append(tok)
    r["decode"] = N_DECODE / (time.perf_counter() - t)
    r["greedy"] = out
    r["kv1"] = {"tokens": len(ids) + N_DECODE, "cells": PEER_CTX}
    for nseq in SEQ_COUNTS:
        L.llama_memory_clear(mem, True)
        prompts = multi_prompts(ids, nseq)
        toks = [prefill(q, p) for q, p in enumerate(prompts)]
        pos = [len(p) for p in prompts]
        best = 1e9
        for _ in range(N_BLOCKS):
            t = time.perf_counter()
            for _ in range(N_STEPS):
                decode([(q, pos[q], toks[q], True) for q in range(nseq)])
                toks = [greedy(q) for q in range(nseq)]
                pos = [p + 1 for p in pos]
            best = min(best, time.perf_counter() - t)
        r[f"agg{nseq}"] = nseq * N_STEPS / best
        if nseq == max(SEQ_COUNTS):
            r["kv8"] = {"tokens": sum(pos), "cells": PEER_CTX}
            r["last8"] = toks
    L.llama_batch_free(batch)
    r["rss_mb"] = rss_mb()
    L.llama_free(ctx)
    L.llama_model_free(model)
    return r


# ---- the parent: rounds, then one table ----------------------------------------------------

def run_child(side: str, a: argparse.Namespace, ids: list[int] | None) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", side, "--model",
            str(a.model), "--threads", str(a.threads), "--page-tokens", str(a.page_tokens)]
    if ids is not None:
        argv += ["--ids", ",".join(map(str, ids))]
    if a.kv_f32:
        argv.append("--kv-f32")
    # numpy's OpenBLAS threads spin in every child (4 % of a decode profile) and take
    # CPU from both sides' compute threads: one BLAS thread, both sides alike
    env = {"OPENBLAS_NUM_THREADS": "1", **os.environ}
    p = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {p.returncode}: " + " / ".join(tail)}
    doc: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return doc


def loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "n/a"


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor()
    m = re.search(r"^Model name:\s*(.+)$", out, re.M)
    return m.group(1).strip() if m else platform.processor()


def cpu_flags() -> str:
    """The SIMD flags /proc/cpuinfo reports (what the kernel paths can use)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "flags":
                have = set(value.split())
                want = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                        "avx512_vnni", "avx_vnni")
                return " ".join(f for f in want if f in have) or "no avx2"
    except OSError:
        pass
    return "n/a"


def embed_rates(a: argparse.Namespace) -> dict[str, tuple[float, float | None]]:
    """{set: (aotx /s, sentence-transformers /s or None)} from scripts/bench_embed.py."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_embed.py"), "--threads",
                        str(a.threads), "--repeats", str(a.rounds)],
                       capture_output=True, text=True, check=False)
    rows: dict[str, tuple[float, float | None]] = {}
    for line in p.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"[0-9.]+", cells[1]):
            theirs = float(cells[2]) if re.fullmatch(r"[0-9.]+", cells[2]) else None
            rows[cells[0]] = (float(cells[1]), theirs)
    if not rows:
        rows["error"] = (0.0, None)
        print(f"bench_embed.py failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
    return rows


def summary(vals: list[float], higher: bool = True) -> tuple[float, float] | None:
    if not vals:
        return None
    return statistics.median(vals), (max(vals) if higher else min(vals))


def fmt(s: tuple[float, float] | None, unit: str = "") -> str:
    return "n/a" if s is None else f"{s[0]:.1f}{unit} ({s[1]:.1f})"


def fmtx(s: tuple[float, float] | None) -> str:
    return "n/a" if s is None else f"{s[0]:.2f}x ({s[1]:.2f}x)"


def ratio(o: tuple[float, float] | None, p: tuple[float, float] | None) -> str:
    if o is None or p is None or p[0] == 0 or p[1] == 0:
        return "n/a"
    return f"{o[0] / p[0]:.2f}x ({o[1] / p[1]:.2f}x)"


def verdict(ok: bool | None) -> str:
    return "" if ok is None else ("met" if ok else "**not met**")


def report(a: argparse.Namespace, ours: list[dict[str, Any]], peer: list[dict[str, Any]],
           emb: dict[str, tuple[float, float | None]]) -> None:
    good_o = [r for r in ours if "error" not in r]
    good_p = [r for r in peer if "error" not in r]

    def col(runs: list[dict[str, Any]], key: str,
            higher: bool = True) -> tuple[float, float] | None:
        return summary([float(r[key]) for r in runs if key in r], higher)

    rows: list[tuple[str, str, str, str, str, str]] = []

    def rate_row(label: str, key: str, target: str, want: float | None) -> None:
        o, p = col(good_o, key), col(good_p, key)
        ok = None if (o is None or p is None or want is None) else o[0] / p[0] >= want
        rows.append((label, fmt(o), fmt(p), ratio(o, p), target, verdict(ok)))

    # issue 13's targets for the AVX2 path; issue 3's otherwise
    pre, dec = (2.0, 1.5) if a.kernels == "avx2" else (1.0, 1.2)
    rate_row(f"prefill tok/s ({N_PROMPT}-token prompt)", "prefill", f">= {pre}x", pre)
    rate_row(f"decode tok/s ({N_DECODE} greedy tokens after the prompt)", "decode",
             f">= {dec}x", dec)
    for n in SEQ_COUNTS:
        rate_row(f"aggregate decode tok/s, {n} sequence{'s' if n > 1 else ''}", f"agg{n}",
                 "", None)
    # scaling: 8 sequences against one, each side against itself
    o8 = [r["agg8"] / r["agg1"] for r in good_o]
    p8 = [r["agg8"] / r["agg1"] for r in good_p]
    so, sp = summary(o8), summary(p8)
    rows.append(("aggregate 8 sequences / 1 sequence (each side)", fmtx(so), fmtx(sp),
                 ratio(so, sp), "aotx >= 4x", verdict(None if so is None else so[0] >= 4.0)))
    o, p = col(good_o, "rss_mb", False), col(good_p, "rss_mb", False)
    model_mb = a.model.stat().st_size / 2**20
    pool_mb = good_o[0]["kv_pool_mb"] if good_o else 0.0
    limit = model_mb + pool_mb + 150
    rows.append(("peak RSS MiB (child process)", fmt(o), fmt(p), ratio(o, p),
                 f"<= {limit:.0f} (file {model_mb:.0f} + pool {pool_mb:.0f} + 150)",
                 verdict(None if o is None else o[0] <= limit)))
    for key, label in (("kv1", f"KV waste, 1 sequence of {N_PROMPT + N_DECODE} positions"),
                       ("kv8", "KV waste, 8 sequences after the 8-sequence run")):
        ko = good_o[0].get(key) if good_o else None
        kp = good_p[0].get(key) if good_p else None
        to = (f"{100 * ko['waste']:.1f}% ({ko['pages']} pages x {ko['page_tokens']} for "
              f"{ko['tokens']} positions x {ko['groups']} groups)") if ko else "n/a"
        tp = (f"{100 * (1 - kp['tokens'] / kp['cells']):.1f}% ({kp['tokens']} of "
              f"{kp['cells']} preallocated cells)") if kp else "n/a"
        rows.append((label, to, tp, "n/a", "aotx < 4%",
                     verdict(None if not ko else ko["waste"] < 0.04)))
    for name, (e_o, e_p) in emb.items():
        rows.append((f"embeddings/s, {name} (peer: sentence-transformers)", f"{e_o:.1f}",
                     "n/a" if e_p is None else f"{e_p:.1f}",
                     "n/a" if not e_p else f"{e_o / e_p:.2f}x", ">= 160/s",
                     verdict(e_o >= 160)))
    print(f"\n{len(good_o)} aotx and {len(good_p)} llama.cpp rounds; cells: median (best)")
    print("| measure | aotx | llama.cpp | ratio aotx/llama.cpp | target | met? |")
    print("|---|---:|---:|---:|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for side, runs in (("aotx", ours), ("llama.cpp", peer)):
        for i, r in enumerate(runs):
            if "error" in r:
                print(f"\n{side} round {i + 1} failed: {r['error']}")
    if good_o:
        r0 = good_o[0]
        k = r0.get("kernels", {})
        print(f"\naotx kernel path: {', '.join(f'{t} {v}' for t, v in k.items())}"
              f" (AOTX_KERNELS={a.kernels}, AOTX_INVARIANT={'1' if a.invariant else 'unset'});"
              f" KV {r0.get('kv_type', 'n/a')}")
        inv = r0.get("invariance")
        if inv:
            ok = all(v == 0 for v in inv["differ"].values())
            parts = "; ".join(f"{k}: {v} of {inv['rows']} rows differ"
                              for k, v in inv["differ"].items())
            print(f"batch invariance (real model, 8 prompts x {INV_STEPS} greedy steps, against "
                  f"each alone with {a.threads} threads): "
                  f"{'bit-identical' if ok else '**not bit-identical**'} ({parts}); "
                  f"8 alone {inv['alone_s']:.2f} s, one batch of 8 {inv['batch8_s']:.2f} s")
        kw = r0.get("kv_waste")
        if kw:
            print("KV waste of the page accounting, mixed lengths (1 x 558; 8 x 112..119; "
                  "64 x 20..2000 positions):")
            for pt, w in kw.items():
                cells = ", ".join(f"{n} seq {100 * v:.1f}%" for n, v in w.items())
                print(f"  pages of {pt:>2} positions: {cells}")
    if good_p:
        print(f"\nllama-cpp-python {good_p[0]['version']} (KV {good_p[0].get('kv_type', 'n/a')}):"
              f" {good_p[0]['system']}")
    if good_o and good_p:
        g_o, g_p = good_o[0]["greedy"], good_p[0]["greedy"]
        same = next((i for i, (x, y) in enumerate(zip(g_o, g_p, strict=False)) if x != y),
                    min(len(g_o), len(g_p)))
        print(f"\ngreedy continuation: the first {same} of {len(g_o)} tokens agree "
              f"(first token after the prompt: aotx {g_o[0]}, llama.cpp {g_p[0]})")
        same8 = sum(x == y for x, y in zip(good_o[0]["last8"], good_p[0]["last8"], strict=True))
        print(f"8-sequence run: {same8} of 8 sequences end on the same greedy token after "
              f"{N_BLOCKS * N_STEPS} steps (near-ties on short prompts of repeated text:"
              " not a correctness check, see docs/benchmarks_engine.md)")
        if good_p[0]["peer_ids"] != good_o[0]["ids"]:
            print("note: llama.cpp's tokenizer differs on the prompt; both ran our token ids")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--page-tokens", type=int, default=8, help="aotx KV page size (positions)")
    ap.add_argument("--no-embed", action="store_true", help="skip scripts/bench_embed.py")
    ap.add_argument("--no-peer", action="store_true", help="aotx only")
    ap.add_argument("--kernels", default="auto", choices=("auto", "avx2", "ref"),
                    help="AOTX_KERNELS for our side (avx2: the AVX2 path on an AVX-512 CPU)")
    ap.add_argument("--invariant", action="store_true",
                    help="AOTX_INVARIANT=1 for our side (AVX-512's batch-invariant kernels)")
    kv_type = ap.add_mutually_exclusive_group()
    kv_type.add_argument("--kv-f32", action="store_true",
                         help="float32 K/V pages for our side (default: binary16, like llama.cpp)")
    kv_type.add_argument("--kv-f16", action="store_true",
                         help="binary16 K/V pages: the default, accepted for old command lines")
    ap.add_argument("--fidelity", action="store_true",
                    help="logits against the float64 reference (bench_engine_fidelity.py)")
    ap.add_argument("--child", choices=("ours", "peer"), help=argparse.SUPPRESS)
    ap.add_argument("--ids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.fidelity:
        sys.path.insert(0, str(ROOT / "scripts"))
        import bench_engine_fidelity

        return int(bench_engine_fidelity.fidelity(a.model, 10,
                                                  list(bench_engine_fidelity.DEFAULT_CONFIGS)))
    if a.kernels != "auto":
        os.environ["AOTX_KERNELS"] = a.kernels
    if a.invariant:
        os.environ["AOTX_INVARIANT"] = "1"
    if a.child == "ours":
        print(json.dumps(child_ours(a.model, a.threads, a.page_tokens, not a.kv_f32)))
        return 0
    if a.child == "peer":
        ids = [int(x) for x in a.ids.split(",")] if a.ids else []
        print(json.dumps(child_peer(a.model, a.threads, ids)))
        return 0
    print(f"model {a.model.name} ({a.model.stat().st_size / 2**20:.0f} MiB), {a.threads} threads,"
          f" {a.rounds} rounds, aotx KV pages of {a.page_tokens} positions,"
          f" KV aotx {'f32' if a.kv_f32 else 'f16'} / llama.cpp f16 (its default);"
          f" CPU {cpu_model()}, {os.cpu_count()} logical CPUs")
    print(f"cpu flags: {cpu_flags()}")
    print(f"AOTX_NATIVE_DIR={os.environ.get('AOTX_NATIVE_DIR', '(package)')}")
    print(f"loadavg before: {loadavg()}")
    ours: list[dict[str, Any]] = []
    peer: list[dict[str, Any]] = []
    ids: list[int] = []
    for rnd in range(a.rounds):
        # round 1 runs aotx first (the peer takes its token ids); then the order alternates
        for side in (("peer", "ours") if rnd % 2 else ("ours", "peer")):
            if side == "ours":
                ours.append(run_child("ours", a, None))
                ids = ids or ours[-1].get("ids", [])
            elif not a.no_peer and ids:
                peer.append(run_child("peer", a, ids))
        print(f"round {rnd + 1} done, loadavg {loadavg()}", flush=True)
    emb = {} if a.no_embed else embed_rates(a)
    report(a, ours, peer, emb)
    print(f"\nloadavg after: {loadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

