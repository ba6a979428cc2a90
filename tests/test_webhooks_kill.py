"""Two real ``aotx serve`` processes on one shared registry store (a folder, and a
real PostgreSQL) deliver one subscription while either is killed with SIGKILL again
and again (and restarted): the consumer, deduplicating on operation_id, sees every
event, in feed order.  ``AOTX_WEBHOOK_KILL_EVENTS`` / ``_KILLS`` scale it up (the
issue's 10,000 events and 10 kills)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from _gateway_env import make_runtime_file, short_dir, token_for
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from _webhook_env import Receiver, append_events, first_seen, receiving

from aotx_trio.config import token_sha256
from aotx_trio.registry.backends import open_store
from aotx_trio.webhooks import signing

EVENTS = int(os.environ.get("AOTX_WEBHOOK_KILL_EVENTS", "120"))
KILLS = int(os.environ.get("AOTX_WEBHOOK_KILL_KILLS", "4"))
pytestmark = pytest.mark.timeout(120 + EVENTS // 15)



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(params=["folder", "postgresql"])
def shared_store(request: pytest.FixtureRequest) -> str | None:
    """The ``store`` both routers name: None = a shared folder."""
    return None if request.param == "folder" else str(request.getfixturevalue("postgres_url"))


def _config(data: Path, shared: str, key: Path, ca: str | None) -> None:
    data.mkdir(parents=True)
    (data / "gateway.json").write_text(json.dumps({
        "principals": [{"name": "hooks", "token_sha256": token_sha256(token_for("hooks")),
                        "actions": ["webhooks_manage"]}],
        "store": str(shared),
        "webhooks": {"signing_key_file": str(key), "retry_interval_s": 0.05,
                     "allow_insecure_targets": True, "timeout_s": 5, "ca_file": ca,
                     "lease_s": 1}}))


async def _start(data: Path, ccir: Path) -> tuple[trio.Process, str]:
    port = free_port()
    if not (data / "runtime.aotxccir").exists():
        os.link(ccir, data / "runtime.aotxccir")
    with (data / "serve.log").open("ab") as log:   # the child keeps its own descriptor
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "aotx_trio", "serve", "--data", str(data), "--bind",
             f"127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as http:
        with trio.fail_after(60):
            while True:
                assert proc.poll() is None, (data / "serve.log").read_text()
                try:
                    await http.get(base + "/webhooks", timeout=1)
                    return proc, base
                except httpx.TransportError:
                    await trio.sleep(0.05)


async def test_kill_9_either_router_loses_and_reorders_nothing(
        tmp_path: Path, shared_store: str | None) -> None:
    root = short_dir()
    shared = shared_store or str(root / "shared")
    key = signing.create_key(root / "hook.key")
    ccir = make_runtime_file(tmp_path / "rt")
    rx = Receiver(public_key=signing.public_hex(signing.load_key(key)),
                  delay_s=0.02 if EVENTS < 1000 else 0.0)
    store = open_store(url=shared) if shared_store else open_store(data=shared)
    procs: list[trio.Process] = []
    try:
        async with receiving(tmp_path, rx) as (url, ca):
            for name in ("a", "b"):
                _config(root / name, shared, key, ca)
            a, base_a = await _start(root / "a", ccir)
            b, _ = await _start(root / "b", ccir)
            procs = [a, b]
            async with httpx.AsyncClient() as http:
                r = await http.post(base_a + "/webhooks", json={"url": url, "backfill": True},
                                    headers={"Authorization": f"Bearer {token_for('hooks')}"})
                assert r.status_code == 201, r.text
            ops: list[str] = []
            per = EVENTS // (KILLS + 1)
            for k in range(KILLS + 1):
                ops += await trio.to_thread.run_sync(
                    lambda k=k: append_events(store, per, start=per * k))
                await trio.sleep(0.25)      # mid-delivery: each post takes >= 20 ms
                if k < KILLS:
                    victim = k % 2
                    procs[victim].send_signal(signal.SIGKILL)   # no cleanup, lease kept
                    await procs[victim].wait()
                    procs[victim], _ = await _start(root / "ab"[victim], ccir)
            # the whole feed: the default models aotx serve registers come first
            events = [json.loads(e) for e in store.feed_read(0, 100_000)]
            feed = [e["operation_id"] for e in events]
            mine = set(ops)
            assert [op for op in feed if op in mine] == ops
            with trio.fail_after(60 + EVENTS / 50):
                while not set(feed) <= set(rx.accepted):
                    await trio.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                await p.wait()
        store.close()
        shutil.rmtree(root, ignore_errors=True)
    assert rx.refused == 0
    assert first_seen(rx.accepted) == feed
    print(f"{len(rx.accepted)} posts accepted for {len(feed)} events after {KILLS} kills")
