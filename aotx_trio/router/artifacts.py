"""Artifacts in the store's blobs: a GGUF file, or an embedding model folder as one
blob per file plus a tree listing (docs/formats/registry.md, "Blobs").

Blocking functions over a :class:`~aotx_trio.registry.store.StoreBackend`; the
registry runs them in a worker thread.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from aotx_trio._fs import atomic_file
from aotx_trio.errors import InvalidInput
from aotx_trio.identity import canonical
from aotx_trio.registry.records import ArtifactRef, check_sha256
from aotx_trio.registry.store import StoreBackend

TREE_KIND = "aotx.tree.v1"
CHUNK = 1 << 20
GGUF_MAGIC = b"GGUF"
#: called with the number of bytes just copied
Progress = Callable[[int], None]


def _chunks(path: Path, progress: Progress | None) -> Iterator[bytes]:
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            if progress is not None:
                progress(len(chunk))
            yield chunk


def artifact_size(path: str | Path) -> int:
    """Bytes a copy of ``path`` (file or folder) moves, for a progress bar."""
    p = Path(path)
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    return p.stat().st_size


def _invalid(message: str, rule: str) -> InvalidInput:
    return InvalidInput(message, code="invalid_params", param="artifact", rule=rule)


def store_artifact(store: StoreBackend, path: str | Path,
                   progress: Progress | None = None) -> ArtifactRef:
    """Copy a GGUF file or an embedding model folder into the store's blobs."""
    p = Path(path)
    if p.is_file():
        with p.open("rb") as head:
            if head.read(4) != GGUF_MAGIC:
                raise _invalid(f"{p} is not a GGUF file", "loadable")
        sha, size = store.blob_put(_chunks(p, progress))
        return ArtifactRef(sha256=sha, kind="gguf", size=size)
    if not p.is_dir():
        raise _invalid(f"{p}: no such file or folder", "present")
    files = []
    total = 0
    for f in sorted(x for x in p.rglob("*") if x.is_file()):
        rel = f.relative_to(p).as_posix()
        if any(part.startswith(".") for part in rel.split("/")):
            continue
        sha, size = store.blob_put(_chunks(f, progress))
        files.append({"path": rel, "sha256": sha, "size": size})
        total += size
    listing = canonical({"kind": TREE_KIND, "files": files})
    _check_tree(json.loads(listing))
    sha, _ = store.blob_put([listing])
    return ArtifactRef(sha256=sha, kind="embedding_folder", size=total)


def _check_tree(tree: dict[str, object]) -> list[dict[str, object]]:
    files = tree.get("files")
    if tree.get("kind") != TREE_KIND or not isinstance(files, list):
        raise _invalid("the artifact's tree listing is malformed", "loadable")
    names = {str(f.get("path")) for f in files if isinstance(f, dict)}
    if not ({"config.json", "tokenizer.json"} <= names
            and any(n.endswith(".safetensors") for n in names)):
        raise _invalid("an embedding model folder needs config.json, tokenizer.json and "
                       "a .safetensors file", "loadable")
    return files


def _read_blob(store: StoreBackend, sha256: str) -> bytes:
    return b"".join(store.blob_read(sha256))


def verify_artifact(store: StoreBackend, ref: ArtifactRef) -> list[str]:
    """The blobs of ``ref`` that are missing (empty: present); raises when a present
    artifact cannot be loaded (not GGUF, a tree without the model files)."""
    check_sha256(ref.sha256, "artifact.sha256")
    if store.blob_size(ref.sha256) is None:
        return [ref.sha256]
    if ref.kind == "gguf":
        head = next(store.blob_read(ref.sha256), b"")
        if not head.startswith(GGUF_MAGIC):
            raise _invalid(f"artifact {ref.sha256} is not a GGUF file", "loadable")
        return []
    try:
        tree = json.loads(_read_blob(store, ref.sha256))
    except (ValueError, UnicodeDecodeError):
        raise _invalid(f"artifact {ref.sha256} is not a tree listing", "loadable") from None
    return [str(f["sha256"]) for f in _check_tree(tree)
            if store.blob_size(str(f["sha256"])) is None]


def export_artifact(store: StoreBackend, ref: ArtifactRef, dest: str | Path) -> Path:
    """Write the artifact out of the store: a GGUF file at ``dest`` or a folder."""
    out = Path(dest)
    if ref.kind == "gguf":
        with atomic_file(out) as f:
            for chunk in store.blob_read(ref.sha256):
                f.write(chunk)
        return out
    tree = json.loads(_read_blob(store, ref.sha256))
    for entry in _check_tree(tree):
        target = out / str(entry["path"])
        if ".." in Path(str(entry["path"])).parts:
            raise _invalid("a tree path leaves the folder", "loadable")
        os.makedirs(target.parent, exist_ok=True)
        with atomic_file(target) as f:
            for chunk in store.blob_read(str(entry["sha256"])):
                f.write(chunk)
    return out
