"""Who served an invoke: the build commit, artifact and descriptor digests a runtime
reports, and the router's check of them against the release it expects
(docs/decisions.md, "Deployment, identity and attestation").

Leaf helpers shared by the runtime (which reports) and the router (which checks):

* :func:`build_commit` -- the aotx build's 40-hex commit: ``$AOTX_SOURCE_COMMIT``,
  else ``git rev-parse HEAD`` of the installed package, else 40 zeros;
* :func:`descriptor_sha256` -- the digest a release's ``descriptor_sha256`` is;
* :func:`tree_sha256` -- the artifact sha256 of an embedding model folder from its
  files' (path, sha256, size), exactly as ``artifacts.store_artifact`` computes it;
* :func:`mismatches` -- the fields where a runtime's observed identity differs from
  a release's expected one (502 ``attestation_mismatch`` when non-empty).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from aotx_trio.router.records import Descriptor, Release, canonical, sha256_hex

log = logging.getLogger("aotx.router.identity")

UNKNOWN_COMMIT = "0" * 40
_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
TREE_KIND = "aotx.tree.v1"


@functools.cache
def build_commit() -> str:
    """The commit of this aotx build (cached for the process)."""
    value = os.environ.get("AOTX_SOURCE_COMMIT", "").strip()
    if not value:
        try:
            value = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                   text=True, timeout=10, check=True,
                                   cwd=Path(__file__).resolve().parent).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            value = ""
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


def expected(release: Release) -> dict[str, Any]:
    """What a runtime serving ``release`` must report."""
    return {"source_commit": release.source_commit,
            "artifact_sha256": release.artifact.sha256,
            "descriptor_sha256": release.descriptor_sha256}


def mismatches(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``[{"field", "expected", "observed"}]`` for each field that differs."""
    return [{"field": k, "expected": v, "observed": seen.get(k)}
            for k, v in want.items() if seen.get(k) != v]
