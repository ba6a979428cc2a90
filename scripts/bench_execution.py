#!/usr/bin/env python3
"""Benchmark: conversations generating through the HTTP service vs the engine alone.

    .venv/bin/python scripts/bench_execution.py [--conversations 8] [--tokens 64]
        [--rounds 1] [--kernels auto|avx2]

Two sides on the same machine, one after the other per round (the order
alternates), on the real default model (Gemma 3 270M Q4_K_M):

``service``  ``aotx serve`` (a child process) on a free loopback port; one client
             thread per conversation registers, makes a private space and a
             conversation, then posts one input (``max_output_tokens`` =
             ``--tokens``, greedy) and follows it with SSE
             (``GET /operations/{op}/events``).  Aggregate tokens/s = the output
             tokens the receipts report / (last end - first post); time to first
             byte = post sent -> first ``output`` event.
``engine``   a child process with :class:`aotx_trio.native.engine.Engine` alone and the
             same prompts (:func:`aotx_trio.runtime.prompt.render`): every prompt
             prefilled, then batched decode steps of all sequences, stopping each
             at EOS or ``--tokens`` like the service: the ceiling the service's
             executor can reach.

``--kernels`` caps the kernel path (``aotx_kernel_force`` in the engine child,
``AOTX_KERNELS`` in the service's environment); the header prints the CPU and
the path that ran.  Not a test: nothing asserts on speed.
"""

from __future__ import annotations

import argparse
import json
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

from bench_gateway import cached_runtime, free_port  # noqa: E402  (one copy of each)

BASE = "/aotx/v1/shared"
SCHEMA = "aotx.shared.mutation.v1"
ALL = ["shared_read", "shared_write", "shared_manage"]
TEXT = "Tell me about the history of the city on the river, its market and its walls."


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


# --------------------------------------------------------------------------- engine side


def child_engine(n: int, tokens: int, kernels: str) -> dict[str, Any]:
    from aotx_trio.default_models import default_text_model
    from aotx_trio.native.engine import Engine
    from aotx_trio.native.lib import check, ffi, lib
    from aotx_trio.runtime.prompt import Turn, render

    check(lib.aotx_kernel_force(kernels.encode()))

    with Engine.load(default_text_model(), max_seqs=max(n, 1)) as eng:
        prompts = [render(eng, [], Turn(f"bench-{i}", TEXT.encode()),
                          eng.info.max_tokens - tokens) for i in range(n)]
        t0 = time.perf_counter()
        seqs = [eng.add_sequence() for _ in range(n)]
        nxt = [eng.sample(q, eng.prefill(q, p), 0) for q, p in zip(seqs, prompts, strict=True)]
        made = [0] * n
        live = [i for i in range(n) if nxt[i] not in eng.stop_ids]
        while live:
            res = eng.step([(seqs[i], [nxt[i]]) for i in live])
            still = []
            for row, i in enumerate(live):
                made[i] += 1
                tok = eng.sample(seqs[i], res, row)
                if made[i] < tokens and tok not in eng.stop_ids:
                    nxt[i] = tok
                    still.append(i)
            live = still
        wall = time.perf_counter() - t0
        for q in seqs:
            eng.release(q)
        impl = ffi.string(lib.aotx_kernel_impl(12)).decode()   # Q4_K
    return {"tokens": sum(made), "seconds": wall, "tok_s": sum(made) / wall, "kernel": impl}


# --------------------------------------------------------------------------- service side


def run_service(n: int, tokens: int, runtime: Path) -> dict[str, Any]:
    import httpx

    from aotx_trio.config import GatewayConfig, write_gateway_config
    from aotx_trio.gateway.auth import hash_token

    data = Path(tempfile.mkdtemp(prefix="aotx-bx-", dir="/tmp"))
    port = free_port()
    try:
        try:
            os.link(runtime, data / "runtime.aotxccir")
        except OSError:
            shutil.copy(runtime, data / "runtime.aotxccir")
        toks = [f"bench-{i}-{os.urandom(8).hex()}" for i in range(n)]
        write_gateway_config(data / "gateway.json", GatewayConfig.model_validate({
            "bind": f"127.0.0.1:{port}", "principals": [
                {"name": f"bench-{i}", "token_sha256": hash_token(t), "actions": ALL}
                for i, t in enumerate(toks)]}))
        log = (data / "serve.log").open("wb")
        proc = subprocess.Popen([sys.executable, "-m", "aotx_trio", "serve", "--data",
                                 str(data), "--bind", f"127.0.0.1:{port}"],
                                stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(base + BASE + "/capabilities", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((data / "serve.log").read_text()) from None
                time.sleep(0.1)
        clients = [httpx.Client(base_url=base + BASE, timeout=300,
                                headers={"Authorization": f"Bearer {t}"}) for t in toks]
        lineage = clients[0].get("/capabilities").json()["lineage"]
        model = next(m["name"] for m in clients[0].get("/capabilities").json()["models"]
                     if m["kind"] == "text")

        def body(key: int, seq: int, **f: Any) -> dict[str, Any]:
            return {"schema": SCHEMA, "lineage": lineage, "operation_key": f"{key:032x}",
                    "sequence": str(seq), **f}

        cons = []
        for i, c in enumerate(clients):     # ids default to the keys: one range per client
            k = (i + 1) << 16
            c.post("/participant", json=body(k + 1, 1)).raise_for_status()
            r = c.post("/spaces", json=body(k + 2, 2))
            assert r.status_code == 202, r.text
            space = r.json()["resource"]
            cons.append(c.post(f"/spaces/{space}/conversations",
                               json=body(k + 3, 3)).json()["resource"])
        go = threading.Barrier(n)
        out: list[dict[str, float]] = [{} for _ in range(n)]

        def one(i: int) -> None:
            c = clients[i]
            go.wait()
            t0 = time.perf_counter()
            r = c.post(f"/conversations/{cons[i]}/inputs",
                       json=body(((i + 1) << 16) + 4, 4, text=TEXT, model=model,
                                 max_output_tokens=tokens))
            r.raise_for_status()
            op = r.json()["operation"]
            first = None
            with c.stream("GET", f"/operations/{op}/events") as resp:
                for line in resp.iter_lines():
                    if line.startswith("event: output") and first is None:
                        first = time.perf_counter()
                    if line.startswith("event: end"):
                        break
            end = time.perf_counter()
            rec = c.get(f"/operations/{op}").json()
            out[i] = {"start": t0, "first": (first or end) - t0, "end": end,
                      "tokens": rec["result"]["output_tokens"]}

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in clients:
            c.close()
        proc.terminate()
        proc.wait(timeout=60)
        log.close()
        wall = max(o["end"] for o in out) - min(o["start"] for o in out)
        total = sum(int(o["tokens"]) for o in out)
        ttfb = sorted(o["first"] for o in out)
        return {"tokens": total, "seconds": wall, "tok_s": total / wall,
                "ttfb_p50": statistics.median(ttfb),
                "ttfb_p99": ttfb[min(len(ttfb) - 1, int(0.99 * len(ttfb)))]}
    finally:
        shutil.rmtree(data, ignore_errors=True)


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--conversations", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--kernels", default="auto", help="AOTX_KERNELS for both sides")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "aotx-trio" / "bench")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.kernels != "auto":
        os.environ["AOTX_KERNELS"] = a.kernels
    if a.child:
        print(json.dumps(child_engine(a.conversations, a.tokens, a.kernels)))
        return 0
    runtime = cached_runtime(a.cache)
    eng_runs, svc_runs = [], []
    for r in range(a.rounds):
        order = ("engine", "service") if r % 2 == 0 else ("service", "engine")
        for side in order:
            if side == "engine":
                out = subprocess.run([sys.executable, __file__, "--child", "--conversations",
                                      str(a.conversations), "--tokens", str(a.tokens),
                                      "--kernels", a.kernels], capture_output=True, text=True,
                                     check=True, timeout=600)
                eng_runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            else:
                svc_runs.append(run_service(a.conversations, a.tokens, runtime))
    e = statistics.median(x["tok_s"] for x in eng_runs)
    s = statistics.median(x["tok_s"] for x in svc_runs)
    print(f"CPU {cpu_model()}, {os.cpu_count()} logical CPUs; kernel path (Q4_K): "
          f"{eng_runs[0]['kernel']}; AOTX_KERNELS={a.kernels}; load {os.getloadavg()[0]:.2f}")
    print(f"{a.conversations} conversations x {a.tokens} tokens, {a.rounds} round(s), medians")
    print(f"{'side':<10} {'tokens':>7} {'seconds':>8} {'tok/s':>8}  ttfb p50 / p99")
    for name, runs in (("engine", eng_runs), ("service", svc_runs)):
        m = min(runs, key=lambda x: abs(x["tok_s"] - statistics.median(y["tok_s"] for y in runs)))
        extra = f"  {m['ttfb_p50'] * 1000:.0f} / {m['ttfb_p99'] * 1000:.0f} ms" \
            if "ttfb_p50" in m else ""
        print(f"{name:<10} {m['tokens']:>7} {m['seconds']:>8.2f} {m['tok_s']:>8.1f}{extra}")
    print(f"service / engine = {s / e:.2f}x (target >= 0.90)")
    print(json.dumps({"engine": eng_runs, "service": svc_runs, "ratio": s / e}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
