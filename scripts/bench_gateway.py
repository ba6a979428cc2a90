#!/usr/bin/env python3
"""Benchmark: durable shared mutations per second through a live ``aotx serve``.

Starts ``aotx serve`` on a free loopback port over a fresh data folder whose
gateway.json names one principal per client, then runs ``--clients`` (default
32) concurrent clients spread over ``--procs`` (default 2) load processes.
Each client registers, creates its own private space, then loops
``member.set`` on it (an explicit row for itself with every right), retiring
its receipts every ``--retire-every`` mutations so the fixed receipt table
never fills.  Every counted mutation was answered 202, i.e. after its
admission record was fsynced.

Phases (one clock for all processes, ``time.monotonic``)::

    setup     every client registers and creates its space (not measured)
    warm-up   ``--warmup`` seconds of load, not counted
    window    ``--seconds`` of load: a request is counted when it completes in the
              window; CPU seconds of the server, the load processes and the
              whole machine are read from /proc at the window's two ends
    drain     the in-flight requests finish, nothing new is sent

Each client also stops after ``--max-requests`` requests.  The load processes
speak HTTP/1.1 over keep-alive TCP connections with a minimal asyncio client
(one connection per client), so that the load costs the 2-core machine as
little CPU as possible; the server sees ordinary requests.

Prints a table and one JSON line.  Targets: >= 1000 durable mutations/s with
32 clients, p99 < 50 ms.  Not a test: nothing here asserts on speed.

    .venv/bin/python scripts/bench_gateway.py [--clients 32] [--procs 2] [--seconds 10]
        [--warmup 2] [--runtime FILE] [--py-spy OUT.svg]

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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aotx_trio.config import GatewayConfig, write_gateway_config  # noqa: E402
from aotx_trio.gateway.auth import hash_token  # noqa: E402
from aotx_trio.vocab import principal_key  # noqa: E402

BASE = "/aotx/v1/shared"
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
    def __init__(self, conn: Conn, index: int, lineage: str) -> None:
        self.conn = conn
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
        status, out = await self.conn.request("POST", BASE + path, self.body(**fields))
        t1 = time.monotonic()
        if status == 202:
            self.seq += 1
            self.samples.append((t1, t1 - t0, "202"))
            return out
        code = (out or {}).get("error", {}).get("code", str(status))
        self.samples.append((t1, t1 - t0, f"{status} {code}"))
        return None


async def load(host: str, port: int, tokens: list[str], first: int, retire_every: int,
               max_requests: int) -> dict[str, Any]:
    conns = [Conn(host, port, t) for t in tokens]
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
                           args.max_requests))
    print(json.dumps(out), flush=True)
    return 0


# --------------------------------------------------------------------------- report


def pct(lat: list[float], q: float) -> float:
    return lat[min(len(lat) - 1, int(len(lat) * q))] * 1000 if lat else float("nan")


def ms(lat: list[float], q: float) -> float | None:
    return round(pct(lat, q), 2) if lat else None


def report(samples: list[tuple[float, float, str]], t_from: float, t_to: float,
           cpu: dict[str, float], connections: int, capped: int, args: argparse.Namespace,
           ) -> dict[str, Any]:
    window = [s for s in samples if t_from <= s[0] <= t_to]
    ok = sorted(s[1] for s in window if s[2] == "202")
    errs: dict[str, int] = {}
    for s in window:
        if s[2] != "202":
            errs[s[2]] = errs.get(s[2], 0) + 1
    span = t_to - t_from
    out = {"deployment": "split" if args.split else "embedded", "clients": args.clients,
           "procs": args.procs, "window_s": round(span, 2),
           "durable_mutations": len(ok), "per_second": round(len(ok) / span, 1),
           "p50_ms": ms(ok, 0.50), "p90_ms": ms(ok, 0.90), "p99_ms": ms(ok, 0.99),
           "max_ms": round(ok[-1] * 1000, 2) if ok else None,
           "errors": errs, "connections": connections, "capped_clients": capped,
           "cpu_s": {k: round(v, 2) for k, v in cpu.items()}}
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
        *([("  of which gateway", f"{cpu['gateway']:.2f} s"),
           ("  of which runtime", f"{cpu['runtime']:.2f} s")] if "gateway" in cpu else []),
        ("load generator CPU", f"{cpu['load']:.2f} s = {cpu['load'] / span:.2f} cores"),
        ("other processes CPU", f"{cpu['other']:.2f} s = {cpu['other'] / span:.2f} cores"),
        ("machine idle", f"{cpu['idle']:.2f} s = {cpu['idle'] / span:.2f} cores"),
    ]
    width = max(len(r[0]) for r in rows)
    what = "aotx boot + aotx gateway serve" if args.split else "aotx serve"
    print(f"{what}, {args.clients} clients in {args.procs} load processes")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return out


# --------------------------------------------------------------------------- main


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
    ap.add_argument("--max-requests", type=int, default=1_000_000,
                    help="per client, warm-up included")
    ap.add_argument("--retire-every", type=int, default=16)
    ap.add_argument("--runtime", type=Path, help="runtime file to use (default: the cached "
                    "pack of the default models)")
    ap.add_argument("--cache", type=Path,
                    default=Path.home() / ".cache" / "aotx-trio" / "bench")
    ap.add_argument("--py-spy", metavar="SVG", help="record the server with py-spy during "
                    "the window (the profiler costs CPU: do not quote its numbers)")
    ap.add_argument("--keep", action="store_true", help="keep the data folder")
    ap.add_argument("--server-script", help="run this script (same --data/--bind arguments) "
                    "instead of 'aotx serve' (an instrumented server)")
    ap.add_argument("--split", action="store_true", help="the split deployment: 'aotx boot' "
                    "+ 'aotx gateway serve' over the service socket, instead of 'aotx serve'")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--tokens-file", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    runtime = args.runtime or cached_runtime(args.cache)
    data = Path(tempfile.mkdtemp(prefix="aotx-bench-"))
    port = free_port()
    bind = f"127.0.0.1:{port}"
    tokens = prepare(data, args.clients, runtime, bind, args.split)
    servers: list[subprocess.Popen[bytes]] = []
    workers: list[subprocess.Popen[str]] = []
    try:
        if args.split:
            boot = launch(["-m", "aotx_trio", "boot", "--ccir", str(data / "runtime.aotxccir"),
                          "--journal", str(data / "journal"), "--service-grants",
                          str(data / "grants")], data / "boot.log", "serving")
            if boot is None:
                return 1
            servers.append(boot)
            cmd = ["-m", "aotx_trio", "gateway", "serve", "--config", str(data / "gateway.json")]
        elif args.server_script:
            cmd = [args.server_script, "--data", str(data), "--bind", bind]
        else:
            cmd = ["-m", "aotx_trio", "serve", "--data", str(data), "--bind", bind]
        gateway = launch(cmd, data / "serve.log", "listening on")
        if gateway is None:
            return 1
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
                 "--max-requests", str(args.max_requests)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            first += count
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                print("a load process failed during setup", file=sys.stderr)
                return 1
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
                                    "-o", args.py_spy, "--pid", str(gateway.pid), "-d",
                                    str(int(args.seconds)), "--nonblocking", *raw])
        c0 = ([proc_cpu(p.pid) for p in servers], sum(proc_cpu(w.pid) for w in workers),
              *machine_cpu())
        time.sleep(max(0.0, t_to - time.monotonic()))
        c1 = ([proc_cpu(p.pid) for p in servers], sum(proc_cpu(w.pid) for w in workers),
              *machine_cpu())
        each = [b - a for a, b in zip(c0[0], c1[0], strict=True)]
        server, load_cpu = sum(each), c1[1] - c0[1]
        busy, total = c1[2] - c0[2], c1[3] - c0[3]
        cpu = {"server": server, "load": load_cpu, "other": max(0.0, busy - server - load_cpu),
               "idle": total - busy}
        if args.split:
            cpu["gateway"], cpu["runtime"] = each
        samples: list[tuple[float, float, str]] = []
        connections = capped = 0
        for w in workers:
            text, _ = w.communicate(timeout=300)
            if w.returncode != 0:
                print(f"a load process failed ({w.returncode})", file=sys.stderr)
                return 1
            result = json.loads(text.strip().splitlines()[-1])
            samples += [tuple(s) for s in result["samples"]]
            connections += int(result["connections"])
            capped += int(result["capped"])
        if spy is not None:
            spy.wait(timeout=120)
        print(json.dumps(report(samples, t_from, t_to, cpu, connections, capped, args)))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
        for proc in servers:   # the gateway first, then the runtime
            stop(proc)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
