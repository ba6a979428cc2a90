"""SIGHUP reloads credentials and grants without a restart (issue 10, "Smaller"), sent
to real processes: ``aotx serve`` (one process; and its service socket stays closed
unless ``--service-socket``) and the split deployment (``aotx boot`` + ``aotx gateway
serve``, each reloading its own file)."""

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
from _gateway_env import ALL, LINEAGE, SCHEMA, make_config, make_runtime_file, short_dir, token_for

from aotx_trio.config import load_gateway_config, write_gateway_config
from aotx_trio.grants import write_grants
from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _start(args: list[str], pattern: str, log_to: Path) -> tuple[subprocess.Popen[str], str]:
    """Start ``aotx ARGS``; its log goes to ``log_to``, its stdout (a few lines) is read
    until ``pattern`` matches."""
    with open(log_to, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "aotx_trio", *args], cwd=ROOT,
                                env=_env(), stdout=subprocess.PIPE, stderr=log, text=True)
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
    if proc.stdout is not None:
        proc.stdout.close()
    raise AssertionError("process did not start:\n" + "".join(seen))


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


def _body(key: int, seq: int) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq)}


def _until(check: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reloaded in time"
        time.sleep(0.1)


@pytest.fixture
def folder() -> Iterator[Path]:
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _status(url: str, who: str, method: str = "GET", path: str = "/participant",
            body: Any = None) -> int:
    r = httpx.request(method, url + BASE_PATH + path, json=body, timeout=10,
                      headers={"Authorization": f"Bearer {token_for(who)}"})
    return r.status_code


def _revoke_bob_add_carol(config_path: Path) -> None:
    cfg = load_gateway_config(config_path)
    _, fresh = make_config(config_path.parent / "next", {"alice": ALL, "carol": ALL})
    write_gateway_config(config_path, cfg.model_copy(update={"principals": fresh.principals}))


def test_sighup_reloads_aotx_serve(folder: Path) -> None:
    make_runtime_file(folder)                       # folder/runtime.aotxccir (tiny model)
    path, _ = make_config(folder, {"alice": ALL, "bob": ALL})
    proc, url = _start(["serve", "--data", str(folder), "--bind", "127.0.0.1:0"],
                       r"listening on (http://\S+)", folder / "serve.log")
    try:
        assert not (folder / "journal" / "service.sock").exists()   # not asked for
        assert _status(url, "bob") == 200
        assert _status(url, "carol") == 401
        _revoke_bob_add_carol(path)
        proc.send_signal(signal.SIGHUP)
        _until(lambda: _status(url, "bob") == 401)
        assert _status(url, "alice") == 200
        # carol: the gateway knows her token and the runtime her grants (rewritten)
        assert _status(url, "carol", "POST", "/participant", _body(1, 1)) == 202
        assert proc.poll() is None
    finally:
        _stop(proc)
    assert proc.returncode == 0


def test_aotx_serve_opens_the_service_socket_when_asked(folder: Path) -> None:
    make_runtime_file(folder)
    make_config(folder, {"alice": ALL})
    proc, url = _start(["serve", "--data", str(folder), "--bind", "127.0.0.1:0",
                        "--service-socket"], r"listening on (http://\S+)", folder / "serve.log")
    try:
        assert (folder / "journal" / "service.sock").exists()
        assert _status(url, "alice") == 200
    finally:
        _stop(proc)


def test_sighup_reloads_the_split_deployment(folder: Path) -> None:
    ccir = make_runtime_file(folder / "rt")
    sock = folder / "journal" / "service.sock"
    path, _ = make_config(folder, {"alice": ALL, "bob": ALL}, socket=sock)
    boot, _ = _start(["boot", "--ccir", str(ccir), "--journal", str(folder / "journal"),
                      "--service-grants", str(folder / "grants")], r"(serving)",
                     folder / "boot.log")
    try:
        gw, url = _start(["gateway", "serve", "--config", str(path)],
                         r"listening on (http://\S+)", folder / "gateway.log")
        try:
            assert _status(url, "bob") == 200
            _revoke_bob_add_carol(path)
            gw.send_signal(signal.SIGHUP)
            _until(lambda: _status(url, "bob") == 401)
            # the runtime has not reloaded its grants yet: carol is not deployed
            assert _status(url, "carol", "POST", "/participant", _body(1, 1)) == 403
            write_grants(load_gateway_config(path), folder / "grants")
            boot.send_signal(signal.SIGHUP)
            _until(lambda: _status(url, "carol", "POST", "/participant", _body(1, 1))
                   in (200, 202))
            assert gw.poll() is None and boot.poll() is None
        finally:
            _stop(gw)
    finally:
        _stop(boot)
