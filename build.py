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
``--only`` names areas; ``common`` (csrc/*.c) is always in, and naming it is allowed;
an area brings the ones it calls along (``cuda`` -> ``engine`` -> ``tokenizer``).
Every area root is on the include path (whatever ``--only`` says), so sources include
any public header by its bare name; internal headers are included by bare name from
their own folder (or, shared across an area's subfolders, from the area root).

Declarations for cffi are the text between ``/* CDEF-BEGIN */`` and
``/* CDEF-END */`` in ``csrc/aotx.h`` and every area's ``aotx_*.h``; that text
must be plain C that cffi's parser accepts (no #include, integer #defines only).

CUDA (csrc/cuda/, docs/engine.md "CUDA"): the area's ``*.c`` (host logic, no GPU needed)
is built like every other; its ``*.cu`` kernels are compiled by nvcc into objects that
are linked into the same extension, with the CUDA runtime linked statically
(``-lcudart_static``: the installed package needs only a driver), when an nvcc is found:
``$CUDA_HOME/bin/nvcc``, else ``nvcc`` on PATH.  ``AOTX_CUDA=0`` builds CPU-only even
then, ``AOTX_CUDA=1`` makes a missing nvcc an error; ``AOTX_DEBUG=1`` (the sanitizer
build) is CPU-only unless ``AOTX_CUDA=1``.  ``AOTX_CUDA_ARCHS`` lists the SM targets
(default ``90``: the H200; ``80,90`` for two).  Warnings are errors in the CUDA sources.
``aotx_cuda_available()`` tells which build a library is.

Capacities are build settings: ``AOTX_MAX_PARTICIPANTS`` and friends (see
``CAPACITY_DEFAULTS``) are read from the environment and compiled in; the
library reports the values it was built with (``aotx_capacities``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
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
                 "model", "device", "embed", "cuda", "cuda_gpu"]
# Areas that call into others: --only brings these along.
_NEEDS = {"cuda": ("engine",), "engine": ("tokenizer",)}
# Headers whose declarations exist only in a build with the CUDA kernels.
_CUDA_ONLY_HEADERS = {"aotx_cuda_gpu.h"}


def _header_rank(h: Path) -> tuple[int, str]:
    area = h.stem[len("aotx_"):]
    return (_HEADER_ORDER.index(area) if area in _HEADER_ORDER else len(_HEADER_ORDER), area)


def areas() -> list[Path]:
    """The area folders: every folder directly under csrc/."""
    return sorted(d for d in CSRC.iterdir() if d.is_dir() and not d.name.startswith("."))


@dataclass(frozen=True)
class Cuda:
    """The CUDA toolkit a build uses."""

    nvcc: Path
    lib_dir: Path           # holds libcudart_static.a
    archs: tuple[str, ...]  # SM numbers, "90"
    version: int            # CUDART_VERSION, 13000 for 13.0


def find_cuda(debug: bool = False) -> Cuda | None:
    """The toolkit to compile csrc/cuda/*.cu with, or None for a CPU-only build."""
    want = os.environ.get("AOTX_CUDA", "")
    if want not in ("", "0", "1"):
        raise SystemExit(f"build.py: AOTX_CUDA={want!r} must be 0 or 1 (unset: when nvcc is found)")
    if want == "0" or (debug and want != "1"):
        return None
    home = os.environ.get("CUDA_HOME")
    found = Path(home) / "bin" / "nvcc" if home else None
    if found is None or not found.is_file():
        which = shutil.which("nvcc")
        found = Path(which) if which else None
    if found is None:
        if want == "1":
            raise SystemExit("build.py: AOTX_CUDA=1 but no nvcc (CUDA_HOME/bin/nvcc or PATH)")
        return None
    nvcc = found.resolve()
    # nvcc may be a wrapper script: ask it where its toolkit is (TOP, LIBRARIES)
    dry = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                         capture_output=True, text=True)
    text = dry.stdout + dry.stderr
    top = re.search(r"^#\$ TOP=(.*)$", text, re.M)
    root = Path(top.group(1).strip()).resolve() if top else nvcc.parent.parent
    cands = [Path(d).resolve() for d in re.findall(r'"-L([^"]+)"', text) if "stubs" not in d]
    cands += [root / "lib64", root / "targets" / "x86_64-linux" / "lib", root / "lib"]
    libs = [d for d in cands if (d / "libcudart_static.a").is_file()]
    if not libs:
        raise SystemExit(f"build.py: {nvcc} has no libcudart_static.a under {root}")
    archs = tuple(a.strip() for a in os.environ.get("AOTX_CUDA_ARCHS", "90").split(",")
                  if a.strip())
    if not archs or not all(re.fullmatch(r"\d{2,3}a?", a) for a in archs):
        raise SystemExit("build.py: AOTX_CUDA_ARCHS must list SM numbers such as 90 or 80,90")
    headers = [d / "cuda_runtime_api.h"
               for d in (root / "include", root / "targets" / "x86_64-linux" / "include")]
    found_h = [h for h in headers if h.is_file()]
    m = re.search(r"#define CUDART_VERSION\s+(\d+)", found_h[0].read_text()) if found_h else None
    return Cuda(nvcc=nvcc, lib_dir=libs[0], archs=archs, version=int(m.group(1)) if m else 0)


def compile_cuda(cuda: Cuda, sources: list[Path], out_dir: Path) -> list[Path]:
    """nvcc -c each source (in parallel) into out_dir; an object is reused while the
    hash of its source, every header it may include and the flags is unchanged."""
    out_dir.mkdir(parents=True, exist_ok=True)
    gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in cuda.archs]
    flags = ["-O3", "-std=c++17", "-lineinfo", *gencode, "--Werror", "all-warnings",
             "-Xcompiler", "-fPIC,-Wall,-Wextra,-Wno-unused-parameter,-Werror",
             *[f"-I{d}" for d in [CSRC, *areas()]],
             *[f"-D{k}={v}" for k, v in capacity_macros()]]
    headers = sorted(p for d in [CSRC, *areas()] for p in d.rglob("*.h*"))
    dep = hashlib.sha256(str(cuda.nvcc).encode() + " ".join(flags).encode())
    for h in headers:
        dep.update(h.read_bytes())

    def one(src: Path) -> Path:
        key = dep.copy()
        key.update(src.read_bytes())
        obj = out_dir / f"{src.stem}-{key.hexdigest()[:16]}.o"
        if not obj.is_file():
            tmp = obj.with_suffix(".o.tmp")
            run = subprocess.run([str(cuda.nvcc), *flags, "-c", str(src), "-o", str(tmp)],
                                 capture_output=True, text=True)
            if run.returncode != 0:
                shown = src.relative_to(ROOT) if src.is_relative_to(ROOT) else src
                raise SystemExit(f"build.py: nvcc failed on {shown}:\n"
                                 f"{run.stdout}{run.stderr}")
            os.replace(tmp, obj)
            for old in out_dir.glob(f"{src.stem}-*.o"):   # earlier versions of this source
                if old != obj:
                    old.unlink(missing_ok=True)
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(one, sources))


def select(only: list[str] | None, cuda: bool = False) -> tuple[list[Path], list[Path]]:
    """Headers and sources to build; ``common`` and ``aotx.h`` are always in; the
    CUDA-only headers only when ``cuda``."""
    chosen = areas()
    if only is not None:
        names = {a.name for a in chosen}
        unknown = sorted(set(only) - names - {"common"})
        if unknown:
            raise SystemExit(f"build.py: --only {','.join(unknown)}: not an area "
                             f"(areas: {', '.join(sorted(names))}; common is always in)")
        wanted, todo = set(only), list(only)
        while todo:
            for dep in _NEEDS.get(todo.pop(), ()):
                if dep not in wanted:
                    wanted.add(dep)
                    todo.append(dep)
        chosen = [a for a in chosen if a.name in wanted]
    headers = sorted((h for a in chosen for h in a.glob("aotx_*.h")
                      if cuda or h.name not in _CUDA_ONLY_HEADERS), key=_header_rank)
    sources = sorted(CSRC.glob("*.c")) + sorted(s for a in chosen for s in a.rglob("*.c"))
    return [CSRC / "aotx.h", *headers], sources


def cuda_sources(only: list[str] | None) -> list[Path]:
    """The CUDA kernels of the selected areas (csrc/cuda/*.cu)."""
    if only is not None and "cuda" not in only:
        return []
    return sorted((CSRC / "cuda").glob("*.cu"))


def build_cuda(only: list[str] | None) -> tuple[Cuda, list[Path]] | None:
    """Find the toolkit and compile the selected areas' kernels (None: CPU-only), and say
    which on stderr."""
    cu = cuda_sources(only)
    cuda = find_cuda(debug=os.environ.get("AOTX_DEBUG") == "1") if cu else None
    if cuda is None:
        if cu:
            print("build.py: CUDA not built (CPU only: no nvcc, AOTX_CUDA=0 or AOTX_DEBUG=1)",
                  file=sys.stderr)
        return None
    objects = compile_cuda(cuda, cu, ROOT / "build" / "cuda")
    print(f"build.py: CUDA {cuda.version // 1000}.{cuda.version % 1000 // 10} kernels for "
          + ", ".join(f"sm_{a}" for a in cuda.archs), file=sys.stderr)
    return cuda, objects


_AUTO = object()


def make_ffi(only: list[str] | None = None, absolute: bool = False,
             cuda_objects: tuple[Cuda, list[Path]] | object | None = _AUTO) -> FFI:
    """The cffi builder.  ``cuda_objects``: the toolkit and the compiled kernels to link,
    None for a CPU-only build, or left out: :func:`build_cuda` decides (setup.py)."""
    if cuda_objects is _AUTO:
        cuda_objects = build_cuda(only)
    assert cuda_objects is None or isinstance(cuda_objects, tuple)
    headers, sources = select(only, cuda=bool(cuda_objects and cuda_objects[1]))
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
    macros = capacity_macros()
    objects: list[str] = []
    if cuda_objects and cuda_objects[1]:
        cuda, objs = cuda_objects
        macros += [("AOTX_HAVE_CUDA", "1"), ("AOTX_CUDART_VERSION", str(cuda.version)),
                   ("AOTX_CUDA_ARCHS", '"' + ",".join(cuda.archs) + '"')]
        objects = [str(o) for o in objs]
        # the runtime statically (only a driver needed at run time), and what it needs
        ldflags += [f"-L{cuda.lib_dir}", "-lcudart_static", "-ldl", "-lrt", "-lstdc++"]
    ffi.set_source(
        "aotx_trio._native",
        includes,
        # setuptools wants relative paths; ffi.compile() runs in a temp dir.
        sources=[str(s if absolute else s.relative_to(ROOT)) for s in sources],
        include_dirs=[str(d if absolute else d.relative_to(ROOT)) for d in [CSRC, *areas()]],
        define_macros=macros,
        extra_compile_args=cflags,
        extra_objects=objects,
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
