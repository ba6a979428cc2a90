"""The native library loads, reports its build capacities, and names its codes."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from aotx_trio import errors
from aotx_trio.native import lib as native

ROOT = Path(__file__).resolve().parent.parent


def _build_py() -> ModuleType:
    spec = importlib.util.spec_from_file_location("aotx_build_settings", ROOT / "build.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # build.py's dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


BUILD = _build_py()


def _field(macro: str) -> str:
    """AOTX_MAX_COMMAND_BYTES -> command_bytes (the aotx_capacities field)."""
    return macro.removeprefix("AOTX_MAX_").lower()


def test_capacities_are_the_build_settings() -> None:
    """The library reports what build.py compiled in (its defaults or AOTX_MAX_* from the
    environment, the same environment this test runs in), for every capacity."""
    want = {_field(name): int(value) for name, value in BUILD.capacity_macros()}
    assert native.capacities() == want


def test_header_defaults_are_build_py_defaults() -> None:
    """csrc/aotx.h's #ifndef fallbacks (a build without build.py) match CAPACITY_DEFAULTS."""
    header = (ROOT / "csrc" / "aotx.h").read_text()
    found = dict(re.findall(r"#ifndef (AOTX_MAX_\w+)\n#define \1 (\d+)", header))
    assert {k: int(v) for k, v in found.items()} == BUILD.CAPACITY_DEFAULTS
    assert {_field(k) for k in found} == set(native.capacities())


def test_common_code_names() -> None:
    assert native.code_name(0) == "ok"
    assert native.code_name(-2) == "invalid_argument"
    assert native.code_name(-99999) == "unknown_error"
    assert native.code_name(99) == "unknown_refusal"


def test_check_translates_codes() -> None:
    assert native.check(0) == 0
    assert native.check(5, ok_positive=True) == 5
    with pytest.raises(errors.InvalidInput) as info:
        native.check(-2, "field 'x'")
    assert info.value.code == "invalid_argument"
    assert "field 'x'" in info.value.message
    assert errors.http_status(info.value) == 422
    with pytest.raises(errors.DiskError):
        native.check(-3)


def test_error_envelope_shape() -> None:
    exc = errors.JournalHold("journal on hold", retry_after=1)
    assert exc.envelope() == {"error": {"code": "journal_hold", "message": "journal on hold",
                                        "retry_after": 1}}
    assert errors.http_status(exc) == 429
