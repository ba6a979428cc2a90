"""Serving router benchmarks (issue 9): invoke overhead against the engine alone,
GET /models with 10,000 manifests in the index, alias resolution of a 4-level chain.

    .venv/bin/python scripts/bench_router.py [--tokens 64] [--runs 5] [--requests 300]

Starts ``aotx serve``'s wiring in-process (packs the real default models into a
fresh data folder under /tmp, registers the default models in its folder store)
with the router on a loopback hypercorn, then:

* ``textgen``: the engine alone (``Engine.generate``, greedy, ``--tokens`` tokens,
  prefill included) against ``POST /models/default/text/invoke`` with the same
  prompt and ``max_tokens`` (temperature 0) and against ``/v1/chat/completions``
  (the same executor path without the router), best of ``--runs`` each; tokens/s
  is completion tokens over wall time;
* ``GET /models``: 10,000 index rows (synthetic entries put straight into the
  index: the route serves only from it), ``--requests`` sequential requests, p50/p99;
* ``GET /aliases/bench/l3``: a 4-level chain (levels 3..0) onto the default text
  model, read and verified from the store on every request, p50/p99;
* store latency without HTTP (``Registry`` calls): a keyed model read and a
  4-level alias resolution on a fresh folder store and, with ``--pg-url``, on an
  empty PostgreSQL database.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from aotx_trio.default_models import default_text_model
from aotx_trio.native.engine import Engine
from aotx_trio.router.aliases import set_alias
from aotx_trio.router.index import Entry

PROMPT = "Write one sentence about the sea."


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def engine_alone(eng: Engine, tokens: int) -> float:
    """Tokens per second of one greedy generation on the engine alone."""
    t = time.perf_counter()
    for _ in eng.generate(PROMPT, max_tokens=tokens, temperature=0.0):
        pass
    return len(eng.last.tokens) / (time.perf_counter() - t)


async def bench(args: argparse.Namespace) -> None:
    from hypercorn.trio import serve as hypercorn_serve

    from aotx_trio.gateway.app import create_app
    from aotx_trio.gateway.serve import hypercorn_config
    from aotx_trio.registry.backends import open_store
    from aotx_trio.router.registry import Registry
    from aotx_trio.router.service import RouterService, Settings
    from aotx_trio.runtime.boot import run_runtime
    from aotx_trio.serve import prepare, register_default_models
    from aotx_trio.service.client import InProcessClient

    root = Path(tempfile.mkdtemp(prefix="aotx-bench-router-", dir="/tmp"))
    data = root / "data"
    data.mkdir()
    try:
        runtime, config, token = await trio.to_thread.run_sync(prepare, data, "127.0.0.1:0")
        assert token is not None and config.store is not None
        async with trio.open_nursery() as nursery:
            handler = await nursery.start(run_runtime, runtime, data / "journal",
                                          data / "grants")
            await register_default_models(config, runtime, handler)
            client = InProcessClient(handler)
            router = RouterService(Registry(open_store(data=config.store)), client,
                                   Settings())
            app = create_app(client, config.principals, router=router)
            shutdown = trio.Event()
            binds = await nursery.start(functools.partial(
                hypercorn_serve, app, hypercorn_config(config, app),
                shutdown_trigger=shutdown.wait))
            h = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=binds[0], headers=h, timeout=300) as http:
                eng = Engine.load(default_text_model(), max_seqs=16)
                alone = best = chat = 0.0
                chat_n = 0
                for _ in range(args.runs):      # interleaved: the machine's load hits all three
                    alone = max(alone, await trio.to_thread.run_sync(
                        engine_alone, eng, args.tokens))
                    t = time.perf_counter()
                    r = await http.post("/models/default/text/invoke", json={"request": {
                        "prompt": PROMPT, "max_tokens": args.tokens, "temperature": 0.0}})
                    wall = time.perf_counter() - t
                    r.raise_for_status()
                    best = max(best, r.json()["results"][0]["completion_tokens"] / wall)
                    t = time.perf_counter()
                    r = await http.post("/v1/chat/completions", json={
                        "model": handler.models.identity()[0]["name"], "temperature": 0,
                        "max_tokens": args.tokens,
                        "messages": [{"role": "user", "content": PROMPT}]})
                    wall = time.perf_counter() - t
                    r.raise_for_status()
                    chat_n = r.json()["usage"]["completion_tokens"]
                    chat = max(chat, chat_n / wall)
                eng.close()
                print(f"textgen: engine alone {alone:.1f} tok/s, router invoke {best:.1f} "
                      f"tok/s ({100 * (best / alone - 1):+.1f} %), /v1/chat/completions "
                      f"{chat:.1f} tok/s ({100 * (chat / alone - 1):+.1f} %, {chat_n} tokens), "
                      f"{args.tokens} tokens, best of {args.runs}")

                # GET /models with 10,000 rows in the index (the route reads only the index)
                base = next(iter(router.index.entries.values()))
                for i in range(10_000):
                    mid = f"bench/m{i:05d}"
                    router.index.entries[mid] = Entry(mid, base.model_type, "active",
                                                      {**base.listing, "model_id": mid})
                router.index._sorted = None
                lat = []
                for _ in range(args.requests):
                    t = time.perf_counter()
                    r = await http.get("/models")
                    lat.append(time.perf_counter() - t)
                rows = len(r.json()["models"])
                print(f"GET /models, {rows} rows ({len(r.content)} bytes): "
                      f"p50 {1000 * statistics.median(lat):.1f} ms, "
                      f"p99 {1000 * pct(lat, 0.99):.1f} ms")

                reg = router.reg
                await set_alias(reg, "bench/l1", "default/text", 1)
                await set_alias(reg, "bench/l2", "bench/l1", 2)
                await set_alias(reg, "bench/l3", "bench/l2", 3)
                lat = []
                for _ in range(args.requests):
                    t = time.perf_counter()
                    r = await http.get("/aliases/bench/l3")
                    lat.append(time.perf_counter() - t)
                assert len(r.json()["chain"]) == 4
                print(f"GET /aliases (4-level chain, folder store): p50 "
                      f"{1000 * statistics.median(lat):.2f} ms, "
                      f"p99 {1000 * pct(lat, 0.99):.2f} ms")
            shutdown.set()
            nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def store_latency(reg: object, n: int) -> str:
    """p50/p99 of a keyed model read and of a 4-level alias resolution on one store."""
    from aotx_trio.identity import Descriptor
    from aotx_trio.router.aliases import resolve_alias
    from aotx_trio.router.artifacts import store_artifact
    from aotx_trio.router.registry import Registry

    assert isinstance(reg, Registry)
    commit = "0" * 40
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        path.write_bytes(b"GGUF" + bytes(1024))
        art = await reg.run(store_artifact, reg.store, path)
    await reg.mint_release("lat-r1", art, Descriptor(), commit)
    mid = "bench/lat/model.json"
    await reg.publish(mid, {"model_type": "textgen", "artifact": art.model_dump(mode="json"),
                            "serving": {"runtime_release": {"name": "lat-r1",
                                                            "source_commit": commit},
                                        "spec": {"spec_dsl": 2, "params": [],
                                                 "results": {"fields": []}}}})
    await set_alias(reg, "lat/l0", mid, 0)
    for lvl in (1, 2, 3):
        await set_alias(reg, f"lat/l{lvl}", f"lat/l{lvl - 1}", lvl)
    out = []
    for what, call in (("model read", lambda: reg.get_model(mid)),
                       ("4-level alias", lambda: resolve_alias(reg, "lat/l3"))):
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            await call()
            lat.append(time.perf_counter() - t)
        out.append(f"{what} p50 {1000 * statistics.median(lat):.2f} ms, "
                   f"p99 {1000 * pct(lat, 0.99):.2f} ms")
    return "; ".join(out)


async def stores(args: argparse.Namespace) -> None:
    from aotx_trio.registry.backends import open_store
    from aotx_trio.router.registry import Registry

    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        folder = Registry(open_store(data=tmp))
        print(f"folder store: {await store_latency(folder, args.requests)}")
        await folder.aclose()
    if args.pg_url:
        pg = Registry(open_store(url=args.pg_url))
        print(f"PostgreSQL store: {await store_latency(pg, args.requests)}")
        await pg.aclose()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--pg-url", help="also measure store latency on this (empty) PostgreSQL "
                   "database")
    p.add_argument("--stores-only", action="store_true",
                   help="only the store latency (folder, and --pg-url)")
    args = p.parse_args()
    if not args.stores_only:
        trio.run(bench, args)
    trio.run(stores, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
