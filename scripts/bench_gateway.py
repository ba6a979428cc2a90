#!/usr/bin/env python3
"""Benchmark: durable shared mutations per second through a live ``aotx serve``.

Starts ``aotx serve`` on a free loopback port over a fresh data folder whose
gateway.json names one principal per client, then runs ``--clients`` (default
32) concurrent clients for ``--seconds``.  Each client registers, creates its
own private space, then loops ``member.set`` on it (an explicit row for itself
with every right), retiring its receipts every ``--retire-every`` mutations so
the fixed receipt table never fills.  Every counted mutation was
answered 202, i.e. after its admission record was fsynced.

Prints mutations/s and the p50/p99 latency of those answers; targets: >= 1000/s,
p99 < 50 ms.  Not a test: nothing here asserts on speed.

    .venv/bin/python scripts/bench_gateway.py [--clients 32] [--seconds 10] [--procs 2]
        [--runtime FILE]   # reuse a runtime file instead of packing the default models

The clients run in ``--procs`` processes (one Python event loop cannot keep 32
HTTP clients busy); every process runs against the same server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aotx_trio.config import GatewayConfig, write_gateway_config  # noqa: E402
from aotx_trio.gateway.auth import hash_token  # noqa: E402
from aotx_trio.runtime.service import principal_key  # noqa: E402

BASE = "/aotx/v1/shared"
SCHEMA = "aotx.shared.mutation.v1"
ALL = ["shared_read", "shared_write", "shared_manage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def prepare(data: Path, clients: int, runtime: Path | None) -> list[str]:
    data.mkdir(parents=True, exist_ok=True)
    if runtime is not None:
        shutil.copy(runtime, data / "runtime.aotxccir")
    tokens = [f"bench-token-{i}-{os.urandom(8).hex()}" for i in range(clients)]
    cfg = GatewayConfig.model_validate({
        "principals": [{"name": f"bench-{i}", "token_sha256": hash_token(t), "actions": ALL}
                       for i, t in enumerate(tokens)]})
    write_gateway_config(data / "gateway.json", cfg)
    return tokens


class Client:
    def __init__(self, http: httpx.AsyncClient, index: int, token: str, lineage: str) -> None:
        self.http = http
        self.i = index
        self.headers = {"Authorization": f"Bearer {token}"}
        self.lineage = lineage
        self.seq = 1
        self.me = f"par-{lineage}-{principal_key(f'bench-{index}')}"
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}

    def body(self, **fields: Any) -> dict[str, Any]:
        key = (self.i + 1) << 64 | self.seq
        return {"schema": SCHEMA, "lineage": self.lineage, "operation_key": f"{key:032x}",
                "sequence": str(self.seq), **fields}

    async def mutate(self, path: str, measure: bool, **fields: Any) -> dict[str, Any] | None:
        t0 = time.perf_counter()
        r = await self.http.post(BASE + path, json=self.body(**fields), headers=self.headers)
        dt = time.perf_counter() - t0
        if r.status_code != 202:
            code = r.json().get("error", {}).get("code", str(r.status_code))
            self.errors[code] = self.errors.get(code, 0) + 1
            return None
        self.seq += 1
        if measure:
            self.latencies.append(dt)
        out: dict[str, Any] = r.json()
        return out


async def run(base: str, tokens: list[str], first: int, seconds: float,
              retire_every: int) -> dict[str, Any]:
    """Drive clients ``first .. first+len(tokens)-1``; returns latencies and errors."""
    limits = httpx.Limits(max_connections=len(tokens) + 4, max_keepalive_connections=len(tokens))
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as http:
        caps = (await http.get(BASE + "/capabilities",
                               headers={"Authorization": f"Bearer {tokens[0]}"})).json()
        lineage = caps["lineage"]
        clients = [Client(http, first + i, t, lineage) for i, t in enumerate(tokens)]
        async with trio.open_nursery() as n:
            for c in clients:
                n.start_soon(c.mutate, "/participant", False)
        spaces: dict[int, str] = {}

        async def make_space(c: Client) -> None:
            receipt = await c.mutate("/spaces", False)
            assert receipt is not None, c.errors
            spaces[c.i] = receipt["resource"]

        async with trio.open_nursery() as n:
            for c in clients:
                n.start_soon(make_space, c)

        end = trio.current_time() + seconds
        started = time.perf_counter()

        async def loop(c: Client) -> None:
            k = 0
            while trio.current_time() < end:
                k += 1
                if k % retire_every == 0:
                    await c.mutate("/participant/retirements", True, retry_floor=str(c.seq))
                    continue
                # an explicit row for the owner itself, with every right: always allowed
                await c.mutate(f"/spaces/{spaces[c.i]}/members", True,
                               participant=c.me, permissions=["read", "write", "manage"])

        async with trio.open_nursery() as n:
            for c in clients:
                n.start_soon(loop, c)
        elapsed = time.perf_counter() - started
    errors: dict[str, int] = {}
    for c in clients:
        for k, v in c.errors.items():
            errors[k] = errors.get(k, 0) + v
    return {"latencies": [x for c in clients for x in c.latencies], "errors": errors,
            "elapsed": elapsed}


def report(results: list[dict[str, Any]], clients: int) -> None:
    lat = sorted(x for r in results for x in r["latencies"])
    errors: dict[str, int] = {}
    for r in results:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    if not lat:
        print(f"no durable mutations; errors: {errors}")
        return
    elapsed = max(r["elapsed"] for r in results)
    p50 = lat[len(lat) // 2] * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    rate = len(lat) / elapsed
    print(json.dumps({"clients": clients, "seconds": round(elapsed, 2),
                      "durable_mutations": len(lat), "per_second": round(rate, 1),
                      "p50_ms": round(p50, 2), "p99_ms": round(p99, 2), "errors": errors}))
    print(f"{rate:.0f} durable mutations/s (target >= 1000), p50 {p50:.1f} ms, "
          f"p99 {p99:.1f} ms (target < 50)")


def worker(args: argparse.Namespace) -> int:
    """One load process: clients [first, first+count) of the tokens file; JSON on stdout."""
    tokens = Path(args.tokens_file).read_text().split()[args.first:args.first + args.count]
    out = trio.run(run, args.base, tokens, args.first, args.seconds, args.retire_every)
    print(json.dumps(out))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--retire-every", type=int, default=16)
    ap.add_argument("--runtime", type=Path, help="runtime file to reuse (default: pack the "
                    "default models on first run)")
    ap.add_argument("--procs", type=int, default=2,
                    help="client processes (the clients are spread over them)")
    ap.add_argument("--keep", action="store_true", help="keep the data folder")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--tokens-file", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    data = Path(tempfile.mkdtemp(prefix="aotx-bench-"))
    tokens = prepare(data, args.clients, args.runtime)
    port = free_port()
    log = data / "serve.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "aotx_trio", "serve", "--data",
                                 str(data), "--bind", f"127.0.0.1:{port}"], stdout=out,
                                stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600   # first run may pack the default models
        while True:
            if proc.poll() is not None:
                print(log.read_text(), file=sys.stderr)
                return 1
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    print("server did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)
        tokens_file = data / "tokens"
        tokens_file.write_text("\n".join(tokens))
        procs = max(1, min(args.procs, args.clients))
        share = [args.clients // procs + (1 if i < args.clients % procs else 0)
                 for i in range(procs)]
        workers = []
        first = 0
        for count in share:
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--base", base, "--tokens-file",
                 str(tokens_file), "--first", str(first), "--count", str(count),
                 "--seconds", str(args.seconds), "--retire-every", str(args.retire_every)],
                stdout=subprocess.PIPE, text=True))
            first += count
        results = []
        for w in workers:
            text, _ = w.communicate(timeout=args.seconds + 300)
            if w.returncode != 0:
                print(f"a load process failed ({w.returncode})", file=sys.stderr)
                return 1
            results.append(json.loads(text.strip().splitlines()[-1]))
        report(results, args.clients)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
