"""Build the native extension ``aotx_trio._native`` (cffi, out-of-line API mode).

``pip install .`` (and editable installs) call this through setup.py's
``cffi_modules``.  It can also be run by hand during development::

    python build.py                      # compile everything, in place (aotx_trio/_native*.so)
    python build.py --only device,journal --out build/dev-device
                                         # some areas, into another folder; point
                                         # AOTX_NATIVE_DIR at it to load it

csrc/ holds one folder per area (``device``, ``journal``, ``engine``, ``tokenizer``,
``embed``; every folder directly under csrc/ is an area) next to the shared bits at
its root (``aotx.h``, ``common.c``, ``cpu_internal.h``).  An area's sources are every
``*.c`` under its folder, subfolders included (csrc/engine/{model,kv,backend,kernels,
sampling,threads}/); its public headers (``aotx_*.h``) sit at the area folder's root.
``--only`` names areas; ``common`` (csrc/*.c) is always in, and naming it is allowed.
Every area root is on the include path (whatever ``--only`` says), so sources include
any public header by its bare name; internal headers are included by bare name from
their own folder (or, shared across an area's subfolders, from the area root).

Declarations for cffi are the text between ``/* CDEF-BEGIN */`` and
``/* CDEF-END */`` in ``csrc/aotx.h`` and every area's ``aotx_*.h``; that text
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


def areas() -> list[Path]:
    """The area folders: every folder directly under csrc/."""
    return sorted(d for d in CSRC.iterdir() if d.is_dir() and not d.name.startswith("."))


def select(only: list[str] | None) -> tuple[list[Path], list[Path]]:
    """Headers and sources to build; ``common`` and ``aotx.h`` are always in."""
    chosen = areas()
    if only is not None:
        names = {a.name for a in chosen}
        unknown = sorted(set(only) - names - {"common"})
        if unknown:
            raise SystemExit(f"build.py: --only {','.join(unknown)}: not an area "
                             f"(areas: {', '.join(sorted(names))}; common is always in)")
        chosen = [a for a in chosen if a.name in only]
    headers = sorted((h for a in chosen for h in a.glob("aotx_*.h")), key=_header_rank)
    sources = sorted(CSRC.glob("*.c")) + sorted(s for a in chosen for s in a.rglob("*.c"))
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
        include_dirs=[str(d if absolute else d.relative_to(ROOT)) for d in [CSRC, *areas()]],
        define_macros=capacity_macros(),
        extra_compile_args=cflags,
        extra_link_args=ldflags,
    )
    return ffi


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated areas to build: folders of csrc/ "
                                   "(common is always in)")
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
