"""Where the runtime serves an artifact: readiness from its ``identity`` call, and
on-demand loading of a GGUF it lacks (docs/decisions.md, "Deployment, identity and
attestation" and "On-demand loading")."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.identity import Descriptor, sha256_hex
from aotx_trio.registry.records import ArtifactRef
from aotx_trio.router.artifacts import export_artifact
from aotx_trio.router.dispatch import Caller, RuntimeLink
from aotx_trio.router.registry import Registry

log = logging.getLogger("aotx.router.deploy")


class Deployments:
    """The runtime's loaded artifacts as the router sees them."""

    def __init__(self, reg: Registry, link: RuntimeLink, cache_dir: Path | None) -> None:
        self.reg = reg
        self.link = link
        #: where GGUF artifacts are exported for on-demand loading (None: never)
        self.cache_dir = cache_dir

    async def identity(self) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = await self.link.call("identity", {})
        except errors.AotxError as exc:
            log.warning("runtime identity unavailable: %s", exc.message)
            return None
        return out

    @staticmethod
    def not_ready(model_type: str, artifact_sha256: str, engine_set: str | None,
                   ident: Mapping[str, Any] | None, descriptor_sha256: str | None = None,
                   ) -> tuple[list[str], str | None]:
        """(what is missing, the runtime's model name for the artifact: the one loaded
        with ``descriptor_sha256`` when there are several)."""
        if ident is None:
            return ["deployment"], None
        missing = []
        if engine_set is not None and engine_set not in (ident.get("engine_sets") or []):
            missing.append(f"engine_set({engine_set})")
        rows = [a for a in ident.get("artifacts") or []
                if a.get("artifact_sha256") == artifact_sha256 and a.get("kind") == model_type]
        rows.sort(key=lambda a: a.get("descriptor_sha256") != descriptor_sha256)
        if not rows:
            missing.append("deployment")
        return missing, str(rows[0]["name"]) if rows else None

    async def deployed(self, model_type: str, artifact: ArtifactRef,
                        engine_set: str | None, descriptor: Descriptor | None,
                        caller: Caller) -> tuple[list[str], str | None]:
        """Where the runtime serves the artifact; a GGUF it has not loaded is loaded on
        demand first when this router has an artifact cache (docs/decisions.md)."""
        want = None if descriptor is None else sha256_hex(descriptor.body())
        ident = await self.identity()
        missing, name = self.not_ready(model_type, artifact.sha256, engine_set, ident, want)
        if missing != ["deployment"] or ident is None or self.cache_dir is None \
                or artifact.kind != "gguf" or model_type != "textgen":
            return missing, name
        if await self.reg.run(self.reg.store.blob_size, artifact.sha256) is None:
            # a published artifact the store does not hold: a store-integrity failure,
            # never a fallback to anything else
            raise errors.UpstreamFailure(
                f"the store holds no blob for artifact {artifact.sha256}",
                code="blob_missing", missing=[artifact.sha256])
        path = await trio.to_thread.run_sync(self._cached, artifact)
        params: dict[str, Any] = {"principal": caller.principal,
                                  "actions": list(caller.actions), "path": str(path),
                                  "artifact_sha256": artifact.sha256,
                                  "descriptor": None if descriptor is None
                                  else descriptor.model_dump(mode="json")}
        try:
            row = await self.link.call("model.load", params)
        except errors.AotxError as exc:
            log.warning("on-demand load of %s failed: %s", artifact.sha256, exc.message)
            if isinstance(exc, errors.Forbidden | errors.OverCapacity):
                raise
            return missing, name
        log.info("artifact %s loaded on demand as %s", artifact.sha256, row["name"])
        return [], str(row["name"])

    def _cached(self, artifact: ArtifactRef) -> Path:
        """The artifact as a file in the cache folder (exported once, atomically)."""
        assert self.cache_dir is not None
        path = self.cache_dir / f"{artifact.sha256}.gguf"
        if not (path.is_file() and path.stat().st_size == artifact.size):
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            export_artifact(self.reg.store, artifact, path)
        return path
