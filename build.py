"""Build the native extension ``aotx_trio._native`` (cffi, out-of-line API mode).

``pip install .`` (and editable installs) call this through setup.py's
``cffi_modules``.  It can also be run by hand during development::

    python build.py                      # compile everything, in place (aotx_trio/_native*.so)
    python build.py --only device,journal --out build/dev-device
                                         # a subset, into another folder; point
                                         # AOTX_NATIVE_DIR at it to load it

Declarations for cffi are the text between ``/* CDEF-BEGIN */`` and
``/* CDEF-END */`` in ``csrc/aotx.h`` and every ``csrc/aotx_*.h``; that text
must be plain C that cffi's parser accepts (no #include, integer #defines only).

Capacities are build settings: ``AOTX_MAX_PARTICIPANTS`` and friends (see
``CAPACITY_DEFAULTS``) are read from the environment and compiled in; the
library reports the values it was built with (``aotx_capacities``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from cffi import FFI

ROOT = Path(__file__).resolve().parent
CSRC = ROOT / "csrc"

CAPACITY_DEFAULTS: dict[str, int] = {
    "AOTX_MAX_PARTICIPANTS": 1024,
    "AOTX_MAX_SPACES": 1024,
    "AOTX_MAX_CONVERSATIONS": 4096,
    "AOTX_MAX_MEMBERS": 4096,
    "AOTX_MAX_RECEIPTS": 1024,
    "AOTX_MAX_MEMORY": 4096,
    "AOTX_MAX_COMMAND_BYTES": 8192,
    "AOTX_MAX_RESULT_BYTES": 65536,
}

_CDEF = re.compile(r"/\* CDEF-BEGIN \*/(.*?)/\* CDEF-END \*/", re.S)


def capacity_macros() -> list[tuple[str, str]]:
    out = []
    for name, default in CAPACITY_DEFAULTS.items():
        raw = os.environ.get(name, str(default))
        if not raw.isdigit() or int(raw) <= 0:
            raise SystemExit(f"build.py: {name}={raw!r} must be a positive integer")
        out.append((name, raw))
    return out


# cffi reads declarations in order: areas that others build on come first.
_HEADER_ORDER = ["journal", "pool", "sgemm", "kernels", "tokenizer", "gguf", "kv", "sample",
                 "model", "device", "embed"]


def _header_rank(h: Path) -> tuple[int, str]:
    area = h.stem[len("aotx_"):]
    return (_HEADER_ORDER.index(area) if area in _HEADER_ORDER else len(_HEADER_ORDER), area)


def select(only: list[str] | None) -> tuple[list[Path], list[Path]]:
    """Headers and sources to build; ``common`` and ``aotx.h`` are always in."""
    headers = sorted(CSRC.glob("aotx_*.h"), key=_header_rank)
    sources = sorted(CSRC.glob("*.c"))
    if only is not None:
        stems = set(only) | {"common"}
        headers = [h for h in headers if h.stem[len("aotx_"):] in stems]
        sources = [s for s in sources if s.stem in stems or s.stem.split("_")[0] in stems]
    return [CSRC / "aotx.h", *headers], sources


def make_ffi(only: list[str] | None = None, absolute: bool = False) -> FFI:
    headers, sources = select(only)
    cdef_parts = []
    for h in headers:
        found = _CDEF.findall(h.read_text())
        cdef_parts.extend(found)
    ffi = FFI()
    ffi.cdef("\n".join(cdef_parts))
    includes = "\n".join(f'#include "{h.name}"' for h in headers)
    debug = os.environ.get("AOTX_DEBUG") == "1"
    cflags = ["-std=gnu11", "-pthread", "-fno-math-errno", "-Wall", "-Wextra",
              "-Wno-unused-parameter", "-Wno-unused-function"]
    cflags += ["-O0", "-g", "-fsanitize=address,undefined"] if debug else ["-O3", "-g1"]
    ldflags = ["-pthread", "-lm"] + (["-fsanitize=address,undefined"] if debug else [])
    ffi.set_source(
        "aotx_trio._native",
        includes,
        # setuptools wants relative paths; ffi.compile() runs in a temp dir.
        sources=[str(s if absolute else s.relative_to(ROOT)) for s in sources],
        include_dirs=[str(CSRC if absolute else CSRC.relative_to(ROOT))],
        define_macros=capacity_macros(),
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )
    return ffi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated source stems to build (common is always in)")
    ap.add_argument("--out", help="folder for the built module (default: in place, aotx_trio/)")
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else None
    ffi = make_ffi(only, absolute=True)
    tmp = ROOT / "build" / ("cffi-" + (args.only or "all").replace(",", "-"))
    built = Path(ffi.compile(tmpdir=str(tmp), verbose=False)).resolve()
    dest = Path(args.out) if args.out else ROOT / "aotx_trio"
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / built.name
    tmp_target = target.with_suffix(target.suffix + ".tmp")
    shutil.copy2(built, tmp_target)
    os.replace(tmp_target, target)  # atomic: a running test never sees half a file
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
