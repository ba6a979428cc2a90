"""The native library: loading it and translating its return codes (the one place).

``ffi`` and ``lib`` come from the cffi extension ``aotx_trio._native`` built by
``build.py``.  During development a partial build can be loaded instead by
pointing ``AOTX_NATIVE_DIR`` at the folder ``build.py --out`` wrote.

Every C call that returns a code goes through :func:`check`, which returns the
code when it is 0 (or, with ``ok_positive=True``, any non-negative value) and
otherwise raises the exception class :mod:`aotx_trio.errors` maps its name to.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from aotx_trio import errors


def _load() -> Any:
    override = os.environ.get("AOTX_NATIVE_DIR")
    if override:
        found = sorted(Path(override).glob("_native*.so"))
        if not found:
            raise ImportError(f"AOTX_NATIVE_DIR={override!r} holds no _native*.so")
        spec = importlib.util.spec_from_file_location("aotx_trio._native", found[0])
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["aotx_trio._native"] = mod
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module("aotx_trio._native")


_mod = _load()
ffi: Any = _mod.ffi
lib: Any = _mod.lib


def code_name(code: int) -> str:
    return str(ffi.string(lib.aotx_code_name(code)).decode())


def strerror(code: int) -> str:
    return str(ffi.string(lib.aotx_strerror(code)).decode())


def error_for(code: int, detail: str | None = None, **fields: Any) -> errors.AotxError:
    """The exception for a nonzero native code (not raised)."""
    name = code_name(code)
    message = strerror(code) if detail is None else f"{strerror(code)}: {detail}"
    return errors.from_native(code, name, message, **fields)


def check(code: int, detail: str | None = None, *, ok_positive: bool = False, **fields: Any) -> int:
    """Return ``code`` if it means success, else raise the mapped exception."""
    if code == 0 or (ok_positive and code > 0):
        return code
    raise error_for(code, detail, **fields)


def capacities() -> dict[str, int]:
    c = ffi.new("aotx_capacities *")
    lib.aotx_capacities_get(c)
    return {name: int(getattr(c, name)) for name in (
        "participants", "spaces", "conversations", "members", "receipts",
        "command_bytes", "result_bytes", "memory")}
