"""The serving router: what each route of docs/router.md answers.

:class:`RouterService` holds the registry, the ``GET /models`` index, the
scratch sessions and the link to the runtime; the gateway's routes
(``aotx_trio.gateway.router_routes``) only parse HTTP and render.  Its
:meth:`RouterService.run` is the supervised task tree of the router: the index
refresh, the feed's rescan and the scratch reaper.

Deployment and readiness are read from the live runtime (its ``identity``
call): a release is *deployed* here when the runtime has its artifact loaded;
otherwise the detail route says ``not_ready: "deployment"`` and invoke answers
503 ``not_ready`` with ``missing: ["deployment"]``.  Nothing ever falls back to
another model, release or revision (docs/decisions.md).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

import aotx_trio
from aotx_trio import errors
from aotx_trio.registry import feed
from aotx_trio.registry.records import Revision
from aotx_trio.router import contract
from aotx_trio.router.aliases import Resolution, resolve, resolve_alias
from aotx_trio.router.deploy import Deployments
from aotx_trio.router.dispatch import DISPATCH, Caller, RuntimeLink, checker
from aotx_trio.router.index import ModelIndex
from aotx_trio.router.registry import ModelView, Registry, ReleaseView
from aotx_trio.router.scratch import Scratch
from aotx_trio.router.spec.dsl import Spec
from aotx_trio.router.upload import UploadPolicy

log = logging.getLogger("aotx.router")

STATE_FILTERS = ("active", "deprecated", "disabled", "all")
REAP_INTERVAL_S = 30.0
MAX_INFLIGHT = 64
MAX_CACHED_SPECS = 1024


@dataclass(frozen=True)
class Settings:
    index_refresh_s: float = 30.0
    rescan_interval_s: float = feed.RESCAN_INTERVAL_S
    reap_interval_s: float = REAP_INTERVAL_S
    max_inflight_invokes: int = MAX_INFLIGHT


class RouterService:
    def __init__(self, reg: Registry, link: RuntimeLink, settings: Settings | None = None,
                 upload: UploadPolicy | None = None, cache_dir: Path | None = None,
                 ) -> None:
        self.reg = reg
        self.link = link
        self.settings = settings or Settings()
        self.index = ModelIndex(reg, interval_s=self.settings.index_refresh_s)
        self.scratch = Scratch(reg)
        self.upload = upload or UploadPolicy()
        self.deploy = Deployments(reg, link, cache_dir)
        self.inflight = 0
        self._specs: dict[str, Spec] = {}

    # ------------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Index refresh, rescan and reaper; ``started()`` once the index is loaded."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.index.run)
            await nursery.start(lambda task_status: feed.run_rescan(
                self.reg.store, interval_s=self.settings.rescan_interval_s,
                retention_s=self.reg.retention_s, now=self.reg.now, task_status=task_status))
            await nursery.start(self._reaper)
            task_status.started()

    async def _reaper(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                      ) -> None:
        interval = self.settings.reap_interval_s
        if not (interval > 0 and math.isfinite(interval)):
            raise ValueError("reap interval must be a positive number of seconds")
        task_status.started()
        while True:
            await trio.sleep(interval)
            try:
                for s in await self.scratch.reap():
                    log.info("scratch session %s closed: lease expired", s.session_id)
            except (errors.AotxError, OSError) as exc:
                log.warning("scratch reaper failed (retrying in %g s): %s", interval, exc)

    # ------------------------------------------------------------------ reads

    def list_models(self, model_type: str | None, state_filter: str | None,
                    ) -> dict[str, Any]:
        state = "active" if state_filter is None else state_filter
        if state not in STATE_FILTERS:
            raise errors.InvalidParams("state_filter", "enum", "state_filter must be one of "
                                      f"{', '.join(STATE_FILTERS)}")
        if model_type is not None and model_type not in ("textgen", "embedding"):
            raise errors.InvalidParams("model_type", "enum",
                                      "model_type must be textgen or embedding")
        return {"models": self.index.list(model_type, state)}

    async def detail(self, target: str) -> dict[str, Any]:
        view, res = await resolve(self.reg, target)
        rel = await self._release(view)
        release = rel.release
        ready = self.deploy.not_ready(
            view.manifest.model_type, release.artifact.sha256,
            release.engine_set.name if release.engine_set else None,
            await self.deploy.identity(), release.descriptor)
        servable = not ready.missing and view.state != "disabled" and rel.state != "disabled"
        out: dict[str, Any] = {"model_id": view.model_id,
                               "manifest": view.manifest.model_dump(mode="json"),
                               "state": view.state, "servable": servable}
        if ready.missing:
            out["not_ready"] = ready.missing[0]
            out["reason"] = ready.reason
            if ready.missing == ["deployment"] and self.deploy.cache_dir is not None \
                    and release.artifact.kind == "gguf" \
                    and view.manifest.model_type == "textgen":
                out["reason"] = f"{ready.reason}; the first invoke loads it on demand"
        if res is not None:
            out["resolution_chain"] = res.chain
        return out

    async def alias(self, name: str) -> dict[str, Any]:
        res = await resolve_alias(self.reg, name)
        return {"name": name, "model_id": res.model_id, "chain": res.chain}

    async def sessions(self, active: bool) -> dict[str, Any]:
        return {"sessions": [s.model_dump(mode="json")
                             for s in await self.scratch.sessions(active=active)]}

    async def session(self, session_id: str) -> dict[str, Any]:
        s = await self.scratch.get(session_id)
        out: dict[str, Any] = {"session": s.model_dump(mode="json"), "spec": None,
                               "revision": None, "revision_id": None}
        if s.current_generation is not None:
            got = await self.reg.read(Revision, "revisions",
                                      f"{s.session_id}/{s.current_generation:08d}")
            if got is not None:
                rev = got[0]
                out.update(spec=rev.spec, revision_id=rev.revision_id,
                           revision=rev.model_dump(mode="json"))
        return out

    async def _release(self, view: ModelView) -> ReleaseView:
        name = view.manifest.serving.runtime_release.name
        try:
            return await self.reg.get_release(name)
        except errors.NotFound:
            raise errors.NotReady(f"release {name!r} of the model is missing",
                                  missing=[f"release({name})"]) from None

    # ------------------------------------------------------------------ invoke

    def _contract(self, key: str, spec: Mapping[str, Any]) -> contract.Contract:
        """The parsed contract of a manifest or revision (cached by its sha256)."""
        found = self._specs.get(key)
        if found is None:
            if len(self._specs) >= MAX_CACHED_SPECS:
                self._specs.clear()
            found = self._specs[key] = contract.Contract(spec, self.upload).spec
        return contract.Contract(found, self.upload)

    def _admit(self) -> None:
        if self.inflight >= self.settings.max_inflight_invokes:
            raise errors.OverCapacity(
                f"{self.inflight} invokes are in flight (the router's limit)", retry_after=1)

    async def _run(self, model_type: str, name: str, request: Mapping[str, Any],
                   caller: Caller, want: dict[str, Any],
                   ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        self._admit()
        self.inflight += 1
        try:
            return await DISPATCH[model_type](self.link, caller, name, request, checker(want))
        finally:
            self.inflight -= 1

    async def invoke(self, target: str, body: Any, caller: Caller) -> dict[str, Any]:
        t0 = time.monotonic()
        envelope = contract.envelope(body)
        view, res = await resolve(self.reg, target)
        if view.state == "disabled":
            raise errors.Forbidden(f"model {view.model_id!r} is disabled",
                                   code="model_disabled", successor_id=view.successor_id)
        rel = await self._release(view)
        if rel.state == "disabled":
            raise errors.Forbidden(f"release {rel.release.name!r} is disabled",
                                   code="release_disabled", successor=rel.successor)
        spec = self._contract(view.manifest_sha256, view.manifest.serving.spec)
        request = spec.effective(envelope.request)
        targets = await spec.targets(envelope, request)
        release = rel.release
        ready = await self.deploy.deployed(
            view.manifest.model_type, release.artifact,
            release.engine_set.name if release.engine_set else None, release.descriptor,
            caller)
        name = ready.name
        if ready.missing or name is None:
            raise errors.NotReady(f"model {view.model_id!r} is not ready here: "
                                  f"{ready.reason}", missing=ready.missing)
        want = {"source_commit": release.source_commit,
                "artifact_sha256": release.artifact.sha256,
                "descriptor_sha256": release.descriptor_sha256}
        results, seen = await self._run(view.manifest.model_type, name, request, caller, want)
        wire = await spec.deliver(targets, request, results)
        identity: dict[str, Any] = {
            "model_id": view.model_id, "release": release.name,
            "source_commit": release.source_commit,
            "attestation": {"kind": "release", "release": release.name,
                            "source_commit": release.source_commit,
                            "descriptor_sha256": release.descriptor_sha256,
                            "manifest_sha256": view.manifest_sha256,
                            "engine_set_sha256": release.engine_set_sha256,
                            "gpu": seen.get("gpu")},
            **_ids(len(wire), t0)}
        if res is not None:
            identity.update(_alias_fields(target, res))
        return {"ok": True, "error": None, "results": wire, "identity": identity}

    async def scratch_invoke(self, session_id: str, body: Any, caller: Caller,
                             ) -> dict[str, Any]:
        t0 = time.monotonic()
        envelope = contract.envelope(body)
        session = await self.scratch.renew(session_id)
        rev, rev_sha = await self.scratch.current(session_id)
        model_type = str(rev.draft_manifest.get("model_type"))
        spec = self._contract(rev.spec_sha256, rev.spec)
        request = spec.effective(envelope.request)
        targets = await spec.targets(envelope, request)
        ready = await self.deploy.deployed(model_type, rev.artifact, None, None, caller)
        name = ready.name
        if ready.missing or name is None:
            raise errors.NotReady("the scratch revision's artifact is not loaded here: "
                                  f"{ready.reason}", code="scratch_not_ready",
                                  missing=ready.missing)
        results, seen = await self._run(model_type, name, request, caller,
                                        {"artifact_sha256": rev.artifact.sha256})
        wire = await spec.deliver(targets, request, results)
        identity = {
            "provenance": {"kind": "scratch"}, "session_id": session.session_id,
            "based_on": session.based_on,
            "attestation": {"kind": "scratch", "session_id": session.session_id,
                            "revision_id": rev.revision_id, "generation": rev.generation,
                            "revision_sha256": rev_sha, "source_sha256": rev.artifact.sha256,
                            "dependency_recipe_sha256": seen.get("descriptor_sha256"),
                            "spec_sha256": rev.spec_sha256,
                            "draft_manifest_sha256": rev.draft_manifest_sha256,
                            "engine_set_sha256": None,
                            "app_version": f"aotx-{aotx_trio.__version__}"},
            **_ids(len(wire), t0)}
        return {"ok": True, "error": None, "results": wire, "identity": identity}


def _ids(n: int, t0: float) -> dict[str, Any]:
    """request_id, one result id per result (aligned by index), timing_ms since ``t0``."""
    return {"request_id": str(uuid.uuid4()), "result_ids": [str(uuid.uuid4()) for _ in range(n)],
            "timing_ms": round((time.monotonic() - t0) * 1000)}


def _alias_fields(target: str, res: Resolution) -> dict[str, Any]:
    return {"requested_alias": target, "resolution_chain": res.chain}
