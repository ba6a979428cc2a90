"""The fault-and-load harness as part of the suite (scripts/chaos.py): real
``aotx serve`` and ``aotx boot`` + ``aotx gateway serve`` processes killed with
``kill -9`` every few seconds under load, SSE subscribers following inputs'
output across the kills, then every acknowledged operation and every byte
received audited: zero lost, zero applied twice, no byte twice; the third run
also injects journal write faults (EIO, ENOSPC, slow fsync) into the runtime.
The embedded run is the issue's 60-second run; the split and disk-fault runs
are 30 s each (about 2.5 minutes in all).  ``scripts/chaos.py --minutes 30`` is
the long run (docs/reliability.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _gateway_env import make_runtime_file

pytestmark = pytest.mark.timeout(400)
ROOT = Path(__file__).resolve().parent.parent


FAULTS = "eio=0.01,enospc=0.01,fsync_eio=0.01,slow_fsync=0.05:0.1"


@pytest.mark.parametrize(("split", "faults", "seconds"),
                         [(False, None, 60), (True, None, 30), (False, FAULTS, 30)],
                         ids=["embedded", "split", "disk-faults"])
def test_nothing_acknowledged_is_lost_under_kill_9(tmp_path: Path, split: bool,
                                                  faults: str | None, seconds: int) -> None:
    runtime = make_runtime_file(tmp_path / "rt")
    cmd = [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--seconds", str(seconds),
           "--clients", "8", "--kill-every", "4", "--runtime", str(runtime)]
    if split:
        cmd.append("--split")
    if faults:
        cmd += ["--disk-faults", faults]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=360,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["violations"] == []
    assert result["kills"] >= seconds // 15       # the faults really happened ...
    assert result["acknowledged"] > 200            # ... under real load
    assert result["retries"] > 0                   # and requests really were cut off
    assert result["subscriptions"] > 0 and result["subscription_bytes"] > 0  # SSE followed
