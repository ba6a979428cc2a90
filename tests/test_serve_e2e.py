"""End to end over real sockets: ``aotx serve`` (one process) and ``aotx boot`` +
``aotx gateway serve`` (two processes) on a free loopback port, driven with httpx
through the spec's client sequence; then the runtime is killed with SIGKILL in the
middle of a load, restarted, and every acknowledged operation must have survived
and every retry must return the same receipt."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway_env import ALL, make_config, make_runtime_file, short_dir, token_for

BASE = "/aotx/v1/shared"
SCHEMA = "aotx.shared.mutation.v1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:   # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "aotx_trio", *argv], stdout=out,
                                stderr=subprocess.STDOUT, env=dict(os.environ))


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
            return -9
    return proc.returncode


@pytest.fixture
def folder() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Caller:
    """One principal's client: keeps its own next sequence like a real client."""

    def __init__(self, base: str, name: str, token: str, lineage: str) -> None:
        self.http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                                 timeout=30)
        self.name = name
        self.lineage = lineage
        self.seq = 0

    def close(self) -> None:
        self.http.close()

    def body(self, key: int, seq: int, **fields: Any) -> dict[str, Any]:
        return {"schema": SCHEMA, "lineage": self.lineage, "operation_key": f"{key:032x}",
                "sequence": str(seq), **fields}

    def get(self, path: str) -> httpx.Response:
        return self.http.get(BASE + path)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        return self.http.post(BASE + path, json=body)


def client_sequence(alice: Caller, bob: Caller) -> dict[str, Any]:
    """The spec's client sequence up to a conversation with a second member."""
    caps = alice.get("/capabilities")
    assert caps.status_code == 200 and caps.headers["cache-control"] == "no-store"
    assert caps.json()["lineage"] == alice.lineage
    for c in (alice, bob):
        me = c.get("/participant").json()
        assert me["participant"] is None and me["next_sequence"] == "1"
        r = c.post("/participant", c.body(1, 1))
        assert r.status_code == 202, r.text
        assert c.get("/participant").json()["next_sequence"] == "2"
    r = alice.post("/spaces", alice.body(2, 2, scope="room"))
    assert r.status_code == 202, r.text
    space = r.json()["resource"]
    r = alice.post(f"/spaces/{space}/conversations", alice.body(3, 3))
    assert r.status_code == 202, r.text
    con = r.json()["resource"]
    bob_id = bob.get("/participant").json()["participant"]["id"]
    r = alice.post(f"/spaces/{space}/members",
                   alice.body(4, 4, participant=bob_id, permissions=["read", "write"]))
    assert r.status_code == 202, r.text
    receipt = r.json()
    retry = alice.post(f"/spaces/{space}/members",
                       alice.body(4, 4, participant=bob_id, permissions=["read", "write"]))
    assert retry.status_code == 200 and retry.json()["operation"] == receipt["operation"]
    got = alice.get(f"/operations/{receipt['operation']}")
    assert got.status_code == 200 and got.json()["admission"]["saved"] is True
    assert bob.get(f"/conversations/{con}").status_code == 200
    members = alice.get(f"/spaces/{space}/members").json()["items"]
    assert {m["participant"] for m in members} == {bob_id}
    return {"space": space, "conversation": con}


def test_aotx_serve_embedded(tmp_path: Path, folder: Path) -> None:
    data = folder / "data"
    data.mkdir()
    # A stub runtime file stands in for the default models (packing them is its own test).
    shutil.copy(make_runtime_file(tmp_path / "rt"), data / "runtime.aotxccir")
    port = free_port()
    log = folder / "serve.log"
    proc = start(["serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"], log)
    base = f"http://127.0.0.1:{port}"
    admin: Caller | None = None
    try:
        wait_http(base + BASE + "/capabilities", proc, log)
        lines = log.read_text().splitlines()
        i = lines.index("aotx serve: admin token (shown once, stored only as its SHA-256):")
        token = lines[i + 1].strip()
        config = json.loads((data / "gateway.json").read_text())
        assert token not in json.dumps(config)
        assert (data / "gateway.json").stat().st_mode & 0o777 == 0o600
        lineage = httpx.get(base + BASE + "/capabilities",
                            headers={"Authorization": f"Bearer {token}"}).json()["lineage"]
        admin = Caller(base, "admin", token, lineage)
        assert admin.get("/participant").status_code == 200
        r = admin.post("/participant", admin.body(1, 1))
        assert r.status_code == 202
        r = admin.post("/spaces", admin.body(2, 2))
        assert r.status_code == 202
        space = r.json()["resource"]
        # a second `aotx serve` on the folder is refused (journal_locked) before it
        # writes anything: no file of the data folder is rewritten (issue 25 item 8)
        files = [data / "gateway.json", data / "grants" / "grants.json",
                 data / "webhook-signing.key"]
        before = [(f.stat().st_ino, f.stat().st_mtime_ns, f.read_bytes()) for f in files]
        second = subprocess.run(
            [sys.executable, "-m", "aotx_trio", "serve", "--data", str(data), "--bind",
             f"127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60,
            env=dict(os.environ))
        assert second.returncode == 1, second.stderr
        assert "journal_locked" in second.stderr.strip().splitlines()[-1], second.stderr
        assert [(f.stat().st_ino, f.stat().st_mtime_ns, f.read_bytes())
                for f in files] == before
        assert admin.get(f"/spaces/{space}").status_code == 200
    finally:
        code = stop(proc)
        if admin is None:
            pytest.fail(log.read_text())
    assert code == 0, log.read_text()
    assert "aotx serve: stopped" in log.read_text()
    # A second start keeps the token (not printed again) and the state.
    log2 = folder / "serve2.log"
    proc = start(["serve", "--data", str(data), "--bind", f"127.0.0.1:{port}"], log2)
    try:
        wait_http(base + BASE + "/capabilities", proc, log2)
        assert "admin token" not in log2.read_text()
        assert admin.get(f"/spaces/{space}").status_code == 200
        assert admin.post("/spaces", admin.body(2, 2)).status_code == 200
    finally:
        admin.close()
        assert stop(proc) == 0


def _split(folder: Path, ccir: Path, names: list[str],
           ) -> tuple[list[str], Path, Path, str, subprocess.Popen[bytes],
                      subprocess.Popen[bytes]]:
    """``aotx boot`` + ``aotx gateway serve`` on a free port for ``names``: (the boot
    argv for restarts, boot log, gateway log, base URL, runtime, gateway)."""
    port = free_port()
    sock = folder / "journal" / "service.sock"
    config_path, _ = make_config(folder, dict.fromkeys(names, ALL), socket=sock,
                                 bind=f"127.0.0.1:{port}")
    boot_argv = ["boot", "--ccir", str(ccir), "--journal", str(folder / "journal"),
                 "--service-grants", str(folder / "grants")]
    boot_log, gw_log = folder / "boot.log", folder / "gateway.log"
    runtime = start(boot_argv, boot_log)
    gateway = start(["gateway", "serve", "--config", str(config_path)], gw_log)
    return boot_argv, boot_log, gw_log, f"http://127.0.0.1:{port}", runtime, gateway


def test_split_deployment_survives_kill_9(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    names = ["alice", "bob", "carol", "dave"]
    boot_argv, boot_log, gw_log, base, runtime, gateway = _split(folder, ccir, names)
    callers: dict[str, Caller] = {}
    try:
        wait_http(base, gateway, gw_log)
        lineage = "0123456789abcdef0123456789abcdef"
        callers.update({n: Caller(base, n, token_for(n), lineage) for n in names})
        client_sequence(callers["alice"], callers["bob"])
        for n in ("carol", "dave"):
            assert callers[n].post("/participant", callers[n].body(1, 1)).status_code == 202

        acked: dict[str, list[tuple[dict[str, Any], dict[str, Any]]]] = {n: [] for n in names}
        stop_load = threading.Event()

        def load(name: str) -> None:
            c = callers[name]
            seq = int(c.get("/participant").json()["next_sequence"])
            while not stop_load.is_set() and seq < 400:
                body = c.body((names.index(name) + 1) << 64 | seq, seq)  # keys = space ids
                try:
                    r = c.post("/spaces", body)
                except httpx.TransportError:
                    return
                if r.status_code not in (200, 202):
                    assert r.status_code == 503, r.text   # runtime gone: not acknowledged
                    return
                acked[name].append((body, r.json()))
                seq += 1

        threads = [threading.Thread(target=load, args=(n,)) for n in names]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while sum(len(v) for v in acked.values()) < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        runtime.send_signal(signal.SIGKILL)       # mid-load
        runtime.wait(timeout=30)
        stop_load.set()
        for t in threads:
            t.join(timeout=60)
        total = sum(len(v) for v in acked.values())
        assert total >= 40, gw_log.read_text()
        down = callers["alice"].get("/participant")     # the gateway stays up: 503
        assert down.status_code == 503
        assert down.json()["error"]["code"] == "runtime_unavailable"

        runtime = start(boot_argv, boot_log)       # restart; the gateway reconnects
        deadline = time.monotonic() + 60
        while callers["alice"].get("/participant").status_code != 200:
            assert time.monotonic() < deadline, boot_log.read_text()
            time.sleep(0.05)
        for name, ops in acked.items():
            c = callers[name]
            for body, receipt in ops:
                got = c.get(f"/operations/{receipt['operation']}")
                assert got.status_code == 200, (name, receipt["operation"], got.text)
                assert got.json()["admission"]["saved"] is True
                retry = c.post("/spaces", body)
                assert retry.status_code == 200, retry.text
                assert retry.json()["operation"] == receipt["operation"]
                assert retry.json()["resource"] == receipt["resource"]
            if ops:
                last = int(ops[-1][0]["sequence"])
                assert int(c.get("/participant").json()["next_sequence"]) >= last + 1
    finally:
        for c in callers.values():
            c.close()
        assert stop(gateway) == 0, gw_log.read_text()
        stop(runtime)


def test_gateway_serve_needs_a_service_socket(folder: Path) -> None:
    config_path, _ = make_config(folder, {"alice": ALL})   # no service_socket
    proc = subprocess.run([sys.executable, "-m", "aotx_trio", "gateway", "serve", "--config",
                           str(config_path)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ))
    assert proc.returncode == 1
    assert "service_socket is required" in proc.stderr


def _real_runtime_file(folder: Path) -> Path:
    """A shared runtime file holding the real default text model (Gemma 3 270M) and a
    stub embedding folder (embeddings are not loaded yet)."""
    from _real import real_gguf

    from aotx_trio.runtime import pack

    emb = folder / "embedding"
    emb.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        (emb / name).write_text("{}")
    (emb / "model.safetensors").write_bytes(bytes(16))
    target = folder / "real.aotxccir"
    pack.pack(target, models=[real_gguf()], embedding=emb, shared=True,
              lineage="0123456789abcdef0123456789abcdef", progress=False)
    return target


def _wait_terminal(c: Caller, op: str, timeout: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got = c.get(f"/operations/{op}")
        assert got.status_code == 200, got.text
        receipt: dict[str, Any] = got.json()
        if receipt["status"] not in ("admitted", "running"):
            return receipt
        assert time.monotonic() < deadline, receipt
        time.sleep(0.05)


@pytest.mark.timeout(600)
def test_split_deployment_runs_a_room_conversation_on_the_default_model(
        tmp_path: Path, folder: Path) -> None:
    """Three participants ask at the same time in one room conversation on the real
    model; each reads the others' results; a kill -9 during a generation leaves that
    input interrupted after the restart, and nothing acknowledged is lost."""
    ccir = _real_runtime_file(tmp_path)
    names = ["alice", "bob", "carol"]
    boot_argv, boot_log, gw_log, base, runtime, gateway = _split(folder, ccir, names)
    lineage = "0123456789abcdef0123456789abcdef"
    callers = {n: Caller(base, n, token_for(n), lineage) for n in names}
    try:
        wait_http(base, gateway, gw_log)
        deadline = time.monotonic() + 120     # the runtime answers once its model is loaded
        while callers["alice"].get("/capabilities").status_code != 200:
            assert time.monotonic() < deadline, boot_log.read_text()
            time.sleep(0.1)
        models = callers["alice"].get("/capabilities").json()["models"]
        text_model = next(m for m in models if m["kind"] == "text")
        assert text_model["ready"] is True and len(text_model["digest"]) == 64
        assert text_model["kv_type"] == "f16"          # `aotx pack`'s default
        ids = client_sequence(callers["alice"], callers["bob"])
        con, space = ids["conversation"], ids["space"]
        c = callers["carol"]
        assert c.post("/participant", c.body(1, 1)).status_code == 202
        carol_id = c.get("/participant").json()["participant"]["id"]
        a = callers["alice"]
        r = a.post(f"/spaces/{space}/members",
                   a.body(5, 5, participant=carol_id, permissions=["read", "write"]))
        assert r.status_code == 202, r.text
        seqs = {"alice": 6, "bob": 2, "carol": 2}
        ops: dict[str, str] = {}

        def ask(name: str) -> None:
            caller = callers[name]
            r = caller.post(f"/conversations/{con}/inputs", caller.body(
                50 + seqs[name], seqs[name], text=f"I am {name}. Say hello to me.",
                model=text_model["name"], max_output_tokens=16))
            assert r.status_code == 202, r.text
            ops[name] = r.json()["operation"]

        threads = [threading.Thread(target=ask, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert set(ops) == set(names)
        texts = {}
        for name, op in ops.items():
            receipt = _wait_terminal(callers[name], op)
            assert receipt["status"] == "succeeded", receipt
            assert 1 <= receipt["result"]["output_tokens"] <= 16
            for reader in names:                      # every member reads every result
                got = callers[reader].get(f"/operations/{op}/result").json()
                assert got["length"] == receipt["result"]["bytes"] > 0
                texts[(name, reader)] = got["text"]
            assert len({texts[(name, r)] for r in names}) == 1
            assert isinstance(texts[(name, name)], str) and texts[(name, name)].strip()

        # the same bytes as server-sent events, over the service socket's push frames
        op = ops["bob"]
        streamed = bytearray()
        with callers["carol"].http.stream("GET", f"{BASE}/operations/{op}/events") as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    data = json.loads(line[6:])
                    if "status" in data:
                        assert data["status"] == "succeeded"
                        break
                    streamed += base64.b64decode(data["data"])
        assert streamed.decode() == texts[("bob", "carol")]

        # a long generation, killed mid-way
        r = a.post(f"/conversations/{con}/inputs", a.body(
            90, 7, text="Count from one to one thousand in words.", model=text_model["name"],
            max_output_tokens=1000))
        assert r.status_code == 202, r.text
        long_op = r.json()["operation"]
        deadline = time.monotonic() + 120
        while a.get(f"/operations/{long_op}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        runtime.send_signal(signal.SIGKILL)
        runtime.wait(timeout=30)
        runtime = start(boot_argv, boot_log)
        deadline = time.monotonic() + 120
        while a.get(f"/operations/{long_op}").status_code != 200:
            assert time.monotonic() < deadline, boot_log.read_text()
            time.sleep(0.1)
        gone = a.get(f"/operations/{long_op}").json()
        assert gone["status"] == gone["finish"] == "interrupted"
        for name, op in ops.items():                 # the finished ones are still there
            assert callers[name].get(f"/operations/{op}").json()["status"] == "succeeded"
            got = callers[name].get(f"/operations/{op}/result").json()
            assert got["text"] == texts[(name, name)]
    finally:
        for caller in callers.values():
            caller.close()
        assert stop(gateway) == 0, gw_log.read_text()
        stop(runtime)
