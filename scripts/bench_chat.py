#!/usr/bin/env python3
"""Chat completions through HTTP (issue 11, "Benchmarks"), with the official ``openai``
client against a real ``aotx serve`` (a child process) on loopback, default model
(Gemma 3 270M Q4_K_M):

    .venv/bin/python scripts/bench_chat.py [--clients 8] [--requests 4] [--tokens 128]
        [--runs 3]

* **time to first token**: ``--clients`` threads, each its own ``openai.OpenAI``
  client, all streaming (``stream=True``) at once, ``--requests`` requests each
  (``max_tokens`` 16, greedy); TTFT = ``create()`` called -> the first chunk with
  content; p50 / p99 over all requests;
* **tokens/s**: one client, non-streaming, greedy, ``max_tokens`` ``--tokens``;
  completion tokens (``usage``) over wall time, against the engine alone
  (:meth:`aotx_trio.native.engine.Engine.generate` in this process on the same prompt,
  rendered by the same chat template, the server idle meanwhile); runs interleaved,
  best of ``--runs`` each; the ratio printed (target >= 0.90).

Not a test: nothing asserts on speed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gateway import cached_runtime, free_port  # noqa: E402

ACTIONS = ["shared_read", "shared_write", "shared_manage", "models_invoke", "models_read"]
PROMPT = "Write a very long story about the sea and the ships that sail on it."


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def serve(runtime: Path, clients: int) -> tuple[subprocess.Popen[bytes], str, list[str], Path]:
    """``aotx serve`` on a free loopback port: (process, base URL, tokens, data folder)."""
    import httpx

    from aotx_trio.config import GatewayConfig, write_gateway_config
    from aotx_trio.gateway.auth import hash_token

    data = Path(tempfile.mkdtemp(prefix="aotx-bc-", dir="/tmp"))
    try:
        os.link(runtime, data / "runtime.aotxccir")
    except OSError:
        shutil.copy(runtime, data / "runtime.aotxccir")
    port = free_port()
    toks = [f"bench-{i}-{os.urandom(8).hex()}" for i in range(clients)]
    write_gateway_config(data / "gateway.json", GatewayConfig.model_validate({
        "bind": f"127.0.0.1:{port}", "principals": [
            {"name": f"bench-{i}", "token_sha256": hash_token(t), "actions": ACTIONS}
            for i, t in enumerate(toks)]}))
    log = (data / "serve.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "aotx_trio", "serve", "--data", str(data),
                             "--bind", f"127.0.0.1:{port}"], stdout=log,
                            stderr=subprocess.STDOUT, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            r = httpx.get(base + "/v1/models", timeout=2,
                          headers={"Authorization": f"Bearer {toks[0]}"})
            if r.status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise RuntimeError((data / "serve.log").read_text())
        time.sleep(0.2)
    return proc, base, toks, data


def ttft(base: str, toks: list[str], model: str, requests: int) -> list[float]:
    """TTFT (seconds) of every streaming request, all clients at once."""
    import openai

    go = threading.Barrier(len(toks))
    out: list[list[float]] = [[] for _ in toks]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            c = openai.OpenAI(base_url=base + "/v1", api_key=toks[i], max_retries=0,
                              timeout=300)
            go.wait()
            for k in range(requests):
                t0 = time.perf_counter()
                stream = c.chat.completions.create(
                    model=model, max_tokens=16, temperature=0, stream=True,
                    messages=[{"role": "user", "content": f"{PROMPT} ({i}.{k})"}])
                first = None
                for chunk in stream:
                    if first is None and chunk.choices and chunk.choices[0].delta.content:
                        first = time.perf_counter() - t0
                out[i].append(first if first is not None else time.perf_counter() - t0)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(toks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [x for xs in out for x in xs]


def http_rate(base: str, tok: str, model: str, tokens: int) -> float:
    import openai

    c = openai.OpenAI(base_url=base + "/v1", api_key=tok, max_retries=0, timeout=300)
    t0 = time.perf_counter()
    done = c.chat.completions.create(model=model, max_tokens=tokens, temperature=0,
                                     messages=[{"role": "user", "content": PROMPT}])
    wall = time.perf_counter() - t0
    assert done.usage is not None
    return done.usage.completion_tokens / wall


def engine_rate(eng: Any, tokens: int) -> float:
    from aotx_trio.runtime.prompt import render_chat

    prompt = render_chat(eng, [("user", PROMPT.encode())])
    t0 = time.perf_counter()
    n = sum(1 for _ in eng.generate(prompt, max_tokens=tokens))
    wall = time.perf_counter() - t0
    return max(n, len(eng.last.tokens)) / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="streaming requests per client")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "aotx-trio" / "bench")
    a = ap.parse_args()
    from aotx_trio.default_models import default_text_model
    from aotx_trio.native.engine import Engine

    runtime = cached_runtime(a.cache)
    proc, base, toks, data = serve(runtime, a.clients)
    try:
        import openai

        model = next(m.id for m in openai.OpenAI(base_url=base + "/v1", api_key=toks[0])
                     .models.list() if m.id.endswith(".gguf"))
        http_rate(base, toks[0], model, 8)                      # warm up
        firsts = ttft(base, toks, model, a.requests)
        eng = Engine.load(default_text_model(), max_seqs=1)
        e_runs, h_runs = [], []
        for r in range(a.runs):
            for side in (("engine", "http") if r % 2 == 0 else ("http", "engine")):
                if side == "engine":
                    e_runs.append(engine_rate(eng, a.tokens))
                else:
                    h_runs.append(http_rate(base, toks[0], model, a.tokens))
        eng.close()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(data, ignore_errors=True)
    print(f"{os.cpu_count()} logical CPUs, load average {os.getloadavg()[0]:.1f}; model {model}")
    print("| measurement | value |")
    print("|---|---:|")
    print(f"| TTFT, {a.clients} concurrent streaming clients x {a.requests} requests, p50 | "
          f"{statistics.median(firsts) * 1e3:.0f} ms |")
    print(f"| TTFT, same, p99 | {pct(firsts, 0.99) * 1e3:.0f} ms |")
    e, h = max(e_runs), max(h_runs)
    print(f"| engine alone, {a.tokens} tokens, best of {a.runs} | {e:.1f} tok/s |")
    print(f"| /v1/chat/completions (openai client), best of {a.runs} | {h:.1f} tok/s |")
    print(f"http / engine = {h / e:.2f} (target >= 0.90); runs engine "
          f"{[round(x, 1) for x in e_runs]}, http {[round(x, 1) for x in h_runs]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
