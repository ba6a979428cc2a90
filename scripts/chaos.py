#!/usr/bin/env python3
"""The fault-and-load harness (issue 10): nothing acknowledged is ever lost.

Bounded and loopback only.  ``aotx serve`` (or, with ``--split``, ``aotx boot``
+ ``aotx gateway serve``) runs on a fresh data folder; ``--clients`` principals
each register and then loop over a mix of sequenced mutations (spaces, member
rows, conversations, inputs, retirements), exact retries and reads, for
``--seconds``.  Every ``--kill-every`` seconds a fault loop ``kill -9``s the
runtime (in split mode the gateway too, alternately), restarts it on the same
folder and waits for it to listen again.

Each client keeps its own record: an operation counts as *acknowledged* once
an answer 202/200 carried its receipt (202 comes only after the admission
record was fsynced).  A request that fails (connection lost, 5xx) is retried
byte for byte until it is acknowledged: the service must answer that retry
with the same receipt, never a second effect.  Reads during the run check
that an acknowledged space or conversation is never missing, whatever restart
happened since.

After the run (the service is restarted once more, cleanly) every client's
record is checked against what the service reports:

* ``next_sequence`` is exactly one past the last acknowledged sequence (no
  mutation lost, none applied twice);
* every acknowledged operation above the client's retry floor reads back with
  the same kind, sequence and resource;
* every acknowledged space and conversation reads back, the client's spaces
  list holds exactly the acknowledged ones, and each conversation holds
  exactly its acknowledged inputs.

Prints a summary and one JSON line; exits 1 on any violation.  With
``--disk-faults SPEC`` the runtime's journal writes also fail (EIO, ENOSPC on
pwrite, EIO on fsync) or stall (slow fsync) at random, through the fault seam
of runtime/faults.py (``AOTX_JOURNAL_FAULTS``); a failed save is never
acknowledged and new writes hold (429, retried by the clients) until a save
succeeds.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from aotx_trio.config import GatewayConfig, write_gateway_config  # noqa: E402
from aotx_trio.gateway.auth import hash_token  # noqa: E402

SCHEMA = "aotx.shared.mutation.v1"
BASE = "/aotx/v1/shared"
ALL = ["shared_read", "shared_write", "shared_manage", "models_read", "models_invoke",
       "metrics_read"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# --------------------------------------------------------------------------- the service

class Service:
    """The server processes on one data folder, killed and restarted on demand."""

    def __init__(self, data: Path, runtime: Path, clients: int, split: bool,
                 disk_faults: str | None = None) -> None:
        self.data, self.split, self.disk_faults = data, split, disk_faults
        self.port = free_port()
        data.mkdir(parents=True, exist_ok=True)
        shutil.copy(runtime, data / "runtime.aotxccir")
        self.tokens = [f"chaos-token-{i}-{os.urandom(8).hex()}" for i in range(clients)]
        cfg = GatewayConfig.model_validate({
            "bind": f"127.0.0.1:{self.port}",
            "service_socket": str(data / "journal" / "service.sock") if split else None,
            "limits": {"requests_per_second": 0},
            "principals": [{"name": f"chaos-{i}", "token_sha256": hash_token(t),
                            "actions": ALL} for i, t in enumerate(self.tokens)]})
        write_gateway_config(data / "gateway.json", cfg)
        os.chmod(data / "gateway.json", 0o600)
        if split:
            from aotx_trio.grants import write_grants

            write_grants(cfg, data / "grants")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.kills = 0
        self.log = data / "server.log"

    def _cmd(self, role: str) -> list[str]:
        aotx = [sys.executable, "-m", "aotx_trio"]
        if role == "serve":
            return [*aotx, "serve", "--data", str(self.data), "--bind",
                    f"127.0.0.1:{self.port}"]
        if role == "boot":
            return [*aotx, "boot", "--ccir", str(self.data / "runtime.aotxccir"),
                    "--journal", str(self.data / "journal"),
                    "--service-grants", str(self.data / "grants")]
        return [*aotx, "gateway", "serve", "--config", str(self.data / "gateway.json")]

    def roles(self) -> list[str]:
        return ["boot", "gateway"] if self.split else ["serve"]

    def start(self, role: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if self.disk_faults and role in ("serve", "boot"):   # the journal's writer
            env["AOTX_JOURNAL_FAULTS"] = f"{self.disk_faults},seed={self.kills}"
        with self.log.open("ab") as out:
            self.procs[role] = subprocess.Popen(self._cmd(role), stdout=out,
                                                stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, timeout: float = 60) -> None:
        """Until the gateway answers /capabilities (and, split, the runtime behind it)."""
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline:
                for role, proc in self.procs.items():
                    if proc.poll() is not None:
                        raise RuntimeError(f"{role} exited with {proc.returncode}:\n"
                                           + self.log.read_text()[-3000:])
                try:
                    r = await http.get(f"http://127.0.0.1:{self.port}{BASE}/capabilities",
                                       headers={"Authorization": f"Bearer {self.tokens[0]}"})
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.1)
        raise RuntimeError("the service did not come up:\n" + self.log.read_text()[-3000:])

    async def start_all(self) -> None:
        for role in self.roles():
            self.start(role)
            if role == "boot":   # the gateway needs the runtime's socket
                sock = self.data / "journal" / "service.sock"
                with trio.fail_after(60):
                    while not sock.exists():
                        await trio.sleep(0.05)
        await self.wait_ready()

    def kill(self, role: str) -> None:
        proc = self.procs.get(role)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.kills += 1

    async def restart(self, role: str) -> None:
        self.kill(role)
        self.start(role)
        await self.wait_ready()

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


# --------------------------------------------------------------------------- the clients

@dataclass
class Acked:
    op: str
    kind: str
    sequence: int
    resource: str | None


@dataclass
class Sub:
    """One SSE subscription to an acknowledged input's output (``/operations/{op}/events``)."""
    op: str
    got: bytearray = field(default_factory=bytearray)
    end: str | None = None            # the status of its ``end`` event, once received
    resumes: int = 0
    done: trio.Event = field(default_factory=trio.Event)


async def sse_events(resp: httpx.Response) -> AsyncGenerator[tuple[str | None, str, Any]]:
    """(id, event, data) of each event of an SSE body (comments skipped)."""
    event_id, kind, data = None, "message", []
    async for line in resp.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])
        elif line == "" and data:
            yield event_id, kind, json.loads("\n".join(data))
            event_id, kind, data = None, "message", []


@dataclass
class Client:
    index: int
    token: str
    lineage: str
    rng: random.Random
    seq: int = 1
    floor: int = 1
    acked: list[Acked] = field(default_factory=list)
    spaces: list[str] = field(default_factory=list)
    conversations: dict[str, int] = field(default_factory=dict)   # con -> inputs
    retries: int = 0
    reads: int = 0
    violations: list[str] = field(default_factory=list)
    subs: dict[str, Sub] = field(default_factory=dict)     # op -> its subscription
    sub_nursery: trio.Nursery | None = None
    sub_deadline: float = float("inf")
    subscribed: int = 0
    sub_resumes: int = 0
    sub_bytes: int = 0
    sub_errors: Counter[str] = field(default_factory=Counter)
    taken_back: int = 0
    strict_output: bool = False

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def mutate(self, http: httpx.AsyncClient, path: str, **fields: Any) -> dict[str, Any]:
        """One sequenced mutation, retried byte for byte until acknowledged."""
        body = {"schema": SCHEMA, "lineage": self.lineage,
                "operation_key": f"{self.index + 1:08x}{self.seq:024x}",
                "sequence": str(self.seq), **fields}
        raw = json.dumps(body)
        first = True
        while True:
            try:
                r = await http.post(BASE + path, content=raw, headers={
                    **self.auth, "Content-Type": "application/json"})
            except httpx.HTTPError:
                r = None
            if r is not None and r.status_code in (200, 202):
                receipt: dict[str, Any] = r.json()
                if r.status_code == 200 and first:
                    self.violations.append(f"seq {self.seq}: a first attempt answered 200")
                if receipt.get("sequence") != str(self.seq):
                    self.violations.append(f"seq {self.seq}: receipt for {receipt.get('sequence')}")
                self.acked.append(Acked(receipt["operation"], receipt["kind"], self.seq,
                                        receipt.get("resource")))
                self.seq += 1
                return receipt
            if r is not None and r.status_code < 500 and r.status_code != 429:
                self.violations.append(f"seq {self.seq} {path}: {r.status_code} {r.text[:200]}")
                raise RuntimeError(self.violations[-1])
            first = False
            self.retries += 1
            await trio.sleep(0.05 + self.rng.random() * 0.1)

    async def read(self, http: httpx.AsyncClient, path: str) -> httpx.Response | None:
        try:
            r = await http.get(BASE + path, headers=self.auth)
        except httpx.HTTPError:
            return None
        self.reads += 1
        return r

    async def check_read(self, http: httpx.AsyncClient, path: str) -> None:
        """An acknowledged resource reads 200 (or the service is down: no answer/5xx)."""
        r = await self.read(http, path)
        if r is not None and r.status_code < 500 and r.status_code != 200:
            self.violations.append(f"read {path}: {r.status_code} {r.text[:200]}")

    async def step(self, http: httpx.AsyncClient, model: str) -> None:
        roll = self.rng.random()
        if self.seq - self.floor >= 12:
            await self.retire(http)
        elif not self.spaces or (roll < 0.15 and len(self.spaces) < 8):
            rec = await self.mutate(http, "/spaces", scope="private")
            self.spaces.append(rec["resource"])
        elif roll < 0.35:
            space = self.rng.choice(self.spaces)
            await self.mutate(http, f"/spaces/{space}/members",
                              participant=f"par-{self.lineage}-{self.participant_key()}",
                              permissions=["read", "write", "manage"])
        elif roll < 0.5 and len(self.conversations) < 8:
            space = self.rng.choice(self.spaces)
            rec = await self.mutate(http, f"/spaces/{space}/conversations")
            self.conversations[rec["resource"]] = 0
        elif roll < 0.6 and self.conversations:
            con = self.rng.choice(list(self.conversations))
            follow = self.sub_nursery is not None and self.rng.random() < 0.5 and \
                sum(1 for s in self.subs.values() if not s.done.is_set()) < 2
            rec = await self.mutate(http, f"/conversations/{con}/inputs", text="chaos says hi",
                                    model=model, max_output_tokens=12 if follow else 2)
            self.conversations[con] += 1
            if follow and self.sub_nursery is not None:
                sub = self.subs[rec["operation"]] = Sub(rec["operation"])
                self.subscribed += 1
                self.sub_nursery.start_soon(self.subscribe, http, sub)
        else:
            targets = [f"/spaces/{s}" for s in self.spaces]
            targets += [f"/conversations/{c}" for c in self.conversations]
            await self.check_read(http, self.rng.choice(targets))

    async def subscribe(self, http: httpx.AsyncClient, sub: Sub) -> None:
        """Follow ``sub.op``'s output to its ``end`` event, resuming with
        ``Last-Event-ID`` whenever a kill cuts the stream: each output event must
        start exactly where the bytes received so far end (no byte twice, none
        skipped)."""
        last_id: str | None = None
        url = f"{BASE}/operations/{sub.op}/events"
        with trio.move_on_at(self.sub_deadline):
            while sub.end is None:
                headers = dict(self.auth)
                if last_id is not None:
                    headers["Last-Event-ID"] = last_id
                try:
                    async with http.stream("GET", url, headers=headers) as resp:
                        if resp.status_code != 200:
                            await resp.aread()
                            if resp.status_code < 500 and resp.status_code != 429:
                                self.violations.append(
                                    f"events {sub.op}: {resp.status_code} {resp.text[:200]}")
                                return
                            self.sub_errors[f"http {resp.status_code}"] += 1
                        else:
                            async with contextlib.aclosing(sse_events(resp)) as events:
                                async for event_id, kind, data in events:
                                    if kind == "output":
                                        if data["offset"] != len(sub.got):
                                            self.violations.append(
                                                f"events {sub.op}: output at {data['offset']}"
                                                f" after {len(sub.got)} bytes received")
                                            return
                                        chunk = base64.b64decode(data["data"])
                                        sub.got += chunk
                                        self.sub_bytes += len(chunk)
                                        if event_id != f"{sub.op}/{len(sub.got)}":
                                            self.violations.append(
                                                f"events {sub.op}: id {event_id} after "
                                                f"{len(sub.got)} bytes")
                                        last_id = event_id
                                    elif kind == "end":
                                        total = data["receipt"]["result"]["bytes"]
                                        if str(total) != str(len(sub.got)) and \
                                                data["status"] != "interrupted":
                                            self.violations.append(
                                                f"events {sub.op}: end says {total} bytes, "
                                                f"{len(sub.got)} received")
                                        sub.end = data["status"]
                                        break
                                    elif kind == "error":
                                        self.sub_errors[str(data.get("code"))] += 1
                                        break
                                    else:
                                        self.sub_errors[kind] += 1
                                        break
                except httpx.HTTPError as exc:
                    self.sub_errors[type(exc).__name__] += 1
                if sub.end is None:
                    sub.resumes += 1
                    self.sub_resumes += 1
                    await trio.sleep(0.05 + self.rng.random() * 0.1)
        sub.done.set()

    async def audit_sub(self, http: httpx.AsyncClient, sub: Sub) -> None:
        """The bytes ``sub`` received are the operation's saved result (all of it
        once its ``end`` came, else a prefix of it)."""
        with trio.move_on_after(60) as waited:
            await sub.done.wait()
        if waited.cancelled_caught:
            self.violations.append(f"events {sub.op}: the subscription never ended")
        result = bytearray()
        status = None
        while True:
            r = await self.read(http, f"/operations/{sub.op}/result?offset={len(result)}")
            if r is None or (r.status_code >= 500 and r.status_code != 504) \
                    or r.status_code == 429:
                await trio.sleep(0.1)        # the service is being restarted
                continue
            if r.status_code == 504:         # deadline_exceeded: no bytes to compare
                self.subs.pop(sub.op, None)
                return
            if r.status_code != 200:
                self.violations.append(f"result {sub.op} reads {r.status_code} {r.text[:200]}")
                return
            page = r.json()
            status = page["status"]
            result += base64.b64decode(page["data"])
            if int(page["next_offset"]) >= int(page["total"]) or not page["length"]:
                break
        self.subs.pop(sub.op, None)
        if status == "interrupted" and len(sub.got) > len(result) \
                and bytes(sub.got).startswith(bytes(result)):
            # live bytes of an input a kill -9 interrupted before its completion was
            # saved: shown, then taken back (docs/reliability.md, "Live output")
            self.taken_back += len(sub.got) - len(result)
            if self.strict_output:
                self.violations.append(f"events {sub.op}: {len(sub.got)} bytes received, "
                                       f"the interrupted result keeps {len(result)}")
            return
        if sub.end is not None:
            if bytes(sub.got) != bytes(result) or sub.end != status:
                self.violations.append(
                    f"events {sub.op}: received {len(sub.got)} bytes ending {sub.end}, "
                    f"saved result {len(result)} bytes {status}"
                    + ("" if bytes(sub.got) == bytes(result) else " (the bytes differ)"))
        elif not bytes(result).startswith(bytes(sub.got)):
            self.violations.append(f"events {sub.op}: {len(sub.got)} bytes received are "
                                   f"not a prefix of the saved {len(result)}")

    def participant_key(self) -> str:
        import hashlib

        return hashlib.sha256(f"chaos-{self.index}".encode()).digest()[:16].hex()

    async def retire(self, http: httpx.AsyncClient) -> None:
        """Retire what is below the current sequence once every input there ended."""
        pending = [a for a in self.acked if a.kind == "input" and a.sequence >= self.floor]
        for a in pending:
            while True:
                r = await self.read(http, f"/operations/{a.op}")
                if r is not None and r.status_code == 200 and \
                        r.json()["terminal"]["saved"]:
                    break
                await trio.sleep(0.05)
        for a in pending:          # before retirement takes the operations away
            if a.op in self.subs:
                await self.audit_sub(http, self.subs[a.op])
        floor = self.seq
        await self.mutate(http, "/participant/retirements", retry_floor=str(floor))
        self.floor = floor


# --------------------------------------------------------------------------- verify

async def verify(c: Client, http: httpx.AsyncClient) -> None:
    me = await c.read(http, "/participant")
    if me is None or me.status_code != 200:
        c.violations.append(f"participant read failed: {me}")
        return
    got = me.json()
    if got["next_sequence"] != str(c.seq):
        c.violations.append(f"next_sequence {got['next_sequence']} != {c.seq} "
                            "(a mutation lost or applied twice)")
    for a in c.acked:
        if a.sequence < c.floor:
            continue
        r = await c.read(http, f"/operations/{a.op}")
        if r is None or r.status_code != 200:
            c.violations.append(f"acknowledged {a.kind} seq {a.sequence} ({a.op}) reads "
                                f"{None if r is None else r.status_code}")
            continue
        op = r.json()
        if (op["kind"], op["sequence"], op["resource"]) != (a.kind, str(a.sequence), a.resource):
            c.violations.append(f"seq {a.sequence}: read back {op['kind']} {op['sequence']}")
    listed: list[str] = []
    cursor: str | None = None
    while True:
        r = await c.read(http, "/spaces" + (f"?cursor={cursor}" if cursor else ""))
        assert r is not None and r.status_code == 200, r
        page = r.json()
        listed += [s["id"] for s in page["items"] if s["owner"].endswith(c.participant_key())]
        cursor = page["next_cursor"]
        if not cursor:
            break
    if sorted(listed) != sorted(c.spaces):
        c.violations.append(f"spaces listed {len(listed)} != acknowledged {len(c.spaces)}")
    for con, inputs in c.conversations.items():
        r = await c.read(http, f"/conversations/{con}")
        if r is None or r.status_code != 200:
            c.violations.append(f"conversation {con} reads {None if r is None else r.status_code}")
        elif r.json()["inputs"] != str(inputs):
            c.violations.append(f"conversation {con}: {r.json()['inputs']} inputs, "
                                f"{inputs} acknowledged")


# --------------------------------------------------------------------------- main

async def run(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="aotx-chaos-"))
    svc = Service(data, args.runtime, args.clients, args.split, args.disk_faults)
    try:
        await svc.start_all()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}", timeout=30,
                                     limits=httpx.Limits(max_connections=args.clients * 4)
                                     ) as http:
            caps = (await http.get(BASE + "/capabilities", headers={
                "Authorization": f"Bearer {svc.tokens[0]}"})).json()
            lineage = caps["lineage"]
            model = next(m["name"] for m in caps["models"] if m["kind"] == "text")
            clients = [Client(i, t, lineage, random.Random(args.seed * 1000 + i))
                       for i, t in enumerate(svc.tokens)]
            stop_at = trio.current_time() + args.seconds
            fatal: list[str] = []

            async def client_loop(c: Client) -> None:
                await c.mutate(http, "/participant")
                while trio.current_time() < stop_at and not fatal:
                    try:
                        await c.step(http, model)
                    except RuntimeError as exc:
                        fatal.append(str(exc))
                        return

            async def faults() -> None:
                turn = 0
                while trio.current_time() + args.kill_every < stop_at:
                    await trio.sleep(args.kill_every)
                    roles = svc.roles()
                    await svc.restart(roles[turn % len(roles)])
                    turn += 1

            async def progress() -> None:
                start = trio.current_time()
                while trio.current_time() + args.progress < stop_at:
                    await trio.sleep(args.progress)
                    print(f"chaos: {trio.current_time() - start:.0f} s: {svc.kills} kill -9, "
                          f"{sum(len(c.acked) for c in clients)} acknowledged, "
                          f"{sum(c.retries for c in clients)} retries, "
                          f"{sum(c.subscribed for c in clients)} subscriptions, "
                          f"{sum(len(c.violations) for c in clients) + len(fatal)} "
                          "violations so far", file=sys.stderr, flush=True)

            async with trio.open_nursery() as n:
                n.start_soon(faults)
                if args.progress:
                    n.start_soon(progress)
                for c in clients:
                    if args.subscribe:
                        c.sub_nursery, c.sub_deadline = n, stop_at + 60
                        c.strict_output = args.strict_output
                    n.start_soon(client_loop, c)
        svc.stop_all()
        await svc.start_all()            # a clean restart, then the audit
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{svc.port}", timeout=30
                                     ) as http:
            for c in clients:
                await verify(c, http)
                for sub in list(c.subs.values()):
                    await c.audit_sub(http, sub)
        violations = [f"client {c.index}: {v}" for c in clients for v in c.violations]
        violations += fatal
        return {"seconds": args.seconds, "clients": args.clients, "split": args.split,
                "disk_faults": args.disk_faults,
                "kills": svc.kills, "acknowledged": sum(len(c.acked) for c in clients),
                "retries": sum(c.retries for c in clients),
                "reads": sum(c.reads for c in clients),
                "subscriptions": sum(c.subscribed for c in clients),
                "subscription_resumes": sum(c.sub_resumes for c in clients),
                "subscription_bytes": sum(c.sub_bytes for c in clients),
                "subscription_cuts": dict(sum((c.sub_errors for c in clients), Counter())),
                "output_taken_back": sum(c.taken_back for c in clients),
                "violations": violations}
    finally:
        svc.stop_all()
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
        else:
            print(f"data kept in {data}", file=sys.stderr)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--minutes", type=float, help="the long run: overrides --seconds")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--kill-every", type=float, default=5.0)
    ap.add_argument("--split", action="store_true", help="aotx boot + aotx gateway serve")
    ap.add_argument("--disk-faults", metavar="SPEC", help="inject journal write faults in "
                    "the runtime (AOTX_JOURNAL_FAULTS, runtime/faults.py), e.g. "
                    "eio=0.01,enospc=0.01,fsync_eio=0.01,slow_fsync=0.05:0.2")
    ap.add_argument("--runtime", type=Path, help="runtime file (default: the default models, "
                    "packed once into ~/.cache/aotx-chaos)")
    ap.add_argument("--no-subscribe", dest="subscribe", action="store_false",
                    help="no SSE subscribers (by default half the inputs are followed "
                    "through /operations/{op}/events, resuming across kills)")
    ap.add_argument("--strict-output", action="store_true",
                    help="count live output bytes that an interruption took back as "
                    "violations (see docs/reliability.md, \"Live output\")")
    ap.add_argument("--progress", type=float, default=0, metavar="SECONDS",
                    help="a progress line on stderr every SECONDS")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    if args.minutes:
        args.seconds = args.minutes * 60
    if args.runtime is None:
        from aotx_trio.serve import ensure_runtime

        cache = Path.home() / ".cache" / "aotx-chaos"
        cache.mkdir(parents=True, exist_ok=True)
        ensure_runtime(cache)
        args.runtime = cache / "runtime.aotxccir"
    out = trio.run(run, args)
    print(f"chaos: {out['seconds']:g} s, {out['clients']} clients, "
          f"{'split' if out['split'] else 'embedded'}, {out['kills']} kill -9, "
          f"disk faults {out['disk_faults'] or 'none'}, "
          f"{out['acknowledged']} acknowledged operations, {out['retries']} retries, "
          f"{out['reads']} reads, {out['subscriptions']} SSE subscriptions "
          f"({out['subscription_resumes']} resumes, {out['subscription_bytes']} bytes, "
          f"{out['output_taken_back']} taken back by interruptions): "
          f"{len(out['violations'])} violations")
    for v in out["violations"][:50]:
        print("  " + v)
    print(json.dumps(out))
    return 1 if out["violations"] else 0


if __name__ == "__main__":
    sys.exit(main())
