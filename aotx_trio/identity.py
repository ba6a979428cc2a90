"""Digests and identity: the leaf both the runtime (which reports who it is) and the
router (which checks it) import (docs/decisions.md, "Deployment, identity and
attestation").  It imports nothing of the package, so the runtime process never
loads the router or its spec DSL.

* :func:`canonical`, :func:`sha256_hex` and :class:`Doc` -- canonical JSON documents;
* :class:`Descriptor` and :func:`descriptor_sha256` -- the engine settings a model is
  loaded with, and the digest a release's ``descriptor_sha256`` is;
* :func:`build_commit` -- the aotx build's 40-hex commit: ``$AOTX_SOURCE_COMMIT``,
  else ``git rev-parse HEAD`` of the installed package, else 40 zeros;
* :func:`tree_sha256` -- the artifact sha256 of an embedding model folder from its
  files' (path, sha256, size), exactly as ``router.artifacts.store_artifact`` computes it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

log = logging.getLogger("aotx.identity")

UNKNOWN_COMMIT = "0" * 40
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
TREE_KIND = "aotx.tree.v1"


def canonical(value: Any) -> bytes:
    """Canonical JSON: UTF-8, keys sorted, no whitespace."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def body(self) -> bytes:
        return canonical(self.model_dump(mode="json"))


KV_TYPES = ("f16", "f32")
DEFAULT_KV_TYPE = "f16"


class Descriptor(Doc):
    """The engine settings a runtime loads a release's artifact with.

    ``kv_type`` is the element type of the KV pages: ``"f16"`` (binary16) or
    ``"f32"``; None (unset) means the runtime's default, f16 (:data:`DEFAULT_KV_TYPE`).
    An unset ``kv_type`` is left out of the document (:meth:`body`, every dump), so
    a descriptor that does not set it has the canonical body, and the
    ``descriptor_sha256``, it had before the field existed; one that sets it (even
    to the default) is another descriptor with another digest.
    """

    backend: Literal["cpu", "cuda"] = "cpu"
    threads: int = Field(default=0, ge=0, le=1024)
    kv_page_tokens: int = Field(default=8, ge=1, le=4096)
    context: int = Field(default=2048, ge=16, le=1 << 20)
    kv_type: Literal["f16", "f32"] | None = None

    @model_serializer(mode="wrap")
    def _unset_kv_type_is_absent(self, handler: SerializerFunctionWrapHandler,
                                 ) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("kv_type", "") is None:
            del out["kv_type"]
        return out

    @property
    def kv_f16(self) -> bool:
        """Whether the runtime loads the artifact with binary16 KV pages."""
        return (self.kv_type or DEFAULT_KV_TYPE) == "f16"


def source_commit() -> str:
    """``$AOTX_SOURCE_COMMIT``, else ``git rev-parse HEAD`` of the installed package's
    checkout, else ``""`` (the one place either is read)."""
    value = os.environ.get("AOTX_SOURCE_COMMIT", "").strip()
    if value:
        return value
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.cache
def build_commit() -> str:
    """The commit of this aotx build (cached for the process); 40 zeros if unknown."""
    value = source_commit()
    if not _HEX40.match(value):
        log.warning("no source commit for this build (set AOTX_SOURCE_COMMIT); "
                    "reporting %s", UNKNOWN_COMMIT)
        return UNKNOWN_COMMIT
    return value


def descriptor_sha256(descriptor: Mapping[str, Any]) -> str:
    """The SHA-256 of a descriptor's canonical JSON (validated as a Descriptor)."""
    return sha256_hex(Descriptor.model_validate(dict(descriptor)).body())


def tree_listing(files: Iterable[tuple[str, str, int]]) -> bytes:
    """The ``aotx.tree.v1`` listing of (relative path, sha256, size) files (canonical
    JSON, files in path order as ``artifacts.store_artifact`` walks a folder)."""
    rows = sorted(files, key=lambda f: Path(f[0]).parts)
    return canonical({"kind": TREE_KIND,
                      "files": [{"path": p, "sha256": s, "size": n} for p, s, n in rows]})


def tree_sha256(files: Iterable[tuple[str, str, int]]) -> str:
    """The artifact sha256 of a folder of (relative path, sha256, size) files."""
    return sha256_hex(tree_listing(files))
