#!/usr/bin/env python3
"""Benchmark: SSE fanout, many subscribers on one conversation's or one operation's events.

    .venv/bin/python scripts/bench_sse.py [--subscribers 500 | 50,500] [--readers 5] [--procs 2]
        [--modes embedded,split] [--variants conversation,operation] [--events 40]
        [--interval 0.25] [--gen-tokens 16] [--op-tokens 256] [--rounds 1]

A real server on a free loopback port over a fresh data folder, with the real
default model (Gemma 3 270M Q4_K_M: the inputs really generate while the
events fan out): ``embedded`` is ``aotx serve``, ``split`` is ``aotx boot`` +
``aotx gateway serve`` (the streams ride the service socket's push frames).
The bench's own gateway.json raises ``max_connections`` (2048) and lifts the
request rate limit; every other limit is the default (``sse_queue_depth``
256).  Setup: an owner registers, makes a ``room`` space and a conversation
and adds ``--readers`` registered readers with the read right.

``conversation``  ``--subscribers`` SSE streams (httpx async, one connection
                  each, spread over ``--procs`` load processes and the readers'
                  tokens) on ``GET /conversations/{con}/events?stream=true``;
                  once all are open the owner posts ``--events`` inputs, one
                  every ``--interval`` s (``--gen-tokens`` output tokens each,
                  so generation runs throughout).
``operation``     the owner posts one input of ``--op-tokens`` output tokens,
                  then every subscriber follows ``GET /operations/{op}/events``
                  from offset 0 (spans are cut per subscriber: an event's
                  ``id`` names its next byte offset).

Latency, on the bench's clock (``time.monotonic``: one clock for every
process on the machine), of each event at each subscriber:

``spread``        its arrival minus the earliest arrival of the same event
                  (conversation: the same cursor; operation: the event's
                  first byte) at any subscriber: the fanout's own delay, not
                  counting the hop from the save or the executor to the
                  first subscriber.  Only events first seen after every
                  stream opened count.
``POST->arrival`` (conversation) its arrival minus the moment the bench sent
                  the input's POST: an upper bound of the creation-to-delivery
                  latency, as it includes the mutation's own HTTP request and
                  admission fsync (the event is created when the admission is
                  saved, before the 202 leaves).

``main CPU``      CPU seconds of the servers' main threads (the trio loops: HTTP,
                  fanout, the executor's Python; engine steps run in worker
                  threads) while the inputs were posted, and per delivery: the
                  number that noise on a shared machine moves least.
                  ``--profile DIR`` runs the gateway (``aotx serve``) under
                  cProfile and writes one file per side there.

``--subscribers 50,500`` measures each side at each count, one right after the
other in the same round (the order flipped every round), and prints the ratio
of the largest count's spread p99 to the smallest's (and of main CPU per
delivery): on a shared, noisy machine the ratio moves less than either
figure.

Drops: streams that ended with a ``dropped`` event (slow consumer) or an
``error`` event, or that missed an event.  Target: p99 < 100 ms with 500
subscribers.  The machine load (1-minute average) is printed before and
after each side.  Not a test: nothing asserts on speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from bench_gateway import CLK_TCK, cached_runtime, free_port, launch, machine, proc_cpu, stop  # noqa: E402

BASE = "/aotx/v1/shared"
SCHEMA = "aotx.shared.mutation.v1"
ALL = ["shared_read", "shared_write", "shared_manage"]
TEXT = "Tell the room one short fact about rivers, number {k}."


# --------------------------------------------------------------------------- setup


def prepare(data: Path, readers: int, runtime: Path, bind: str, split: bool) -> list[str]:
    """The data folder (runtime file, gateway.json, grants for split); the tokens,
    the owner's first."""
    from aotx_trio.config import GatewayConfig, write_gateway_config
    from aotx_trio.gateway.auth import hash_token

    data.mkdir(parents=True, exist_ok=True)
    try:
        os.link(runtime, data / "runtime.aotxccir")
    except OSError:
        shutil.copy(runtime, data / "runtime.aotxccir")
    names = ["owner", *[f"reader-{i}" for i in range(readers)]]
    tokens = [f"bench-{n}-{os.urandom(8).hex()}" for n in names]
    cfg = GatewayConfig.model_validate({
        "bind": bind,
        "service_socket": str(data / "journal" / "service.sock") if split else None,
        "principals": [{"name": n, "token_sha256": hash_token(t), "actions": ALL}
                       for n, t in zip(names, tokens, strict=True)],
        "limits": {"max_connections": 2048, "requests_per_second": 0}})
    write_gateway_config(data / "gateway.json", cfg)
    if split:
        from aotx_trio.grants import write_grants

        write_grants(cfg, data / "grants")
    return tokens


class Owner:
    """The owner's client: setup, then the inputs."""

    def __init__(self, base: str, tokens: list[str]) -> None:
        import httpx

        self.http = httpx.Client(base_url=base + BASE, timeout=120,
                                 headers={"Authorization": f"Bearer {tokens[0]}"})
        caps = self.http.get("/capabilities").json()
        self.lineage = caps["lineage"]
        self.model = next(m["name"] for m in caps["models"] if m["kind"] == "text")
        self.seq = 0
        self.post("/participant")
        self.space = self.post("/spaces", scope="room")["resource"]
        self.conversation = self.post(f"/spaces/{self.space}/conversations")["resource"]
        for t in tokens[1:]:
            with httpx.Client(base_url=base + BASE, timeout=120,
                              headers={"Authorization": f"Bearer {t}"}) as reader:
                r = reader.post("/participant", json=self.body(1, 1))
                assert r.status_code == 202, r.text
                par = reader.get("/participant").json()["participant"]
            self.post(f"/spaces/{self.space}/members", participant=par["id"],
                      permissions=["read"])

    def body(self, key: int, seq: int, **fields: Any) -> dict[str, Any]:
        return {"schema": SCHEMA, "lineage": self.lineage, "operation_key": f"{key:032x}",
                "sequence": str(seq), **fields}

    def post(self, path: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        r = self.http.post(path, json=self.body(self.seq, self.seq, **fields))
        assert r.status_code == 202, r.text
        out: dict[str, Any] = r.json()
        return out

    def input(self, k: int, tokens: int) -> tuple[float, float, str]:
        """(sent, answered, operation id) of one input."""
        sent = time.monotonic()
        rec = self.post(f"/conversations/{self.conversation}/inputs",
                        text=TEXT.format(k=k), model=self.model, max_output_tokens=tokens)
        return sent, time.monotonic(), rec["operation"]

    def wait_terminal(self, op: str, timeout: float = 300) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.http.get(f"/operations/{op}").json()["status"] not in ("admitted",
                                                                           "running"):
                return
            time.sleep(0.2)


# --------------------------------------------------------------------------- load process


async def follow(client: Any, url: str, token: str, rec: dict[str, Any],
                 opened: asyncio.Semaphore, ready: list[int]) -> None:
    """One SSE stream: records (cursor, arrival) per event; ends at end/dropped/error."""
    headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
    events: list[tuple[int, float]] = rec["events"]
    await opened.acquire()
    released = False
    try:
        async with client.stream("GET", url, headers=headers) as resp:
            opened.release()
            released = True
            if resp.status_code != 200:
                rec["failed"] = f"{resp.status_code} {(await resp.aread())[:200]!r}"
                return
            ready[0] += 1
            buf = b""
            async for chunk in resp.aiter_raw():
                t = time.monotonic()
                buf += chunk
                while True:
                    cut = buf.find(b"\n\n")
                    if cut < 0:
                        break
                    block, buf = buf[:cut], buf[cut + 2:]
                    kind = eid = b""
                    for line in block.split(b"\n"):
                        if line.startswith(b"event: "):
                            kind = line[7:]
                        elif line.startswith(b"id: "):
                            eid = line[4:]
                    if kind in (b"input", b"output"):
                        events.append((int(eid.rpartition(b"/")[2]), t))
                    elif kind == b"end":
                        rec["end"] = "end"
                        return
                    elif kind in (b"dropped", b"error"):
                        rec["end"] = kind.decode() + " " + block.decode(errors="replace")[-120:]
                        return
    except Exception as exc:   # a transport failure is a result here, not a crash
        rec["failed"] = f"{type(exc).__name__}: {exc}"
    finally:
        if not released:
            opened.release()


async def load(args: argparse.Namespace) -> None:
    import httpx

    tokens = args.tokens.split(",")
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)   # "go <path>"
    path = line.split(" ", 1)[1].strip()
    recs = [{"events": [], "end": None, "failed": None} for _ in range(args.count)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    ready = [0]
    async with httpx.AsyncClient(base_url=args.base + BASE, timeout=None,
                                 limits=limits) as client:
        opened = asyncio.Semaphore(32)     # open in waves: no SYN storm on the backlog
        tasks = [asyncio.create_task(follow(client, path, tokens[(args.first + i) % len(tokens)],
                                            recs[i], opened, ready))
                 for i in range(args.count)]
        while ready[0] + sum(1 for r in recs if r["failed"]) < args.count:
            await asyncio.sleep(0.05)
        print(f"ready {ready[0]} {time.monotonic()}", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)      # "stop"
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(recs), flush=True)


# --------------------------------------------------------------------------- one side


def main_thread_cpu(pid: int) -> float:
    """CPU seconds of the main thread of ``pid`` (the trio loop: HTTP, fanout, the
    executor's Python; the engine's steps run in worker threads)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu(pids: list[int]) -> tuple[float, float]:
    """(main threads, whole processes) CPU seconds of ``pids`` so far."""
    return sum(main_thread_cpu(p) for p in pids), sum(proc_cpu(p) for p in pids)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def run_side(mode: str, variant: str, args: argparse.Namespace,
             runtime: Path) -> dict[str, Any] | None:
    data = Path(tempfile.mkdtemp(prefix="aotx-bsse-", dir="/tmp"))
    port = free_port()
    bind = f"127.0.0.1:{port}"
    tokens = prepare(data, args.readers, runtime, bind, mode == "split")
    servers: list[subprocess.Popen[bytes]] = []
    loads: list[subprocess.Popen[str]] = []
    load_before = os.getloadavg()[0]
    try:
        if mode == "split":
            wrap = [] if args.stalls is None else [
                __file__, "--stall-wrap",
                str(args.stalls / f"{mode}-{variant}-{args.subscribers}-runtime.json")]
            if args.stalls is not None:
                args.stalls.mkdir(parents=True, exist_ok=True)
            boot = launch([*wrap, "-m", "aotx_trio", "boot",
                           "--ccir", str(data / "runtime.aotxccir"),
                           "--journal", str(data / "journal"), "--service-grants",
                           str(data / "grants")], data / "boot.log", "serving")
            if boot is None:
                return None
            servers.append(boot)
            cmd = ["-m", "aotx_trio", "gateway", "serve", "--config", str(data / "gateway.json")]
        else:
            cmd = ["-m", "aotx_trio", "serve", "--data", str(data), "--bind", bind]
        if args.profile is not None:       # the gateway (or aotx serve) under cProfile
            args.profile.mkdir(parents=True, exist_ok=True)
            cmd = ["-m", "cProfile", "-o", str(args.profile / f"{mode}-{variant}.prof"), *cmd]
        elif args.stalls is not None:      # the gateway (or aotx serve) with a trio Instrument
            args.stalls.mkdir(parents=True, exist_ok=True)
            cmd = [__file__, "--stall-wrap",
                   str(args.stalls / f"{mode}-{variant}-{args.subscribers}.json"), *cmd]
        gateway = launch(cmd, data / "serve.log", "listening on")
        if gateway is None:
            return None
        servers.insert(0, gateway)
        base = f"http://{bind}"
        owner = Owner(base, tokens)
        readers = ",".join(tokens[1:] or tokens[:1])
        procs = max(1, min(args.procs, args.subscribers))
        share = [args.subscribers // procs + (1 if i < args.subscribers % procs else 0)
                 for i in range(procs)]
        first = 0
        for count in share:
            loads.append(subprocess.Popen(
                [sys.executable, __file__, "--load", "--base", base, "--tokens", readers,
                 "--first", str(first), "--count", str(count)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += count
        sent: dict[int, tuple[float, float]] = {}
        op = None
        if variant == "conversation":
            path = f"/conversations/{owner.conversation}/events?stream=true"
        else:
            _, _, op = owner.input(0, args.op_tokens)
            path = f"/operations/{op}/events"
        for p in loads:
            assert p.stdin is not None
            p.stdin.write(f"go {path}\n")
            p.stdin.flush()
        opened = 0
        all_open = 0.0
        for p in loads:
            assert p.stdout is not None
            words = p.stdout.readline().split()
            if not words or words[0] != "ready":
                print("a load process failed", file=sys.stderr)
                return None
            opened += int(words[1])
            all_open = max(all_open, float(words[2]))
        pids = [x.pid for x in servers]
        cpu0 = cpu(pids)
        mains0 = [main_thread_cpu(x) for x in pids]
        load_cpu0 = sum(proc_cpu(x.pid) for x in loads)
        t0 = time.monotonic()
        if variant == "conversation":
            for k in range(1, args.events + 1):
                due = t0 + (k - 1) * args.interval
                time.sleep(max(0.0, due - time.monotonic()))
                s, a, _ = owner.input(k, args.gen_tokens)
                sent[k] = (s, a)
            time.sleep(args.drain)
        else:
            assert op is not None
            owner.wait_terminal(op)
            time.sleep(args.drain)
        wall = time.monotonic() - t0
        cpu1 = cpu(pids)
        mains = [round(main_thread_cpu(x) - c, 2) for x, c in zip(pids, mains0, strict=True)]
        load_cpu = sum(proc_cpu(x.pid) for x in loads) - load_cpu0
        server_cpu = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])
        recs: list[dict[str, Any]] = []
        for p in loads:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("stop\n")
            p.stdin.flush()
        for p in loads:
            assert p.stdout is not None
            recs += json.loads(p.stdout.readline())
            p.wait(timeout=60)
        load_after = os.getloadavg()[0]
        out = summarize(mode, variant, args, recs, sent, all_open, opened, wall,
                        load_before, load_after)
        out.update({"server_main_cpu_s": server_cpu[0], "server_cpu_s": server_cpu[1],
                    "main_cpu_s_by_server": mains,   # the gateway (or aotx serve) first
                    "load_cpu_s": load_cpu,
                    "main_cpu_us_per_delivery": server_cpu[0] / max(1, out["deliveries"]) * 1e6})
        return out
    finally:
        for p in loads:
            if p.poll() is None:
                p.kill()
                p.wait()
        for s in servers:
            stop(s)
        shutil.rmtree(data, ignore_errors=True)


def summarize(mode: str, variant: str, args: argparse.Namespace, recs: list[dict[str, Any]],
              sent: dict[int, tuple[float, float]], all_open: float, opened: int,
              wall: float, load_before: float, load_after: float) -> dict[str, Any]:
    lat: list[float] = []          # from the event's creation (see the module doc)
    lat_post: list[float] = []     # conversation: from the POST sent
    missed = 0
    # per subscriber, its events as (first byte or cursor, arrival); the earliest arrival
    # of each at any subscriber stands for its creation
    spans: list[list[tuple[int, float]]] = []
    first: dict[int, float] = {}
    for r in recs:
        prev = 0
        mine = []
        for nxt, t in r["events"]:
            lo = nxt if variant == "conversation" else prev
            mine.append((lo, t))
            for b in ([nxt] if variant == "conversation" else range(prev, nxt)):
                if t < first.get(b, float("inf")):
                    first[b] = t
            prev = nxt
        spans.append(mine)
    counted = {b for b, t in first.items() if t > all_open}
    for mine in spans:
        for lo, t in mine:
            if lo in counted:
                lat.append(t - first[lo])
                if lo in sent:
                    lat_post.append(t - sent[lo][0])
    if variant == "conversation":
        for r in recs:
            got = {c for c, _ in r["events"]}
            if r["end"] is None and r["failed"] is None:
                missed += sum(1 for k in sent if k not in got)
    worst: dict[int, float] = {}    # per event, its largest spread (--stalls: a timeline)
    for mine in spans:
        for lo, t in mine:
            if lo in counted:
                worst[lo] = max(worst.get(lo, 0.0), t - first[lo])
    events = len(counted)
    dropped = sum(1 for r in recs if r["end"] and r["end"] != "end")
    failed = sum(1 for r in recs if r["failed"])
    out = {"mode": mode, "variant": variant, "subscribers": args.subscribers,
           "opened": opened, "events": events, "deliveries": len(lat),
           "p50_ms": pct(lat, 0.5) * 1000, "p99_ms": pct(lat, 0.99) * 1000,
           "max_ms": max(lat, default=float("nan")) * 1000,
           "post_p50_ms": pct(lat_post, 0.5) * 1000 if lat_post else None,
           "post_p99_ms": pct(lat_post, 0.99) * 1000 if lat_post else None,
           "post_max_ms": max(lat_post) * 1000 if lat_post else None,
           "dropped": dropped, "failed": failed, "missed": missed, "wall_s": wall,
           "load": [round(load_before, 2), round(load_after, 2)],
           "ends": sorted({str(r["end"] or r["failed"])[:80] for r in recs
                           if (r["end"] and r["end"] != "end") or r["failed"]})[:3],
           "per_event": [[lo, round(first[lo], 3), round(worst[lo] * 1000, 1)]
                         for lo in sorted(worst)] if args.stalls is not None else None}
    return out


# --------------------------------------------------------------------------- stalls


STALL_MS = 5.0


def stall_wrap(out: str, argv: list[str]) -> None:
    """Run ``python -m argv...`` with a trio Instrument timing every task step of the
    first ``trio.run``: steps over :data:`STALL_MS` are counted per task name, and a
    watchdog thread samples the main thread's stack once per long step (where the loop
    is held).  The report (JSON) is written to ``out`` when the run ends."""
    import collections
    import runpy
    import threading
    import traceback

    import trio

    steps: dict[str, list[float]] = collections.defaultdict(list)
    stacks: collections.Counter[tuple[str, str]] = collections.Counter()
    state: dict[str, Any] = {"t0": 0.0, "task": "", "samples": 0}
    timeline: list[tuple[float, str, float, float]] = []
    cpu: dict[str, float] = {}
    main_id = threading.get_ident()

    class Stalls(trio.abc.Instrument):
        def before_task_step(self, task: Any) -> None:
            state["task"] = task.name
            state["samples"] = 0
            state["c0"] = time.thread_time()
            state["t0"] = time.perf_counter()

        def after_task_step(self, task: Any) -> None:
            dt = (time.perf_counter() - state["t0"]) * 1e3
            state["t0"] = 0.0
            if dt > STALL_MS:   # with the main thread's CPU time in it (the rest: off-CPU)
                cpu_ms = (time.thread_time() - state["c0"]) * 1e3
                steps[task.name].append(dt)
                cpu[task.name] = cpu.get(task.name, 0.0) + cpu_ms
                timeline.append((round(time.monotonic(), 3), task.name, round(dt, 1),
                                 round(cpu_ms, 1)))

        def after_run(self) -> None:
            write()

    def write() -> None:
        got = {n: sorted(v) for n, v in list(steps.items())}
        report = {"threshold_ms": STALL_MS,
                  "tasks": {n: {"count": len(v), "total_ms": round(sum(v), 1),
                                "cpu_ms": round(cpu.get(n, 0.0), 1),
                                "max_ms": round(v[-1], 1), "p50_ms": round(v[len(v) // 2], 1)}
                            for n, v in sorted(got.items(), key=lambda kv: -sum(kv[1]))},
                  "stacks": [{"task": t, "count": c, "stack": s}
                             for (t, s), c in stacks.most_common(40)],
                  "timeline": timeline[-400:],
                  "gc": {g: {"count": sum(1 for x in gcs if x[0] == g),
                             "total_ms": round(sum(x[1] for x in gcs if x[0] == g), 1),
                             "max_ms": max((x[1] for x in gcs if x[0] == g), default=0.0)}
                         for g in (0, 1, 2)},
                  "gc2": gcs and [x for x in gcs if x[0] == 2][-5:]}
        Path(out).write_text(json.dumps(report, indent=1))

    def watchdog() -> None:
        last = time.monotonic()
        while True:
            time.sleep(0.002)
            if time.monotonic() - last > 1.0:   # the process may be killed, not stopped
                last = time.monotonic()
                write()
            t0 = state["t0"]
            held = (time.perf_counter() - t0) * 1e3 if t0 else 0.0
            if held > STALL_MS * (1 + state["samples"]):   # one sample per 5 ms held
                state["samples"] += 1
                frame = sys._current_frames().get(main_id)
                if frame is not None:
                    lines = traceback.format_stack(frame)[-10:]
                    stacks[(state["task"], "".join(lines))] += 1

    import gc

    gcs: list[tuple[int, float, int]] = []    # (generation, ms, objects tracked after)
    gc_t0 = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        elif threading.get_ident() == main_id:
            gcs.append((info["generation"], round((time.perf_counter() - gc_t0[0]) * 1e3, 2),
                        len(gc.get_objects(info["generation"]))
                        if info["generation"] == 2 else 0))

    gc.callbacks.append(on_gc)
    knob = os.environ.get("BENCH_SSE_GC")      # experiment: "t0,t1,t2"
    if knob:
        gc.set_threshold(*[int(x) for x in knob.split(",")])
    real_run = trio.run
    installed = []

    def run(*a: Any, **kw: Any) -> Any:
        if not installed:
            installed.append(1)
            kw["instruments"] = [*kw.get("instruments", ()), Stalls()]
            threading.Thread(target=watchdog, daemon=True).start()
        return real_run(*a, **kw)

    trio.run = run  # type: ignore[assignment]
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


# --------------------------------------------------------------------------- main


def main() -> int:
    if len(sys.argv) > 3 and sys.argv[1] == "--stall-wrap":   # python -m wrapped
        stall_wrap(sys.argv[2], sys.argv[3:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--subscribers", default="500",
                    help="subscriber count, or counts (50,500: a same-run ratio)")
    ap.add_argument("--readers", type=int, default=5,
                    help="reader principals the subscribers' tokens cycle through")
    ap.add_argument("--procs", type=int, default=2, help="load processes")
    ap.add_argument("--modes", default="embedded,split")
    ap.add_argument("--variants", default="conversation,operation")
    ap.add_argument("--events", type=int, default=40, help="inputs posted (conversation)")
    ap.add_argument("--interval", type=float, default=0.25, help="seconds between inputs")
    ap.add_argument("--gen-tokens", type=int, default=16, help="output tokens per input")
    ap.add_argument("--op-tokens", type=int, default=512, help="output tokens (operation)")
    ap.add_argument("--drain", type=float, default=2.0, help="seconds after the last input")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--profile", type=Path, help="write the gateway's (aotx serve's) cProfile "
                    "data into this folder, one file per side")
    ap.add_argument("--stalls", type=Path, help="run the gateway (aotx serve) with a trio "
                    "Instrument naming the tasks whose steps hold the loop over 5 ms, with "
                    "sampled stacks; one JSON report per side in this folder")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "aotx-trio" / "bench")
    ap.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.load:
        asyncio.run(load(a))
        return 0
    runtime = cached_runtime(a.cache)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    if set(modes) - {"embedded", "split"} or set(variants) - {"conversation", "operation"}:
        ap.error("--modes takes embedded,split; --variants conversation,operation")
    print(f"machine: {machine()}")
    counts = [int(c) for c in a.subscribers.split(",") if c.strip()]
    if not counts or min(counts) < 1:
        ap.error("--subscribers takes positive counts: 500 or 50,500")
    print(f"{a.subscribers} subscribers in {a.procs} load processes, {a.readers} reader "
          f"principals; conversation: {a.events} inputs every {a.interval:g} s, "
          f"{a.gen_tokens} tokens each; operation: {a.op_tokens} tokens", flush=True)
    results = []
    sides = [(m, v, n) for m in modes for v in variants for n in counts]
    for r in range(a.rounds):   # interleaved, the order flipped every round
        for mode, variant, n in sides if r % 2 == 0 else sides[::-1]:
            out = run_side(mode, variant, argparse.Namespace(**{**vars(a), "subscribers": n}),
                           runtime)
            if out is None:
                return 1
            out["round"] = r
            results.append(out)
            print(f"  {mode} {variant} x{n}: spread p99 {out['p99_ms']:.1f} ms, POST p99 "
                  f"{out['post_p99_ms'] or float('nan'):.1f} ms, load "
                  f"{out['load'][0]:.2f}->{out['load'][1]:.2f}", flush=True)
    print(f"{'mode':<9} {'variant':<13} {'subs':>5} {'open':>5} {'events':>6} "
          f"{'deliv':>7} {'spread p50/p99/max ms':>22} {'POST->arrival p50/p99/max':>26} "
          f"{'drop':>5} {'fail':>5} {'miss':>5} {'main CPU s':>10} {'us/deliv':>8}  load")

    def trio_ms(a: float | None, b: float | None, c: float | None) -> str:
        return "-" if a is None or b is None or c is None else f"{a:.1f} / {b:.1f} / {c:.1f}"

    for o in results:
        print(f"{o['mode']:<9} {o['variant']:<13} {o['subscribers']:>5} {o['opened']:>5} "
              f"{o['events']:>6} {o['deliveries']:>7} "
              f"{trio_ms(o['p50_ms'], o['p99_ms'], o['max_ms']):>22} "
              f"{trio_ms(o['post_p50_ms'], o['post_p99_ms'], o['post_max_ms']):>26} "
              f"{o['dropped']:>5} {o['failed']:>5} {o['missed']:>5} "
              f"{o['server_main_cpu_s']:>10.2f} {o['main_cpu_us_per_delivery']:>8.1f}  "
              f"{o['load'][0]:.2f}->{o['load'][1]:.2f}")
        if o["ends"]:
            print(f"          ends: {o['ends']}")
        if len(o["main_cpu_s_by_server"]) > 1:
            print(f"          main CPU s: gateway {o['main_cpu_s_by_server'][0]}, runtime "
                  f"{o['main_cpu_s_by_server'][1]}")
    if len(counts) > 1:
        lo, hi = min(counts), max(counts)
        for r in range(a.rounds):
            for mode in modes:
                for variant in variants:
                    pick = {o["subscribers"]: o for o in results if o["round"] == r
                            and o["mode"] == mode and o["variant"] == variant}
                    if lo in pick and hi in pick and pick[lo]["p99_ms"] > 0:
                        a_, b_ = pick[lo], pick[hi]
                        print(f"ratio round {r} {mode} {variant}: spread p99 x{hi} / x{lo} "
                              f"= {b_['p99_ms']:.1f} / {a_['p99_ms']:.1f} = "
                              f"{b_['p99_ms'] / a_['p99_ms']:.2f}; main CPU per delivery "
                              f"{b_['main_cpu_us_per_delivery']:.0f} / "
                              f"{a_['main_cpu_us_per_delivery']:.0f} us")
    print("target: p99 < 100 ms with 500 subscribers")
    print(json.dumps({"machine": machine(), "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
