"""The registry: every rule over the store, once, for both backends.

Models (manifest, publication, unpublication marker, lifecycle state), releases
(immutable record, state, deployments) and aliases; each durable change writes
its object, then appends its event (``feed.append_for``).  Every backend call
runs in a worker thread.  Documents: docs/formats/registry.md.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from aotx_trio.errors import Conflict, Forbidden, FormatError, Gone, InvalidInput, NotFound
from aotx_trio.identity import Descriptor, sha256_hex
from aotx_trio.registry import feed
from aotx_trio.registry.records import (
    MODEL_STATES,
    RELEASE_STATES,
    ArtifactRef,
    D,
    Deployment,
    EngineSet,
    Manifest,
    ModelState,
    Published,
    Release,
    ReleaseState,
    Removed,
    check_commit,
    check_key,
    check_name,
    parse,
    rfc3339,
)
from aotx_trio.registry.store import StoreBackend
from aotx_trio.router.manifest import check_manifest

T = TypeVar("T")
MAX_ALIAS_LEVEL = 3


@dataclass(frozen=True)
class ModelView:
    model_id: str
    manifest: Manifest
    manifest_sha256: str
    published: Published
    state: str
    successor_id: str | None


@dataclass(frozen=True)
class ReleaseView:
    release: Release
    release_sha256: str
    state: str
    successor: str | None


def _not_found(model_id: str, **fields: Any) -> NotFound:
    return NotFound(f"no model {model_id!r}", code="model_not_found", model_id=model_id,
                    **fields)


def _state(cls: type[D], **fields: Any) -> D:
    """A state document from caller input; a state outside the enum is 422."""
    try:
        return cls.model_validate(fields)
    except ValueError:
        allowed = ", ".join(MODEL_STATES if cls is ModelState else RELEASE_STATES)
        raise InvalidInput(f"state must be one of {allowed}", code="invalid_params",
                           param="state", rule="enum") from None


class Registry:
    """The registry over one :class:`StoreBackend` (folder or PostgreSQL)."""

    def __init__(self, store: StoreBackend, *, now: Callable[[], float] = time.time,
                 retention_s: float = feed.RETENTION_S,
                 max_alias_level: int = MAX_ALIAS_LEVEL) -> None:
        self.store = store
        self.now = now
        self.retention_s = retention_s
        self.max_alias_level = max_alias_level

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A blocking backend call in a worker thread."""
        return await trio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))

    async def aclose(self) -> None:
        await self.run(self.store.close)

    # ------------------------------------------------------------------ primitives

    async def read(self, cls: type[D], coll: str, key: str) -> tuple[D, bytes] | None:
        body = await self.run(self.store.get, coll, key)
        return None if body is None else (parse(cls, body, f"{coll}/{key}"), body)

    async def create_once(self, coll: str, key: str, body: bytes,
                          same: Callable[[bytes], bool]) -> bytes:
        """Write-once; the stored bytes (the old ones when ``same(old)``), else 409."""
        old = await self.run(self.store.create, coll, key, body)
        if old is None:
            return body
        if old == body or same(old):
            return old
        raise Conflict(f"{coll}/{key} exists with other contents", code="conflict",
                       object=f"{coll}/{key}")

    async def write(self, coll: str, key: str, body: bytes) -> None:
        await self.run(self.store.put, coll, key, body)

    async def emit(self, coll: str, key: str, body: bytes) -> int | None:
        return await self.run(feed.append_for, self.store, coll, key, body, self.now())

    def stamp(self) -> str:
        return rfc3339(self.now())

    # ------------------------------------------------------------------ models

    async def put_manifest(self, model_id: str, manifest: Any) -> str:
        """Store a manifest (write-once; not yet published); its sha256."""
        check_key(model_id)
        body = check_manifest(manifest).body()
        await self.create_once("manifests", model_id, body, lambda old: False)
        return sha256_hex(body)

    async def _removed(self, model_id: str) -> None:
        got = await self.read(Removed, "removed", model_id)
        if got is not None:
            raise Gone(f"model {model_id!r} was unpublished", code="model_removed",
                       model_id=model_id, removed_at=got[0].removed_at)

    async def publish(self, model_id: str, manifest: Any = None) -> ModelView:
        check_key(model_id)
        await self._removed(model_id)
        if await self.run(self.store.get, "aliases", model_id) is not None:
            raise Conflict(f"{model_id!r} is an alias; a model id cannot shadow it")
        if manifest is not None:
            await self.put_manifest(model_id, manifest)
        got = await self.read(Manifest, "manifests", model_id)
        if got is None:
            raise _not_found(model_id)
        man, body = got
        rel = (await self.get_release(man.serving.runtime_release.name)).release
        if (rel.artifact.sha256 != man.artifact.sha256
                or rel.source_commit != man.serving.runtime_release.source_commit):
            raise InvalidInput(f"the manifest's artifact and source_commit must be those of "
                               f"release {rel.name!r}", code="invalid_params",
                               param="serving.runtime_release", rule="release_binding")
        man_sha = sha256_hex(body)
        rec = Published(model_id=model_id, manifest_sha256=man_sha, model_type=man.model_type,
                        release=rel.name, published_at=self.stamp()).body()
        stored = await self.create_once(
            "published", model_id, rec,
            lambda old: parse(Published, old, "published").manifest_sha256 == man_sha)
        await self.emit("published", model_id, stored)
        return await self.get_model(model_id)

    async def get_model(self, model_id: str) -> ModelView:
        """The published model (exact keyed read), else the seed's error."""
        try:
            check_key(model_id)
        except InvalidInput:
            raise _not_found(model_id) from None
        await self._removed(model_id)
        pub = await self.read(Published, "published", model_id)
        if pub is None:
            stored = await self.run(self.store.get, "manifests", model_id)
            raise _not_found(model_id, **({"reason": "unpublished"} if stored else {}))
        got = await self.read(Manifest, "manifests", model_id)
        if got is None or sha256_hex(got[1]) != pub[0].manifest_sha256:
            raise FormatError(f"manifest of {model_id!r} does not match its publication",
                              code="registry_corrupt", object=f"manifests/{model_id}")
        st = await self.read(ModelState, "model_states", model_id)
        state, succ = (st[0].state, st[0].successor_id) if st else ("active", None)
        return ModelView(model_id, got[0], pub[0].manifest_sha256, pub[0], state, succ)

    async def list_models(self, model_type: str | None = None,
                          state_filter: str = "active") -> list[ModelView]:
        out = []
        for key in await self.run(self.store.keys, "published"):
            try:
                view = await self.get_model(key)
            except (Gone, NotFound):
                continue
            if ((model_type is None or view.manifest.model_type == model_type)
                    and state_filter in ("all", view.state)):
                out.append(view)
        return out

    async def unpublish(self, model_id: str, reason: str | None = None) -> Removed:
        """Write the write-once unpublication marker (a retry returns the first one)."""
        try:
            await self.get_model(model_id)
        except Gone:
            pass
        body = Removed(model_id=model_id, removed_at=self.stamp(), reason=reason).body()
        stored = await self.create_once("removed", model_id, body, lambda old: True)
        await self.emit("removed", model_id, stored)
        return parse(Removed, stored, "removed")

    async def set_model_state(self, model_id: str, state: str,
                              successor_id: str | None = None) -> ModelState:
        await self.get_model(model_id)
        if successor_id is not None and check_key(successor_id, "successor_id") == model_id:
            raise InvalidInput("a model cannot succeed itself", code="invalid_params",
                               param="successor_id", rule="not_self")
        doc = _state(ModelState, model_id=model_id, state=state, successor_id=successor_id,
                     changed_at=self.stamp())
        await self.write("model_states", model_id, doc.body())
        await self.emit("model_states", model_id, doc.body())
        return doc

    # ------------------------------------------------------------------ releases

    async def mint_release(self, name: str, artifact: ArtifactRef, descriptor: Descriptor,
                           source_commit: str, engine_set: EngineSet | None = None) -> Release:
        check_name(name)
        check_commit(source_commit)
        if await self.run(self.store.blob_size, artifact.sha256) is None:
            raise InvalidInput(f"artifact {artifact.sha256} is not in the store",
                               code="invalid_params", param="artifact", rule="present")
        rel = Release(name=name, artifact=artifact, descriptor=descriptor,
                      descriptor_sha256=sha256_hex(descriptor.body()),
                      source_commit=source_commit, engine_set=engine_set,
                      minted_at=self.stamp())
        fixed = rel.model_dump(exclude={"minted_at"})

        def same(old: bytes) -> bool:
            return parse(Release, old, "releases").model_dump(exclude={"minted_at"}) == fixed

        stored = await self.create_once("releases", name, rel.body(), same)
        await self.emit("releases", name, stored)
        return parse(Release, stored, f"releases/{name}")

    async def get_release(self, name: str) -> ReleaseView:
        got = await self.read(Release, "releases", check_name(name))
        if got is None:
            raise NotFound(f"no release {name!r}", code="release_not_found", release=name)
        st = await self.read(ReleaseState, "release_states", name)
        state, succ = (st[0].state, st[0].successor) if st else ("active", None)
        return ReleaseView(got[0], sha256_hex(got[1]), state, succ)

    async def set_release_state(self, name: str, state: str,
                                successor: str | None = None) -> ReleaseState:
        await self.get_release(name)
        if successor is not None:
            await self.get_release(successor)
        doc = _state(ReleaseState, name=name, state=state, successor=successor,
                     changed_at=self.stamp())
        await self.write("release_states", name, doc.body())
        await self.emit("release_states", name, doc.body())
        return doc

    async def deploy_release(self, name: str, runtime: str) -> Deployment:
        view = await self.get_release(name)
        if view.state == "disabled":
            raise Forbidden(f"release {name!r} is disabled", code="release_disabled",
                            successor=view.successor)
        doc = Deployment(release=name, runtime=check_name(runtime, "runtime"),
                         descriptor_sha256=view.release.descriptor_sha256,
                         deployed_at=self.stamp())
        await self.write("deployments", f"{name}/{runtime}", doc.body())
        await self.emit("deployments", f"{name}/{runtime}", doc.body())
        return doc

    # ------------------------------------------------------------------ feed

    async def events(self, after: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        return [json.loads(b) for b in await self.run(self.store.feed_read, after, limit)]

    async def heal(self) -> list[int]:
        return await self.run(feed.heal, self.store, self.now(), self.retention_s)

    async def trim(self) -> int:
        return await self.run(feed.trim, self.store, self.now(), self.retention_s)
