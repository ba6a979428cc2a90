"""Webhook delivery benchmarks (issue 12): events delivered per second to one fast
consumer and to 100 subscriptions, and the delivery lag from the store append to
the consumer's 2xx.

    .venv/bin/python scripts/bench_webhooks.py [--events 2000] [--subs 100]
        [--per-sub 100] [--lag-events 200] [--tls] [--pg-url postgresql://...]

In-process: a folder store under /tmp (or PostgreSQL with ``--pg-url``), one
router's ``WebhookService`` with the default settings except
``allow_insecure_targets`` (the consumer is on loopback), and a consumer (hypercorn
on loopback, plain http or, with ``--tls``, HTTPS with a trustme CA) that checks
every signature with PyNaCl and answers 204:

* ``one``: ``--events`` events appended, then one backfill subscription: events/s
  from its creation to the last 2xx;
* ``many``: ``--subs`` backfill subscriptions over ``--per-sub`` events: posts/s;
* ``lag``: one caught-up subscription, ``--lag-events`` events appended 20 ms
  apart: append -> 2xx p50/p99 (bounded below by the feed poll, ``poll_s`` = 1 s).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import nacl.signing
import trio
import trustme

from aotx_trio.identity import canonical, sha256_hex
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.feed import operation_id
from aotx_trio.registry.records import parse_time, rfc3339
from aotx_trio.registry.store import StoreBackend
from aotx_trio.webhooks.delivery import Settings
from aotx_trio.webhooks.service import WebhookService


class Consumer:
    def __init__(self, public_key: bytes) -> None:
        self.key = nacl.signing.VerifyKey(public_key)
        self.arrivals: list[tuple[float, dict[str, Any], str]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                await send({"type": msg["type"] + ".complete"})
                if msg["type"] == "lifespan.shutdown":
                    return
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        h = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        ts = h["x-serving-timestamp"]
        self.key.verify(ts.encode() + b"." + raw,
                        bytes.fromhex(h["x-serving-signature"].removeprefix("ed25519=")))
        self.arrivals.append((time.time(), json.loads(raw), scope["query_string"].decode()))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def append(store: StoreBackend, n: int, start: int) -> None:
    for i in range(start, start + n):
        obj = sha256_hex(f"bench-{i}".encode())
        op = operation_id("alias.moved", f"b/{i}", obj)
        now = time.time()
        store.feed_append(canonical({"type": "alias.moved", "subject": f"b/{i}",
                                     "at": rfc3339(now), "object_sha256": obj,
                                     "operation_id": op,
                                     "payload": {"target": f"m/{i}", "level": 1}}), op, now)


async def main(args: argparse.Namespace) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    tmp = Path(tempfile.mkdtemp(prefix="aotx-bench-hooks-"))
    key = nacl.signing.SigningKey.generate()
    rx = Consumer(key.verify_key.encode())
    hc = Config()
    hc.bind = ["127.0.0.1:0"]
    hc.accesslog = None
    hc.errorlog = None
    ca_file = None
    if args.tls:
        ca = trustme.CA()
        ca.issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(
            str(tmp / "s.pem"))
        ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
        hc.certfile = hc.keyfile = str(tmp / "s.pem")
        ca_file = str(tmp / "ca.pem")
    settings = Settings(allow_insecure_targets=True, ca_file=ca_file)
    stores: list[StoreBackend] = []

    def fresh() -> StoreBackend:
        s = open_store(url=args.pg_url) if args.pg_url and not stores else \
            open_store(data=tmp / f"data{len(stores)}")
        stores.append(s)
        return s

    shutdown = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(lambda task_status: serve(
                rx, hc, shutdown_trigger=shutdown.wait, task_status=task_status))
            url = f"{'https' if args.tls else 'http'}://localhost:{binds[0].rsplit(':', 1)[1]}/h"
            kind = "PostgreSQL" if args.pg_url else "folder"
            print(f"store: {kind}; consumer: {'https' if args.tls else 'http'} on loopback")

            async def run_case(store: StoreBackend, subs: int, total: int) -> float:
                rx.arrivals.clear()
                svc = WebhookService(store, key, settings)
                async with trio.open_nursery() as n:
                    await n.start(svc.run)
                    t0 = time.perf_counter()
                    for i in range(subs):
                        await svc.create({"url": f"{url}?s={i}", "backfill": True})
                    while len(rx.arrivals) < total:
                        await trio.sleep(0.01)
                    dt = time.perf_counter() - t0
                    n.cancel_scope.cancel()
                return dt

            s1 = fresh()
            await trio.to_thread.run_sync(append, s1, args.events, 0)
            dt = await run_case(s1, 1, args.events)
            print(f"one: {args.events} events to 1 subscription in {dt:.2f} s = "
                  f"{args.events / dt:.0f} events/s")

            s2 = open_store(data=tmp / "many")
            stores.append(s2)
            await trio.to_thread.run_sync(append, s2, args.per_sub, 0)
            total = args.subs * args.per_sub
            dt = await run_case(s2, args.subs, total)
            print(f"many: {args.subs} subscriptions x {args.per_sub} events = {total} posts "
                  f"in {dt:.2f} s = {total / dt:.0f} posts/s")

            s3 = open_store(data=tmp / "lag")
            stores.append(s3)
            rx.arrivals.clear()
            svc = WebhookService(s3, key, settings)
            async with trio.open_nursery() as n:
                await n.start(svc.run)
                await svc.create({"url": url})
                await trio.sleep(1.5)
                for i in range(args.lag_events):
                    await trio.to_thread.run_sync(append, s3, 1, i)
                    await trio.sleep(0.02)
                while len(rx.arrivals) < args.lag_events:
                    await trio.sleep(0.01)
                n.cancel_scope.cancel()
            lags = sorted(t - parse_time(b["at"]) for t, b, _ in rx.arrivals)
            p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))]
            print(f"lag: {len(lags)} events append -> 2xx p50 {statistics.median(lags) * 1000:.0f} "
                  f"ms, p99 {p99 * 1000:.0f} ms (feed poll {settings.poll_s} s)")
            shutdown.set()
    finally:
        for s in stores:
            s.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--subs", type=int, default=100)
    ap.add_argument("--per-sub", type=int, default=100)
    ap.add_argument("--lag-events", type=int, default=200)
    ap.add_argument("--tls", action="store_true")
    ap.add_argument("--pg-url")
    trio.run(main, ap.parse_args())
