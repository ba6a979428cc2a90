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


def test_the_serve_commands_settle_the_heap_once_serving(
        monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    """``aotx serve`` asks serve_embedded to freeze the start-up heap once serving (tests
    calling serve_embedded themselves do not), and ``aotx gateway serve`` does too."""
    import argparse
    import inspect

    from aotx_trio import serve
    from aotx_trio.gateway import serve as gateway_serve
    from aotx_trio.runtime import boot

    seen: dict[str, object] = {}
    monkeypatch.setattr(serve, "run_trio", lambda fn, *a: seen.update(fn.keywords))
    monkeypatch.setattr(serve.sys, "setswitchinterval", lambda s: None)
    monkeypatch.setattr(serve, "setup_logging", lambda: None)
    serve.main(argparse.Namespace(journal_max_bytes=None, journal_min_free_bytes=None,
                                  service_socket=False, data=str(tmp_path), bind="x:1"))
    assert seen["freeze_heap"] is True
    assert inspect.signature(serve.serve_embedded).parameters["freeze_heap"].default is False
    assert "_latency.tune_gc()" in inspect.getsource(gateway_serve._run)
    assert "_latency.tune_gc()" in inspect.getsource(boot._boot)
