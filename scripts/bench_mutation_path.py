#!/usr/bin/env python3
"""Micro-benchmark: the CPU of one durable mutation inside the server, without HTTP.

N trio tasks call an ASGI app directly (hypercorn's scope and messages, no TCP, no
h11), in a loop of the bench_gateway.py workload (``member.set`` on the client's own
space, a retirement every 16th), and the trio thread's CPU time (``time.thread_time``)
and the whole process's (``time.process_time``: the journal's fsync thread too) are
divided by the mutations answered in the window.  Sides:

``aotx``  the gateway's ASGI stack as ``aotx serve`` builds it (metrics, framing guard,
          body budget, fast path) over an embedded runtime with the cached bench
          runtime file (scripts/bench_gateway.py packs it), its heap settled as
          ``aotx serve`` settles it once serving: every answer a saved 202;
``bare``  bench_gateway.py's bare quart-trio route (append + group-commit fsync);
``null``  an ASGI app that answers at once: the harness's own cost.

On a shared machine run the sides interleaved several times and compare medians; the
thread CPU per mutation is the signal (what the one trio thread can do per second).
``--profile FILE`` writes cProfile stats of the window (timer: the thread's CPU time).

    PYTHONPATH=. .venv/bin/python scripts/bench_mutation_path.py --side aotx [--seconds 4]
        [--clients 32] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BASE = "/aotx/v1/shared"
BARE_PATH = "/bare/mutations"
SCHEMA = "aotx.shared.mutation.v1"
ALL = ["shared_read", "shared_write", "shared_manage"]
ASGIApp = Any


def scope_for(path: str, token: str, length: int) -> dict[str, Any]:
    return {"type": "http", "asgi": {"spec_version": "2.1", "version": "3.0"},
            "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {token}".encode()),
                        (b"content-type", b"application/json"),
                        (b"content-length", str(length).encode())],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
            "extensions": {}, "state": {}}


async def call(app: ASGIApp, path: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    """One request: the body in one message, the answer parsed."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope_for(path, token, len(payload)), receive, send)
    data = b"".join(chunks)
    return status, json.loads(data) if data else None


async def lifespan(app: ASGIApp, nursery: trio.Nursery) -> None:
    """Run the app's ASGI lifespan startup (its before_serving tasks) in ``nursery``."""
    to_app, from_us = trio.open_memory_channel[dict[str, Any]](4)
    started = trio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "lifespan.startup.complete":
            started.set()

    nursery.start_soon(app, {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                       from_us.receive, send)
    await to_app.send({"type": "lifespan.startup"})
    await started.wait()


async def null_app(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await receive()
        await send({"type": "lifespan.startup.complete"})
        await trio.sleep_forever()
    await receive()
    await send({"type": "http.response.start", "status": 202, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def bare_app(folder: Path) -> ASGIApp:
    """scripts/bench_gateway.py's bare server, as an app (no hypercorn)."""
    from bench_gateway import bare_app as app_of

    app: ASGIApp = app_of(folder)
    return app


async def aotx_app(folder: Path, tokens: list[str], runtime: Path,
                   nursery: trio.Nursery) -> tuple[ASGIApp, str]:
    from aotx_trio.config import GatewayConfig, write_gateway_config
    from aotx_trio.gateway.app import make_app_from_config
    from aotx_trio.gateway.auth import hash_token
    from aotx_trio.grants import write_grants
    from aotx_trio.runtime.boot import run_runtime
    from aotx_trio.service.client import InProcessClient

    cfg = GatewayConfig.model_validate({
        "bind": "127.0.0.1:0",
        "principals": [{"name": f"bench-{i}", "token_sha256": hash_token(t), "actions": ALL}
                       for i, t in enumerate(tokens)]})
    write_gateway_config(folder / "gateway.json", cfg)
    write_grants(cfg, folder / "grants")
    try:
        os.link(runtime, folder / "runtime.aotxccir")
    except OSError:
        shutil.copy(runtime, folder / "runtime.aotxccir")
    handler = await nursery.start(run_runtime, folder / "runtime.aotxccir",
                                  folder / "journal", folder / "grants")
    app = make_app_from_config(cfg, InProcessClient(handler))
    await lifespan(app, nursery)
    from aotx_trio._latency import tune_gc

    tune_gc()   # as aotx serve does once serving (gc.freeze, thresholds)
    return app.asgi_app, handler.lineage


async def main(args: argparse.Namespace) -> None:
    from aotx_trio.vocab import principal_key

    folder = Path(tempfile.mkdtemp(prefix="aotx-mpath-", dir="/tmp"))
    tokens = [f"bench-token-{i}-{os.urandom(4).hex()}" for i in range(args.clients)]
    try:
        async with trio.open_nursery() as nursery:
            lineage = "0" * 32
            if args.side == "aotx":
                app, lineage = await aotx_app(folder, tokens, args.runtime, nursery)
            elif args.side == "bare":
                app = bare_app(folder)
                await lifespan(app, nursery)
            else:
                app = null_app
            seqs = [1] * args.clients
            spaces = [f"spc-{lineage}-{i + 1:032x}" for i in range(args.clients)]

            async def mutate(i: int, path: str, **fields: Any) -> Any:
                key = (i + 1) << 64 | seqs[i]
                body = {"schema": SCHEMA, "lineage": lineage, "operation_key": f"{key:032x}",
                        "sequence": str(seqs[i]), **fields}
                status, out = await call(app, BASE + path if args.side == "aotx"
                                         else BARE_PATH, tokens[i], body)
                if status != 202:
                    raise RuntimeError(f"{status}: {out}")
                seqs[i] += 1
                return out

            if args.side == "aotx":   # register, then each client's own space
                async with trio.open_nursery() as n:
                    for i in range(args.clients):
                        n.start_soon(mutate, i, "/participant")

                async def make_space(i: int) -> None:
                    spaces[i] = (await mutate(i, "/spaces"))["resource"]

                async with trio.open_nursery() as n:
                    for i in range(args.clients):
                        n.start_soon(make_space, i)
            done = [0]

            async def loop(i: int, end: float) -> None:
                me = f"par-{lineage}-{principal_key(f'bench-{i}')}"
                k = 0
                while time.monotonic() < end:
                    k += 1
                    if k % 16 == 0:
                        await mutate(i, "/participant/retirements", retry_floor=str(seqs[i]))
                    else:
                        await mutate(i, f"/spaces/{spaces[i]}/members", participant=me,
                                     permissions=["read", "write", "manage"])
                    done[0] += 1

            async def phase(seconds: float) -> None:
                end = time.monotonic() + seconds
                async with trio.open_nursery() as n:
                    for i in range(args.clients):
                        n.start_soon(loop, i, end)

            await phase(args.warmup)
            done[0] = 0
            prof = cProfile.Profile(time.thread_time_ns, 1e-9) if args.profile else None
            t0, c0, p0 = time.monotonic(), time.thread_time(), time.process_time()
            if prof is not None:
                prof.enable()
            await phase(args.seconds)
            if prof is not None:
                prof.disable()
                prof.dump_stats(args.profile)
            t1, c1, p1 = time.monotonic(), time.thread_time(), time.process_time()
            n_ = max(1, done[0])
            print(json.dumps({"side": args.side, "mutations": done[0],
                              "per_second": round(done[0] / (t1 - t0), 1),
                              "trio_thread_us_per_mutation": round(1e6 * (c1 - c0) / n_, 1),
                              "process_us_per_mutation": round(1e6 * (p1 - p0) / n_, 1)}),
                  flush=True)
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("aotx", "bare", "null"), default="aotx")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--runtime", type=Path,
                    default=Path.home() / ".cache" / "aotx-trio" / "bench" / "runtime.aotxccir",
                    help="runtime file (default: the one scripts/bench_gateway.py packs)")
    ap.add_argument("--profile", help="cProfile stats of the window to this file")
    parsed = ap.parse_args()
    if parsed.side == "aotx" and not parsed.runtime.exists():
        ap.error(f"{parsed.runtime} is missing: run scripts/bench_gateway.py once")
    from aotx_trio.serve import SWITCH_INTERVAL_S

    sys.setswitchinterval(SWITCH_INTERVAL_S)   # as aotx serve does
    trio.run(main, parsed)
