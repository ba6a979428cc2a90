"""The package stays ruff-clean and mypy --strict clean (pyproject.toml configures both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=280)


def test_ruff() -> None:
    proc = _run("ruff", "check", "aotx_trio", "tests", "scripts", "build.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    proc = _run("mypy")
    assert proc.returncode == 0, proc.stdout + proc.stderr
