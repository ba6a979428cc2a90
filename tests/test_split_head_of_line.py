"""Reads never wait behind saves in the split deployment (issue 10, item 6).

Real ``aotx boot`` + ``aotx gateway serve`` processes; every journal fsync of the
runtime stalls 2 s (the fault seam of runtime/faults.py, ``AOTX_JOURNAL_FAULTS``).
While other principals' writes wait for those saves on the gateway's socket
connection, a principal whose state none of them touches reads its participant
row and its spaces list: each read answers well inside one stalled fsync (before
the fix one took 7.1 s behind pending writes)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, LINEAGE, SCHEMA, make_config, make_runtime_file, short_dir, token_for

from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent
STALL_S = 2.0
WRITERS = ["carol", "dave", "eve", "frank"]


def _start(args: list[str], pattern: str, log_to: Path, env: dict[str, str]
           ) -> tuple[subprocess.Popen[str], str]:
    with open(log_to, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "aotx_trio", *args], cwd=ROOT,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                                stdout=subprocess.PIPE, stderr=log, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(pattern, line)
        if m:
            return proc, m.group(1)
    proc.kill()
    proc.wait()
    proc.stdout.close()
    raise AssertionError("process did not start:\n" + "".join(seen) + log_to.read_text())


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


@pytest.fixture
def folder() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


async def _reads_while_writes_wait(url: str) -> tuple[list[float], int, float]:
    """(each read's seconds, writes still unanswered when the reads ended, seconds the
    writes took)."""
    def auth(who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token_for(who)}"}

    async with httpx.AsyncClient(base_url=url + BASE_PATH, timeout=60) as http:
        r = await http.post("/participant", json=_body(1, 1), headers=auth("bob"))
        assert r.status_code == 202, r.text
        answered = 0
        t_writes = time.monotonic()

        async def writer(i: int, who: str) -> None:
            nonlocal answered
            for seq, path, extra in ((1, "/participant", {}),
                                     (2, "/spaces", {"scope": "private"})):
                r = await http.post(path, json=_body(100 + 10 * i + seq, seq, **extra),
                                    headers=auth(who))
                assert r.status_code == 202, r.text
            answered += 1

        times: list[float] = []
        async with trio.open_nursery() as n:
            for i, who in enumerate(WRITERS):
                n.start_soon(writer, i, who)
            await trio.sleep(0.3)              # the writes are on the socket, waiting
            for _ in range(6):
                for path in ("/participant", "/spaces"):
                    t0 = time.monotonic()
                    r = await http.get(path, headers=auth("bob"))
                    times.append(time.monotonic() - t0)
                    assert r.status_code == 200, r.text
            pending = len(WRITERS) - answered
        return times, pending, time.monotonic() - t_writes


def test_reads_never_wait_behind_stalled_saves(folder: Path) -> None:
    ccir = make_runtime_file(folder / "rt")
    sock = folder / "journal" / "service.sock"
    path, _ = make_config(folder, {who: ALL for who in ["bob", *WRITERS]}, socket=sock)
    boot, _ = _start(["boot", "--ccir", str(ccir), "--journal", str(folder / "journal"),
                      "--service-grants", str(folder / "grants")], r"(serving)",
                     folder / "boot.log", {"AOTX_JOURNAL_FAULTS": f"slow_fsync=1:{STALL_S}"})
    try:
        gw, url = _start(["gateway", "serve", "--config", str(path)],
                         r"listening on (http://\S+)", folder / "gateway.log", {})
        try:
            times, pending, writes_s = trio.run(_reads_while_writes_wait, url)
        finally:
            _stop(gw)
    finally:
        _stop(boot)
    assert pending > 0, "the writes were done before the reads: nothing was in the way"
    assert writes_s >= 2 * STALL_S          # every save really stalled
    assert max(times) < STALL_S / 4, times  # no read waited for one
