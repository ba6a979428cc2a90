"""The split deployment with the router: ``aotx boot`` + ``aotx gateway serve`` (two
processes, the service socket between them) with ``store`` and ``router`` in
gateway.json; a model published with ``aotx registry publish --data`` is listed by the
running gateway within its refresh interval and invoked over the socket."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from _gateway_env import TINY_MODEL, make_config, make_runtime_file, short_dir, token_for
from _router_env import TEXT_SPEC
from test_serve_e2e import free_port, start, stop, wait_http

pytestmark = pytest.mark.timeout(180)
MID = "runs/split/r1/inference-tiny-r1.json"


@pytest.fixture
def folder() -> Iterator[Path]:
    import shutil
    d = short_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_split_gateway_serves_the_router(tmp_path: Path, folder: Path) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    port = free_port()
    sock = folder / "journal" / "service.sock"
    config_path, _ = make_config(folder, {"ops": ("models_read", "models_invoke")},
                                 socket=sock, bind=f"127.0.0.1:{port}")
    config = json.loads(config_path.read_text())
    config.update(store="data", router={"index_refresh_s": 0.2, "max_inflight_invokes": 8})
    config_path.write_text(json.dumps(config))
    runtime = start(["boot", "--ccir", str(ccir), "--journal", str(folder / "journal"),
                     "--service-grants", str(folder / "grants")], folder / "boot.log")
    gateway = start(["gateway", "serve", "--config", str(config_path)], folder / "gw.log")
    base = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token_for('ops')}"}
    try:
        wait_http(base + "/models", gateway, folder / "gw.log")
        assert httpx.get(base + "/models", headers=headers).json() == {"models": []}
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps(TEXT_SPEC))
        pub = subprocess.run(
            [sys.executable, "-m", "aotx_trio", "registry", "publish", MID, "--artifact",
             str(tmp_path / "rt" / TINY_MODEL), "--spec", str(spec), "--type", "textgen",
             "--release", "tiny-r1", "--context", "1024", "--data", str(folder / "data"),
             "--json"], capture_output=True, text=True, timeout=60)
        assert pub.returncode == 0, pub.stderr
        deadline = time.monotonic() + 10
        while not httpx.get(base + "/models", headers=headers).json()["models"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        d = httpx.get(f"{base}/models/{MID}", headers=headers).json()
        assert d["servable"] is True, d
        r = httpx.post(f"{base}/models/{MID}/invoke", headers=headers, timeout=60,
                       json={"request": {"prompt": "hello", "max_tokens": 3}})
        assert r.status_code == 200, r.text
        assert r.json()["identity"]["release"] == "tiny-r1"
    finally:
        assert stop(gateway) == 0, (folder / "gw.log").read_text()
        assert stop(runtime) == 0, (folder / "boot.log").read_text()
