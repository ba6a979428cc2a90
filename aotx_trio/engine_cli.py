"""``aotx generate``: one completion on the native engine (docs/api.md)."""

from __future__ import annotations

import argparse
import json
import sys

from aotx_trio.native.engine import Engine


def generate_main(args: argparse.Namespace) -> int:
    with Engine.load(args.model, threads=args.threads, max_seqs=1) as eng:
        out = sys.stdout.buffer
        for piece in eng.generate(args.prompt, max_tokens=args.max_tokens,
                                  temperature=args.temperature, top_p=args.top_p, seed=args.seed):
            if not args.json:
                out.write(piece)
                out.flush()
        g = eng.last
        if args.json:
            doc = {
                "prompt_tokens": g.prompt_tokens,
                "tokens": g.tokens,
                "text": g.text.decode("utf-8", errors="replace"),
                "prefill_tok_s": round(g.stats.prefill_tok_s, 2),
                "decode_tok_s": round(g.stats.decode_tok_s, 2),
            }
            out.write(json.dumps(doc, ensure_ascii=False).encode() + b"\n")
        else:
            out.write(b"\n")
        out.flush()
    return 0
