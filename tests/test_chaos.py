"""The fault-and-load harness as part of the suite (scripts/chaos.py): real
``aotx serve`` and ``aotx boot`` + ``aotx gateway serve`` processes killed with
``kill -9`` every few seconds under load, then every acknowledged operation
audited: zero lost, zero applied twice.  A minute in all (30 s per deployment);
``scripts/chaos.py --minutes 30`` is the long run."""

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


@pytest.mark.parametrize("split", [False, True], ids=["embedded", "split"])
def test_nothing_acknowledged_is_lost_under_kill_9(tmp_path: Path, split: bool) -> None:
    runtime = make_runtime_file(tmp_path / "rt")
    cmd = [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--seconds", "30",
           "--clients", "8", "--kill-every", "4", "--runtime", str(runtime)]
    if split:
        cmd.append("--split")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=360,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["violations"] == []
    assert result["kills"] >= 5                    # the faults really happened ...
    assert result["acknowledged"] > 200            # ... under real load
    assert result["retries"] > 0                   # and requests really were cut off
