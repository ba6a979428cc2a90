"""The command line parses every documented command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aotx_trio import cli


@pytest.mark.parametrize("argv", [
    ["serve", "--help"], ["pack", "--help"], ["boot", "--help"], ["gateway", "serve", "--help"],
    ["gateway", "write-grants", "--help"], ["generate", "--help"], ["embed", "--help"],
])
def test_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    assert info.value.code == 0
    assert "usage: aotx" in capsys.readouterr().out


def test_missing_required_argument_names_it() -> None:
    proc = subprocess.run([sys.executable, "-m", "aotx_trio", "pack"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--runtime" in proc.stderr
