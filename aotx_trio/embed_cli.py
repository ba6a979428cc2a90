"""``aotx embed --model DIR --text T... [--json]``: sentence embeddings from the CLI."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from aotx_trio.native.embed import Embedder


def embed_main(args: argparse.Namespace) -> int:
    texts: list[str] = list(args.text)
    threads = int(getattr(args, "threads", 0) or 0)
    with Embedder.load(args.model, threads=threads) as embedder:
        vectors = embedder.embed(texts)
        if args.json:
            json.dump(vectors.tolist(), sys.stdout)
            sys.stdout.write("\n")
            return 0
        norms = np.linalg.norm(vectors, axis=1)
        print(f"{len(texts)} embedding(s), {embedder.dim} dims, "
              f"{'L2-normalised' if embedder.normalize else 'mean pooled'}, "
              f"{embedder.threads} thread(s)")
        for text, vec, norm in zip(texts, vectors, norms, strict=True):
            n_tok = len(embedder.tokenize(text))
            head = ", ".join(f"{x:+.4f}" for x in vec[:4])
            shown = text if len(text) <= 48 else text[:45] + "..."
            print(f"  {shown!r}: {n_tok} tokens, norm {norm:.4f}, [{head}, ...]")
    return 0
