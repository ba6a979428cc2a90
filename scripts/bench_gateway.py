#!/usr/bin/env python3
"""Benchmark: durable shared mutations per second through a live ``aotx serve``,
side by side with the bare stack it is built on.

Two servers, one after the other in the same run, under the same load generator:

``aotx``  ``aotx serve`` (or ``--split``: ``aotx boot`` + ``aotx gateway serve``) on a
          free loopback port over a fresh data folder whose gateway.json names one
          principal per client.  Each client registers, creates its own private
          space, then loops ``member.set`` on it (an explicit row for itself with
          every right), retiring its receipts every ``--retire-every`` mutations so
          the fixed receipt table never fills.  Every counted mutation was answered
          202, i.e. after its admission record was fsynced.
``bare``  the stack's own ceiling: hypercorn (the gateway's own hypercorn settings,
          trio worker) + a quart-trio app whose one POST route appends the request
          body to a file, group-committed: one task writes every body that arrived
          during the previous fsync with one ``write`` and one ``fsync`` (in a worker
          thread, as the journal does), then all their requests answer 202.  No
          auth, no parsing, no state.  The clients send the same bodies as above.

The table at the end puts both side by side (durable mutations/s, p50/p99
latency, server CPU per mutation) with the ratio aotx/bare; the header names the
CPU model and its AVX2/AVX-512 flags as the kernel reports them.

Phases of each side (one clock for all processes, ``time.monotonic``)::

    setup     (aotx) every client registers and creates its space (not measured)
    warm-up   ``--warmup`` seconds of load, not counted
    window    ``--seconds`` of load: a request is counted when it completes in the
              window; CPU seconds of the server, the load processes and the
              whole machine are read from /proc at the window's two ends
    drain     the in-flight requests finish, nothing new is sent

Each client also stops after ``--max-requests`` requests.  The load processes
speak HTTP/1.1 over keep-alive TCP connections with a minimal asyncio client
(one connection per client), so that the load costs the 2-core machine as
little CPU as possible; the servers see ordinary requests.

Prints a table per side, the side-by-side table and one JSON line.  Targets:
>= 1000 durable mutations/s with 32 clients, p99 < 50 ms, aotx/bare >= 1.  Not a
test: nothing here asserts on speed.

    .venv/bin/python scripts/bench_gateway.py [--clients 32] [--procs 2] [--seconds 10]
        [--warmup 2] [--rounds 1] [--sides aotx,bare] [--runtime FILE] [--split]

The runtime file is packed from the default models once and cached in
``--cache`` (default ~/.cache/aotx-trio/bench); each run hard-links it into
its fresh data folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aotx_trio.config import GatewayConfig, write_gateway_config  # noqa: E402
from aotx_trio.gateway.auth import hash_token  # noqa: E402
from aotx_trio.vocab import principal_key  # noqa: E402

BASE = "/aotx/v1/shared"
BARE_PATH = "/bare/mutations"   # the bare server's one POST route
SCHEMA = "aotx.shared.mutation.v1"
ALL = ["shared_read", "shared_write", "shared_manage"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- /proc


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) of process ``pid`` so far."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text.rpartition(")")[2].split()
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def thread_cpu(pid: int, tid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of thread ``tid`` of process ``pid`` so far."""
    text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = text.rpartition(")")[2].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def thread_switches(pid: int, tid: int) -> int:
    """Context switches (voluntary + not) of thread ``tid`` of process ``pid`` so far."""
    n = 0
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.endswith("ctxt_switches:") or "ctxt_switches:" in line:
            n += int(line.split()[1])
    return n


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat)."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(x) for x in parts[:8]]
    total = sum(vals)
    idle = vals[3] + vals[4]
    return (total - idle) / CLK_TCK, total / CLK_TCK


# --------------------------------------------------------------------------- setup


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def cached_runtime(cache: Path) -> Path:
    """The default-model runtime file, packed once into ``cache``."""
    target = cache / "runtime.aotxccir"
    if not target.exists():
        from aotx_trio.serve import ensure_runtime

        cache.mkdir(parents=True, exist_ok=True)
        ensure_runtime(cache)
    return target


def prepare(data: Path, clients: int, runtime: Path, bind: str, split: bool) -> list[str]:
    """The data folder: runtime file, gateway.json (one principal per client) and, for
    the split deployment, the grant file and the service socket path."""
    data.mkdir(parents=True, exist_ok=True)
    try:
        os.link(runtime, data / "runtime.aotxccir")
    except OSError:
        shutil.copy(runtime, data / "runtime.aotxccir")
    tokens = [f"bench-token-{i}-{os.urandom(8).hex()}" for i in range(clients)]
    cfg = GatewayConfig.model_validate({
        "bind": bind,
        "service_socket": str(data / "journal" / "service.sock") if split else None,
        "principals": [{"name": f"bench-{i}", "token_sha256": hash_token(t), "actions": ALL}
                       for i, t in enumerate(tokens)]})
    write_gateway_config(data / "gateway.json", cfg)
    if split:
        from aotx_trio.grants import write_grants

        write_grants(cfg, data / "grants")
    return tokens


# --------------------------------------------------------------------------- bare server


def bare_app(data: Path) -> Any:
    """The bare stack's app: quart-trio, one POST route, group commit to ``data/bodies``
    (one write + fsync per tick); also scripts/bench_mutation_path.py's."""
    import trio
    from quart import Response, request
    from quart_trio import QuartTrio

    app = QuartTrio("bare", static_folder=None)
    app.config["PROVIDE_AUTOMATIC_OPTIONS"] = False
    fd = os.open(data / "bodies", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pending: list[bytes] = []
    tick = {"saved": trio.Event(), "wake": trio.Event()}
    written = 0

    def write_and_fsync(blob: bytes) -> None:
        view = memoryview(blob)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)

    async def committer(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                        ) -> None:
        nonlocal pending, written
        task_status.started()
        while True:
            await tick["wake"].wait()
            batch, saved = pending, tick["saved"]
            pending = []
            tick["saved"], tick["wake"] = trio.Event(), trio.Event()
            blob = b"".join(batch)
            await trio.to_thread.run_sync(write_and_fsync, blob)
            written += len(blob)
            saved.set()

    @app.before_serving
    async def _start() -> None:
        await app.nursery.start(committer)

    @app.post(BARE_PATH)
    async def mutate() -> Response:
        body = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        pending.append(body + b"\n")
        saved = tick["saved"]
        tick["wake"].set()
        await saved.wait()
        return Response(json.dumps({"saved": True, "bytes": written}), status=202,
                        content_type="application/json",
                        headers={"Cache-Control": "no-store"})

    return app


def bare_server(data: Path, bind: str) -> int:
    """hypercorn + quart-trio, one POST route, group commit to ``data/bodies``."""
    import trio
    from hypercorn.trio import serve

    from aotx_trio.gateway.serve import hypercorn_config, on_signal
    from aotx_trio.serve import SWITCH_INTERVAL_S

    app = bare_app(data)
    cfg = GatewayConfig.model_validate({"bind": bind, "principals": []})

    async def main() -> None:
        shutdown = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(on_signal, shutdown)
            binds = await nursery.start(partial(serve, app, hypercorn_config(cfg, app),
                                                shutdown_trigger=shutdown.wait))
            print(f"bare: listening on {' '.join(binds)}", flush=True)

    sys.setswitchinterval(SWITCH_INTERVAL_S)   # as aotx serve does (same fsync thread)
    trio.run(main)
    return 0


# --------------------------------------------------------------------------- load process


class Conn:
    """One keep-alive HTTP/1.1 connection (requests one at a time); reopened when the
    server answers ``Connection: close`` (hypercorn does after keep_alive_max_requests)."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.auth = f"Authorization: Bearer {token}\r\n".encode()
        self.opened = 0

    async def request(self, method: str, path: str,
                      body: dict[str, Any] | None = None) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            self.opened += 1
        assert self.reader is not None
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: bench\r\n").encode() + self.auth
        if body is not None:
            head += (f"Content-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n").encode()
        self.writer.write(head + b"\r\n" + payload)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection" and value.strip().lower() == b"close":
                close = True
        data = await self.reader.readexactly(length) if length else b""
        if close:
            self.close()
        return status, json.loads(data) if data else None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class Client:
    def __init__(self, conn: Conn, index: int, lineage: str, bare: bool = False) -> None:
        self.conn = conn
        self.bare = bare
        self.i = index
        self.lineage = lineage
        self.seq = 1
        self.me = f"par-{lineage}-{principal_key(f'bench-{index}')}"
        self.space = ""
        # (completed at, latency, status code or error code)
        self.samples: list[tuple[float, float, str]] = []

    def body(self, **fields: Any) -> dict[str, Any]:
        key = (self.i + 1) << 64 | self.seq
        return {"schema": SCHEMA, "lineage": self.lineage, "operation_key": f"{key:032x}",
                "sequence": str(self.seq), **fields}

    async def mutate(self, path: str, **fields: Any) -> Any:
        t0 = time.monotonic()
        status, out = await self.conn.request("POST", BARE_PATH if self.bare else BASE + path,
                                              self.body(**fields))
        t1 = time.monotonic()
        if status == 202:
            self.seq += 1
            self.samples.append((t1, t1 - t0, "202"))
            return out
        code = (out or {}).get("error", {}).get("code", str(status))
        self.samples.append((t1, t1 - t0, f"{status} {code}"))
        return None


async def load(host: str, port: int, tokens: list[str], first: int, retire_every: int,
               max_requests: int, bare: bool) -> dict[str, Any]:
    conns = [Conn(host, port, t) for t in tokens]
    if bare:   # nothing to set up: the same bodies, to the one route
        clients = [Client(c, first + i, "0" * 32, bare=True) for i, c in enumerate(conns)]
        for c in clients:
            c.space = f"spc-{c.lineage}-{c.i + 1:032x}"
    else:
        status, caps = await conns[0].request("GET", BASE + "/capabilities")
        assert status == 200, caps
        lineage = caps["lineage"]
        clients = [Client(c, first + i, lineage) for i, c in enumerate(conns)]
        await asyncio.gather(*(c.mutate("/participant") for c in clients))

        async def make_space(c: Client) -> None:
            receipt = await c.mutate("/spaces")
            assert receipt is not None, c.samples[-1]
            c.space = receipt["resource"]

        await asyncio.gather(*(make_space(c) for c in clients))
    for c in clients:
        c.samples.clear()
    # ready: wait for the coordinator's start line (one clock for every process)
    print("ready", flush=True)
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    go = json.loads(line)
    await asyncio.sleep(max(0.0, go["start"] - time.monotonic()))
    end = go["end"]

    capped = 0

    async def loop(c: Client) -> None:
        nonlocal capped
        k = 0
        while time.monotonic() < end:
            if k >= max_requests:
                capped += 1
                return
            k += 1
            if k % retire_every == 0:
                await c.mutate("/participant/retirements", retry_floor=str(c.seq))
                continue
            # an explicit row for the owner itself, with every right: always allowed
            await c.mutate(f"/spaces/{c.space}/members", participant=c.me,
                           permissions=["read", "write", "manage"])

    await asyncio.gather(*(loop(c) for c in clients))
    for conn in conns:
        conn.close()
    return {"samples": [s for c in clients for s in c.samples],
            "connections": sum(conn.opened for conn in conns), "capped": capped}


def worker(args: argparse.Namespace) -> int:
    tokens = Path(args.tokens_file).read_text().split()[args.first:args.first + args.count]
    host, _, port = args.base.rpartition(":")
    out = asyncio.run(load(host, int(port), tokens, args.first, args.retire_every,
                           args.max_requests, args.bare))
    print(json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------- report

SIDE_NAMES = {"embedded": "aotx serve", "split": "aotx boot + aotx gateway serve",
              "bare": "bare hypercorn + quart-trio (append + group-commit fsync)"}


def machine() -> str:
    """CPU model, logical CPUs, kernel release, the AVX flags the kernel reports and
    the kernel path the native library picked (``aotx_cpu_features``)."""
    model, flags = "unknown CPU", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    avx = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                       "avx512_bf16") if f in flags]
    return (f"{model}, {os.cpu_count()} logical CPUs, linux {os.uname().release}, "
            f"cpu flags: {' '.join(avx) or 'no avx2/avx512'}, "
            f"aotx kernel path: {kernel_path()}")


def kernel_path() -> str:
    """The native library's run-time CPU features (csrc/aotx.h, aotx_cpu_features)."""
    try:
        from aotx_trio._native import lib
    except ImportError:
        return "native library not built"
    bits = int(lib.aotx_cpu_features())
    names = [n for i, n in enumerate(("avx2+fma", "avx512f/bw/vl", "avx512-vnni", "avx-vnni",
                                      "f16c")) if bits >> i & 1]
    return "+".join(names) if names else "scalar"


def median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def side_by_side(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """The comparison table (medians over the rounds; every round's value listed)."""
    a, b = results.get("aotx", []), results.get("bare", [])

    def cell(rows: list[dict[str, Any]], key: str) -> str:
        vals = [r[key] for r in rows if r.get(key) is not None]
        if not vals:
            return "-"
        m = median(vals)
        return f"{m:,.3f}" if abs(m) < 10 else f"{m:,.1f}"   # ms/mutation: 3 decimals

    def ratio(key: str) -> float | None:
        va = [r[key] for r in a if r.get(key) is not None]
        vb = [r[key] for r in b if r.get(key) is not None]
        if not va or not vb or not median(vb):
            return None
        return round(median(va) / median(vb), 2)

    rows = [("durable mutations/s", "per_second"), ("p50 latency ms", "p50_ms"),
            ("p99 latency ms", "p99_ms"), ("server CPU ms/mutation", "cpu_ms_per_mutation"),
            ("main thread CPU ms/mutation", "main_thread_ms_per_mutation"),
            ("other processes (cores)", "other_cores")]
    name_a = SIDE_NAMES[a[0]["deployment"]] if a else "aotx"
    print(f"side by side (medians of {len(a)} + {len(b)} runs, interleaved):")
    head = ("", "aotx", "bare", "aotx/bare")
    table: list[tuple[str, str, str, str]] = [head]
    for label, key in rows:
        q = ratio(key)
        table.append((label, cell(a, key), cell(b, key), "-" if q is None else f"{q:.2f}x"))
    widths = [max(len(line[i]) for line in table) for i in range(4)]
    for line in table:
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(line, widths, strict=True))))
    for side, runs in (("aotx", a), ("bare", b)):
        print(f"  {side} mutations/s per round: "
              + " / ".join(f"{r['per_second']:,.1f}" for r in runs))
    print(f"  aotx = {name_a}; bare = {SIDE_NAMES['bare']}")
    return {key: ratio(key) for _, key in rows}


def pct(lat: list[float], q: float) -> float:
    return lat[min(len(lat) - 1, int(len(lat) * q))] * 1000 if lat else float("nan")


def ms(lat: list[float], q: float) -> float | None:
    return round(pct(lat, q), 2) if lat else None


def report(side: str, samples: list[tuple[float, float, str]], t_from: float, t_to: float,
           cpu: dict[str, float], connections: int, capped: int, args: argparse.Namespace,
           ) -> dict[str, Any]:
    window = [s for s in samples if t_from <= s[0] <= t_to]
    ok = sorted(s[1] for s in window if s[2] == "202")
    errs: dict[str, int] = {}
    for s in window:
        if s[2] != "202":
            errs[s[2]] = errs.get(s[2], 0) + 1
    span = t_to - t_from
    deployment = "bare" if side == "bare" else "split" if args.split else "embedded"
    out = {"side": side, "deployment": deployment, "clients": args.clients,
           "procs": args.procs, "window_s": round(span, 2),
           "durable_mutations": len(ok), "per_second": round(len(ok) / span, 1),
           "p50_ms": ms(ok, 0.50), "p90_ms": ms(ok, 0.90), "p99_ms": ms(ok, 0.99),
           "max_ms": round(ok[-1] * 1000, 2) if ok else None,
           "errors": errs, "connections": connections, "capped_clients": capped,
           "cpu_s": {k: round(v, 2) for k, v in cpu.items()},
           "cpu_ms_per_mutation": round(1e3 * cpu["server"] / max(1, len(ok)), 3),
           "main_thread_ms_per_mutation": round(1e3 * cpu["main_thread"] / max(1, len(ok)),
                                                3),
           "other_cores": round(cpu["other"] / span, 2)}
    rows = [
        ("durable mutations (202)", f"{len(ok)}"),
        ("window", f"{span:.2f} s (after {args.warmup:g} s warm-up)"),
        ("mutations/s", f"{len(ok) / span:.0f}   (target >= 1000)"),
        ("p50 / p90 / p99 latency", f"{pct(ok, .5):.1f} / {pct(ok, .9):.1f} / "
                                    f"{pct(ok, .99):.1f} ms   (p99 target < 50)"),
        ("errors (in the window)", ", ".join(f"{k}: {v}" for k, v in errs.items()) or "0"),
        ("connections opened", f"{connections} (whole run)"),
        ("clients stopped by --max-requests", f"{capped} (before the window's end)"),
        ("server CPU", f"{cpu['server']:.2f} s = {cpu['server'] / span:.2f} cores, "
                       f"{1e3 * cpu['server'] / max(1, len(ok)):.2f} ms/mutation"),
        ("  of which its main thread", f"{cpu['main_thread']:.2f} s = "
                                       f"{cpu['main_thread'] / span:.2f} cores, "
                                       f"{1e3 * cpu['main_thread'] / max(1, len(ok)):.3f} "
                                       "ms/mutation, of which system "
                                       f"{1e3 * cpu['main_thread_system'] / max(1, len(ok)):.3f}"),
        ("  its context switches", f"{cpu['main_thread_switches'] / span:,.0f}/s = "
                                   f"{cpu['main_thread_switches'] / max(1, len(ok)):.2f} "
                                   "per mutation"),
        *([("  of which gateway", f"{cpu['gateway']:.2f} s"),
           ("  of which runtime", f"{cpu['runtime']:.2f} s")] if "gateway" in cpu else []),
        ("load generator CPU", f"{cpu['load']:.2f} s = {cpu['load'] / span:.2f} cores"),
        ("other processes CPU", f"{cpu['other']:.2f} s = {cpu['other'] / span:.2f} cores"),
        ("machine idle", f"{cpu['idle']:.2f} s = {cpu['idle'] / span:.2f} cores"),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{SIDE_NAMES[deployment]}, {args.clients} clients in {args.procs} load processes")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return out


# --------------------------------------------------------------------------- main


def spy_file(name: str, side: str) -> str:
    """Where ``--py-spy NAME`` records ``side``: NAME for aotx, NAME with ``.bare`` before
    its suffix for the bare server (``a.txt`` -> ``a.bare.txt``)."""
    if side != "bare":
        return name
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.bare.{ext}" if dot else f"{name}.bare"


def launch(cmd: list[str], log: Path, ready: str) -> subprocess.Popen[bytes] | None:
    """Start ``python cmd...`` with output to ``log``; the process once ``ready`` appears
    in its log, None (log printed) if it exits or takes over a minute."""
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, *cmd], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        if ready in log.read_text():
            return proc
        time.sleep(0.1)
    print(log.read_text(), "server did not start", file=sys.stderr)
    stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--procs", type=int, default=2,
                    help="load processes (the clients are spread over them)")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured window")
    ap.add_argument("--warmup", type=float, default=2.0, help="uncounted load first")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each side, interleaved (aotx, bare, bare, aotx, ...)")
    ap.add_argument("--sides", default="aotx,bare",
                    help="which servers to run: aotx, bare or both (default)")
    ap.add_argument("--max-requests", type=int, default=1_000_000,
                    help="per client, warm-up included")
    ap.add_argument("--retire-every", type=int, default=16)
    ap.add_argument("--runtime", type=Path, help="runtime file to use (default: the cached "
                    "pack of the default models)")
    ap.add_argument("--cache", type=Path,
                    default=Path.home() / ".cache" / "aotx-trio" / "bench")
    ap.add_argument("--py-spy", metavar="SVG", help="record the aotx server with py-spy "
                    "during the window, and the bare one into SVG with .bare before its "
                    "suffix (the profiler costs CPU: do not quote its numbers)")
    ap.add_argument("--py-spy-args", default="", help="more py-spy record arguments "
                    "(e.g. '--gil --rate 250')")
    ap.add_argument("--keep", action="store_true", help="keep the data folders")
    ap.add_argument("--server-script", help="run this script (same --data/--bind arguments) "
                    "instead of 'aotx serve' (an instrumented server)")
    ap.add_argument("--split", action="store_true", help="the split deployment: 'aotx boot' "
                    "+ 'aotx gateway serve' over the service socket, instead of 'aotx serve'")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--bind", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--tokens-file", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.bare_server:
        return bare_server(args.data, args.bind)
    sides = [x.strip() for x in args.sides.split(",") if x.strip()]
    if not sides or set(sides) - {"aotx", "bare"}:
        ap.error("--sides takes aotx, bare or aotx,bare")
    runtime = (args.runtime or cached_runtime(args.cache)) if "aotx" in sides else None
    print(f"machine: {machine()}")
    print(f"load: {args.clients} clients in {args.procs} load processes, "
          f"{args.seconds:g} s window after {args.warmup:g} s warm-up, "
          f"{args.rounds} round(s)", flush=True)
    results: dict[str, list[dict[str, Any]]] = {}
    for k in range(args.rounds):   # interleaved, the order flipped every round
        for side in sides if k % 2 == 0 else sides[::-1]:
            out = run_side(side, args, runtime)
            if out is None:
                return 1
            results.setdefault(side, []).append(out)
    ratios = side_by_side(results) if len(sides) == 2 else {}
    print(json.dumps({"machine": machine(), "runs": results, "ratio_aotx_over_bare": ratios}))
    return 0


def run_side(side: str, args: argparse.Namespace, runtime: Path | None,
             ) -> dict[str, Any] | None:
    """Start one side's server(s), load it, report; None (after a message) on failure."""
    data = Path(tempfile.mkdtemp(prefix=f"aotx-bench-{side}-"))
    port = free_port()
    bind = f"127.0.0.1:{port}"
    bare = side == "bare"
    if bare:
        tokens = [f"bench-token-{i}" for i in range(args.clients)]
    else:
        assert runtime is not None
        tokens = prepare(data, args.clients, runtime, bind, args.split)
    servers: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[str]] = []
    try:
        if bare:
            cmd = [__file__, "--bare-server", "--data", str(data), "--bind", bind]
        elif args.split:
            boot = launch(["-m", "aotx_trio", "boot", "--ccir", str(data / "runtime.aotxccir"),
                          "--journal", str(data / "journal"), "--service-grants",
                          str(data / "grants")], data / "boot.log", "serving")
            if boot is None:
                return None
            servers.append(boot)
            cmd = ["-m", "aotx_trio", "gateway", "serve", "--config", str(data / "gateway.json")]
        elif args.server_script:
            cmd = [args.server_script, "--data", str(data), "--bind", bind]
        else:
            cmd = ["-m", "aotx_trio", "serve", "--data", str(data), "--bind", bind]
        gateway = launch(cmd, data / "serve.log", "listening on")
        if gateway is None:
            return None
        servers.insert(0, gateway)
        tokens_file = data / "tokens"
        tokens_file.write_text("\n".join(tokens))
        procs = max(1, min(args.procs, args.clients))
        args.procs = procs
        share = [args.clients // procs + (1 if i < args.clients % procs else 0)
                 for i in range(procs)]
        first = 0
        for count in share:
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--base", f"127.0.0.1:{port}",
                 "--tokens-file", str(tokens_file), "--first", str(first), "--count",
                 str(count), "--retire-every", str(args.retire_every),
                 "--max-requests", str(args.max_requests), *(["--bare"] if bare else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += count
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                print("a load process failed during setup", file=sys.stderr)
                return None
        start = time.monotonic() + 0.2
        t_from = start + args.warmup
        t_to = t_from + args.seconds
        go = json.dumps({"start": start, "end": t_to}) + "\n"
        for w in workers:
            assert w.stdin is not None
            w.stdin.write(go)
            w.stdin.flush()
        time.sleep(max(0.0, t_from - time.monotonic()))
        spy = None
        if args.py_spy:
            raw = ["--format", "raw"] if args.py_spy.endswith(".txt") else []  # folded stacks
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record",
                                    "-o", spy_file(args.py_spy, side), "--pid",
                                    str(gateway.pid), "-d",
                                    str(int(args.seconds)), "--nonblocking", *raw,
                                    *args.py_spy_args.split()])
        main0 = thread_cpu(gateway.pid, gateway.pid)   # the server's trio thread
        switches0 = thread_switches(gateway.pid, gateway.pid)
        c0 = ([proc_cpu(p.pid) for p in servers], sum(proc_cpu(w.pid) for w in workers),
              *machine_cpu())
        time.sleep(max(0.0, t_to - time.monotonic()))
        c1 = ([proc_cpu(p.pid) for p in servers], sum(proc_cpu(w.pid) for w in workers),
              *machine_cpu())
        main1 = thread_cpu(gateway.pid, gateway.pid)
        switches = thread_switches(gateway.pid, gateway.pid) - switches0
        each = [b - a for a, b in zip(c0[0], c1[0], strict=True)]
        server, load_cpu = sum(each), c1[1] - c0[1]
        busy, total = c1[2] - c0[2], c1[3] - c0[3]
        cpu = {"server": server, "load": load_cpu, "other": max(0.0, busy - server - load_cpu),
               "idle": total - busy, "main_thread": sum(main1) - sum(main0),
               "main_thread_system": main1[1] - main0[1], "main_thread_switches": switches}
        if args.split and not bare:
            cpu["gateway"], cpu["runtime"] = each
        samples: list[tuple[float, float, str]] = []
        connections = capped = 0
        for w in workers:
            text, _ = w.communicate(timeout=300)
            if w.returncode != 0:
                print(f"a load process failed ({w.returncode})", file=sys.stderr)
                return None
            result = json.loads(text.strip().splitlines()[-1])
            samples += [tuple(s) for s in result["samples"]]
            connections += int(result["connections"])
            capped += int(result["capped"])
        if spy is not None:
            spy.wait(timeout=120)
        return report(side, samples, t_from, t_to, cpu, connections, capped, args)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for proc in servers:   # the gateway first, then the runtime
            stop(proc)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
