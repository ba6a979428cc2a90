"""Where the runtime serves an artifact: readiness from its ``identity`` call, and
on-demand loading of a GGUF it lacks (docs/decisions.md, "Deployment, identity and
attestation" and "On-demand loading")."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
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


#: what the runtime answers ``model.load`` with when the artifact itself cannot be
#: served (not a GGUF it can read, settings it cannot honour): permanent
PERMANENT = (errors.InvalidInput, errors.FormatError)
#: permanent failures remembered (per artifact and descriptor)
MAX_FAILED = 1024


def _permanent(exc: errors.AotxError) -> bool:
    """A refusal of the artifact itself (a broken service-socket frame is not one)."""
    return isinstance(exc, PERMANENT) and not isinstance(exc, errors.FrameError)


@dataclass(frozen=True)
class Readiness:
    """Whether the runtime serves an artifact as a release's descriptor says."""

    #: what is missing (``"deployment"``, ``"engine_set(<name>)"``,
    #: ``"artifact_unloadable"``); empty: served
    missing: list[str]
    #: the runtime's model name serving it (None: none does)
    name: str | None = None
    #: why it is not served, in words (None when served or never loaded)
    reason: str | None = None


def _differences(want: Mapping[str, Any], seen: Mapping[str, Any]) -> str:
    keys = sorted(set(want) | set(seen))
    return ", ".join(f"{k} {want.get(k)} vs the loaded {seen.get(k)}" for k in keys
                     if want.get(k) != seen.get(k))


class Deployments:
    """The runtime's loaded artifacts as the router sees them."""

    def __init__(self, reg: Registry, link: RuntimeLink, cache_dir: Path | None) -> None:
        self.reg = reg
        self.link = link
        #: where GGUF artifacts are exported for on-demand loading (None: never)
        self.cache_dir = cache_dir
        #: (artifact sha256, descriptor sha256) the runtime refused to load for good
        self.failed: dict[tuple[str, str | None], errors.UpstreamFailure] = {}

    async def identity(self) -> dict[str, Any] | None:
        try:
            out: dict[str, Any] = await self.link.call("identity", {})
        except errors.AotxError as exc:
            log.warning("runtime identity unavailable: %s", exc.message)
            return None
        return out

    def not_ready(self, model_type: str, artifact_sha256: str, engine_set: str | None,
                  ident: Mapping[str, Any] | None, descriptor: Descriptor | None = None,
                  ) -> Readiness:
        """Where the runtime serves the artifact: with ``descriptor`` (a release's),
        only a model loaded with exactly that descriptor serves it; without (a scratch
        revision), any model loaded from the artifact."""
        failed = self.failed.get((artifact_sha256, _digest(descriptor)))
        if failed is not None:
            return Readiness(["artifact_unloadable"], None, str(failed.fields["reason"]))
        if ident is None:
            return Readiness(["deployment"], None, "the runtime is unreachable")
        missing = []
        if engine_set is not None and engine_set not in (ident.get("engine_sets") or []):
            missing.append(f"engine_set({engine_set})")
        rows = [a for a in ident.get("artifacts") or []
                if a.get("artifact_sha256") == artifact_sha256 and a.get("kind") == model_type]
        want = None if descriptor is None else descriptor.model_dump(mode="json")
        same = [a for a in rows if want is None or a.get("descriptor_sha256") == _digest(
            descriptor)]
        if same:
            return Readiness(missing, str(same[0]["name"]))
        reason = f"the runtime has not loaded artifact {artifact_sha256}"
        if rows and want is not None:
            reason = (f"the runtime serves artifact {artifact_sha256} only with another "
                      f"descriptor ({_differences(want, rows[0].get('descriptor') or {})})")
        return Readiness([*missing, "deployment"], None, reason)

    async def deployed(self, model_type: str, artifact: ArtifactRef,
                       engine_set: str | None, descriptor: Descriptor | None,
                       caller: Caller) -> Readiness:
        """Where the runtime serves the artifact as ``descriptor`` says; a GGUF it has
        not loaded so is loaded on demand first when this router has an artifact cache
        (docs/decisions.md).  An artifact the runtime cannot load is 502
        ``artifact_unloadable`` naming it and why, for good (never retried)."""
        key = (artifact.sha256, _digest(descriptor))
        if key in self.failed:
            raise self.failed[key]
        ident = await self.identity()
        ready = self.not_ready(model_type, artifact.sha256, engine_set, ident, descriptor)
        if ready.missing != ["deployment"] or ident is None or self.cache_dir is None \
                or artifact.kind != "gguf" or model_type != "textgen":
            return ready
        if await self.reg.run(self.reg.store.blob_size, artifact.sha256) is None:
            # a published artifact the store does not hold: a store-integrity failure,
            # never a fallback to anything else
            raise errors.UpstreamFailure(
                f"the store holds no blob for artifact {artifact.sha256}",
                code="blob_missing", missing=[artifact.sha256])
        params: dict[str, Any] = {"principal": caller.principal,
                                  "actions": list(caller.actions),
                                  "artifact_sha256": artifact.sha256,
                                  "descriptor": None if descriptor is None
                                  else descriptor.model_dump(mode="json")}
        for fresh in (False, True):
            path = await trio.to_thread.run_sync(self._cached, artifact, fresh)
            try:
                row = await self.link.call("model.load", {**params, "path": str(path)})
            except errors.AotxError as exc:
                log.warning("on-demand load of %s failed: %s", artifact.sha256, exc.message)
                if isinstance(exc, errors.Forbidden | errors.OverCapacity):
                    raise
                if exc.code == "artifact_mismatch" and not fresh:
                    continue        # the cached copy is damaged: export it again
                if _permanent(exc):
                    raise self._failed(key, artifact, exc) from None
                return Readiness(ready.missing, None, f"loading it failed: {exc.message}")
            log.info("artifact %s loaded on demand as %s", artifact.sha256, row["name"])
            return Readiness([], str(row["name"]))
        raise AssertionError("unreachable")

    def _failed(self, key: tuple[str, str | None], artifact: ArtifactRef,
                exc: errors.AotxError) -> errors.UpstreamFailure:
        err = errors.UpstreamFailure(
            f"artifact {artifact.sha256} cannot be served: {exc.message}",
            code="artifact_unloadable", artifact=artifact.sha256,
            reason=f"{exc.code}: {exc.message}")
        if len(self.failed) >= MAX_FAILED:        # bounded: the oldest is tried again
            del self.failed[next(iter(self.failed))]
        self.failed[key] = err
        return err

    def _cached(self, artifact: ArtifactRef, fresh: bool = False) -> Path:
        """The artifact as a file in the cache folder (exported once, atomically;
        again when ``fresh``)."""
        assert self.cache_dir is not None
        path = self.cache_dir / f"{artifact.sha256}.gguf"
        if fresh or not (path.is_file() and path.stat().st_size == artifact.size):
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            export_artifact(self.reg.store, artifact, path)
        return path


def _digest(descriptor: Descriptor | None) -> str | None:
    return None if descriptor is None else sha256_hex(descriptor.body())
