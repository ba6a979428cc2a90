"""The default models of ``aotx serve``: registered on first run, idempotently.

For the runtime's first text model and its embedding model: the artifact's
blobs are copied out of the runtime file (so the store holds exactly what the
runtime loaded), a release is minted with the runtime's own descriptor and
build commit, marked deployed on this runtime, a model is published under
``aotx/default/<type>/<commit 12>-<artifact 12>`` with the package's default
spec (``router/spec/builtin``), and the level-0 alias ``default/text`` /
``default/embedding`` is set on it.  Every step is skipped when already done,
so a second start of the same build writes nothing (no event either).  An
alias an operator pointed at a model outside ``aotx/default/`` is never moved.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotx_trio.errors import NotFound
from aotx_trio.identity import Descriptor, tree_listing
from aotx_trio.registry.records import Alias, ArtifactRef, Deployment
from aotx_trio.registry.store import StoreBackend
from aotx_trio.router.aliases import set_alias
from aotx_trio.router.registry import Registry
from aotx_trio.router.spec.builtin import default_spec

log = logging.getLogger("aotx.router.defaults")

ALIASES = {"textgen": "default/text", "embedding": "default/embedding"}
PREFIX = "aotx/default/"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Extent:
    """One file of an artifact: ``length`` bytes at ``offset`` of ``path``."""

    name: str
    path: Path
    offset: int
    length: int


def _chunks(e: Extent) -> Iterator[bytes]:
    with e.path.open("rb") as f:
        f.seek(e.offset)
        left = e.length
        while left > 0:
            chunk = f.read(min(CHUNK, left))
            if not chunk:
                raise OSError(f"{e.path} ends inside the extent of {e.name}")
            left -= len(chunk)
            yield chunk


def store_extents(store: StoreBackend, kind: str, files: Sequence[Extent]) -> ArtifactRef:
    """Copy an artifact (one GGUF extent, or the files of an embedding folder) into the
    store's blobs (blocking; blobs already present are not rewritten)."""
    if kind == "textgen":
        (one,) = files
        sha, size = store.blob_put(_chunks(one))
        return ArtifactRef(sha256=sha, kind="gguf", size=size)
    rows = []
    for f in files:
        sha, size = store.blob_put(_chunks(f))
        rows.append((f.name, sha, size))
    listing, _ = store.blob_put([tree_listing(rows)])
    return ArtifactRef(sha256=listing, kind="embedding_folder", size=sum(r[2] for r in rows))


def ids(kind: str, commit: str, artifact_sha256: str) -> tuple[str, str]:
    """(model id, release name) of a default model."""
    tail = f"{commit[:12]}-{artifact_sha256[:12]}"
    return f"{PREFIX}{kind}/{tail}", f"aotx-{kind}-{tail}"


async def register_one(reg: Registry, identity: Mapping[str, Any], row: Mapping[str, Any],
                       files: Sequence[Extent]) -> str:
    kind = str(row["kind"])
    commit, runtime = str(identity["source_commit"]), str(identity["runtime_id"])
    model_id, release = ids(kind, commit, str(row["artifact_sha256"]))
    try:
        await reg.get_model(model_id)
        known = True
    except NotFound:
        known = False
    if not known:
        log.info("registering the default %s model %s", kind, model_id)
        ref = await reg.run(store_extents, reg.store, kind, files)
        if ref.sha256 != row["artifact_sha256"]:
            raise RuntimeError(f"the {kind} artifact copied from the runtime file has sha256 "
                               f"{ref.sha256}, the runtime reports {row['artifact_sha256']}")
        await reg.mint_release(release, ref, Descriptor.model_validate(row["descriptor"]),
                               commit)
        await reg.publish(model_id, {
            "model_type": kind, "artifact": ref.model_dump(mode="json"),
            "serving": {"runtime_release": {"name": release, "source_commit": commit},
                        "spec": default_spec(kind)}})
    if await reg.read(Deployment, "deployments", f"{release}/{runtime}") is None:
        await reg.deploy_release(release, runtime)
    alias = ALIASES[kind]
    got = await reg.read(Alias, "aliases", alias)
    if got is None or (got[0].target != model_id and got[0].target.startswith(PREFIX)
                       and got[0].level == 0):
        await set_alias(reg, alias, model_id, 0)
    return model_id


async def register_defaults(reg: Registry, identity: Mapping[str, Any],
                            sources: Mapping[str, Sequence[Extent]]) -> list[str]:
    """Register the runtime's first loaded model of each type; ``sources`` maps the
    runtime's model names (its identity rows' ``name``) to their files.  Their ids."""
    out = []
    for kind in ALIASES:
        row = next((a for a in identity.get("artifacts") or [] if a["kind"] == kind), None)
        files = sources.get(str(row["name"])) if row is not None else None
        if row is None or not files:
            log.warning("the runtime has no loaded %s model: no default registered", kind)
            continue
        out.append(await register_one(reg, identity, row, files))
    return out
