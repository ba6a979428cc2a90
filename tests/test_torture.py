"""scripts/torture_journal.py: kill -9 a real writer at random points, lose nothing acked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "torture_journal.py"


def run_torture(tmp_path: Path, *args: str, timeout: float) -> dict[str, int]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


@pytest.mark.slow
@pytest.mark.timeout(660)   # the script's own limit is 600 s
def test_kill9_torture_ci_run(tmp_path: Path) -> None:
    stats = run_torture(tmp_path, "--cycles", "200", "--seed", "2024", timeout=600)
    assert stats["cycles"] == 200
    assert stats["lost"] == 0 and stats["duplicated"] == 0
    assert stats["acked"] > 200                    # the writers really made progress
    assert stats["transfers"] >= stats["acked"]
    assert 1 < stats["boots"] <= 201               # reopened and continued across kills


@pytest.mark.slow
def test_kill9_torture_cold_writer_processes(tmp_path: Path) -> None:
    """The script itself in --writer mode (a fresh interpreter per cycle)."""
    stats = run_torture(tmp_path, "--cycles", "4", "--spawn", "exec", "--seed", "5",
                        "--max-delay", "0.2", timeout=240)
    assert stats["cycles"] == 4 and stats["lost"] == 0


def test_torture_detects_a_lost_acknowledgement(tmp_path: Path) -> None:
    """The checker is not vacuous: an ack for a transfer the file lacks fails the run."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import torture_journal as tj
    finally:
        sys.path.remove(str(SCRIPT.parent))
    from aotx_trio.native.journal import XFER_ADMISSION, Journal, JournalParams

    j = Journal(JournalParams(lineage=tj.LINEAGE))
    j.enqueue(XFER_ADMISSION, tj.payload_for("0.0.0"))
    image = bytearray(j.header())
    while (d := j.drain()) is not None:
        image += d[1]
        j.ack()
    path = tmp_path / "journal.aotxj"
    path.write_bytes(bytes(image))
    stats = tj.Stats()
    assert tj.verify(path, {"0.0.0"}, set(), stats) == {"0.0.0"}
    with pytest.raises(AssertionError, match="acknowledged transfers lost"):
        tj.verify(path, {"0.0.0", "0.0.1"}, set(), stats)
    with pytest.raises(AssertionError, match="vanished"):
        tj.verify(path, {"0.0.0"}, {"0.0.0", "9.9.9"}, stats)
    j.enqueue(XFER_ADMISSION, tj.payload_for("0.0.0"))
    while (d := j.drain()) is not None:
        image += d[1]
        j.ack()
    path.write_bytes(bytes(image))
    with pytest.raises(AssertionError, match="more than once"):
        tj.verify(path, set(), set(), stats)
