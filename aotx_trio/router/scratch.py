"""Scratch sessions: a mutable session with numbered, verified revisions and a
sliding lease (docs/formats/registry.md, ``sessions`` and ``revisions``).

Every change of a session is one locked read-modify-write of its document, so
two routers renewing, stopping or revising it never lose a change.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aotx_trio.errors import Gone, InvalidInput, InvalidParams, NotFound, NotReady
from aotx_trio.identity import Descriptor, canonical, sha256_hex
from aotx_trio.registry.records import (
    ArtifactRef,
    Revision,
    Session,
    canonical_uuid,
    parse,
    parse_time,
    rfc3339,
)
from aotx_trio.router.artifacts import verify_artifact
from aotx_trio.router.manifest import check_manifest, check_spec
from aotx_trio.router.registry import ModelView, Registry

DEFAULT_LEASE_S = 900


def _not_found(session_id: str) -> NotFound:
    return NotFound(f"no scratch session {session_id!r}", code="scratch_not_found",
                    session_id=session_id)


class Scratch:
    """Scratch sessions of one registry."""

    def __init__(self, reg: Registry) -> None:
        self.reg = reg

    def _key(self, session_id: str) -> str:
        if canonical_uuid(session_id) is None:
            raise _not_found(session_id)
        return session_id

    def _usable(self, s: Session, now: float) -> None:
        """Raise unless the session is open with its lease running."""
        if s.state == "closed":
            raise Gone(f"scratch session {s.session_id} is closed ({s.reason})",
                       code="scratch_closed", session_id=s.session_id, reason=s.reason,
                       promoted_to=s.promoted_to)
        if parse_time(s.lease_expires_at) <= now:
            raise Gone(f"scratch session {s.session_id}'s lease expired",
                       code="scratch_expired", session_id=s.session_id,
                       expired_at=s.lease_expires_at)

    async def _change(self, session_id: str, fn: Any) -> Session:
        """Locked read-modify-write: ``fn(session, now) -> session``."""
        key = self._key(session_id)

        def apply(old: bytes | None) -> bytes:
            if old is None:
                raise _not_found(session_id)
            new: Session = fn(parse(Session, old, f"sessions/{key}"), self.reg.now())
            return new.body()

        return parse(Session, await self.reg.run(self.reg.store.update, "sessions", key, apply),
                     f"sessions/{key}")

    async def open(self, *, lease_s: int = DEFAULT_LEASE_S,
                   based_on: dict[str, Any] | None = None) -> Session:
        """A new open session whose lease is ``lease_s`` whole seconds."""
        if isinstance(lease_s, bool) or not isinstance(lease_s, int) or lease_s < 1:
            raise InvalidParams("lease_s", "integer",
                                "lease_s must be a whole number of seconds, at least 1")
        now = self.reg.now()
        s = Session(session_id=str(uuid.uuid4()), state="open", created_at=rfc3339(now),
                    lease_s=lease_s, lease_expires_at=rfc3339(now + lease_s),
                    based_on=based_on or {})
        await self.reg.create_once("sessions", s.session_id, s.body(), lambda old: False)
        return s

    async def get(self, session_id: str) -> Session:
        got = await self.reg.read(Session, "sessions", self._key(session_id))
        if got is None:
            raise _not_found(session_id)
        return got[0]

    async def sessions(self, active: bool = True) -> list[Session]:
        out = []
        for key in await self.reg.run(self.reg.store.keys, "sessions"):
            s = await self.get(key)
            if not active or s.state == "open":
                out.append(s)
        return out

    async def renew(self, session_id: str) -> Session:
        """Each invoke: refuse an unusable session, else slide the lease (atomically)."""
        def fn(s: Session, now: float) -> Session:
            self._usable(s, now)
            return s.model_copy(update={"lease_expires_at": rfc3339(now + s.lease_s)})
        return await self._change(session_id, fn)

    async def revise(self, session_id: str, *, spec: Any, artifact: ArtifactRef,
                     draft_manifest: Any) -> Revision:
        """Verify and store the next revision, then make it current."""
        check_spec(spec)
        draft = {**draft_manifest, "artifact": artifact.model_dump(mode="json")}
        draft.setdefault("serving", {})["spec"] = spec
        draft = json.loads(check_manifest(draft).body())
        missing = await self.reg.run(verify_artifact, self.reg.store, artifact)
        if missing:
            raise InvalidInput("the revision's artifact is not in the store", code="invalid_params",
                               param="artifact", rule="present", missing=missing)

        def take(s: Session, now: float) -> Session:
            self._usable(s, now)
            return s.model_copy(update={"generations": s.generations + 1})
        gen = (await self._change(session_id, take)).generations
        rev = Revision(session_id=session_id, revision_id=str(uuid.uuid4()), generation=gen,
                       spec=spec, spec_sha256=sha256_hex(canonical(spec)), artifact=artifact,
                       draft_manifest=draft, draft_manifest_sha256=sha256_hex(canonical(draft)),
                       created_at=self.reg.stamp())
        await self.reg.create_once("revisions", f"{session_id}/{gen:08d}", rev.body(),
                                   lambda old: False)

        def current(s: Session, now: float) -> Session:
            if (s.current_generation or 0) >= gen:
                return s
            return s.model_copy(update={"current_generation": gen})
        await self._change(session_id, current)
        return rev

    async def current(self, session_id: str) -> tuple[Revision, str]:
        """The current verified revision and its revision_sha256 (503 scratch_not_ready)."""
        s = await self.get(session_id)
        if s.current_generation is None:
            raise NotReady("the scratch session has no verified revision",
                           code="scratch_not_ready", missing=["revision"])
        got = await self.reg.read(Revision, "revisions",
                                  f"{session_id}/{s.current_generation:08d}")
        if got is None:
            raise NotReady("the current revision is missing", code="scratch_not_ready",
                           missing=["revision"])
        missing = await self.reg.run(verify_artifact, self.reg.store, got[0].artifact)
        if missing:
            raise NotReady("the revision's artifact is missing", code="scratch_not_ready",
                           missing=missing)
        return got[0], sha256_hex(got[1])

    def _close(self, reason: str, promoted_to: str | None = None) -> Any:
        def fn(s: Session, now: float) -> Session:
            if reason != "expired":
                self._usable(s, now)
            elif s.state == "closed" or parse_time(s.lease_expires_at) > now:
                return s
            return s.model_copy(update={"state": "closed", "reason": reason,
                                        "closed_at": rfc3339(now), "promoted_to": promoted_to})
        return fn

    async def stop(self, session_id: str) -> Session:
        return await self._change(session_id, self._close("stopped"))

    async def reap(self) -> list[Session]:
        """Close every open session whose lease elapsed (reason ``expired``)."""
        closed = []
        for s in await self.sessions(active=True):
            after = await self._change(s.session_id, self._close("expired"))
            if after.state == "closed":
                closed.append(after)
        return closed

    async def promote(self, session_id: str, model_id: str, *, release: str,
                      source_commit: str, descriptor: Descriptor | None = None) -> ModelView:
        """Mint a release from the current revision and publish it as ``model_id``."""
        rev, _ = await self.current(session_id)
        await self.renew(session_id)
        await self.reg.mint_release(release, rev.artifact, descriptor or Descriptor(),
                                    source_commit)
        manifest = {**rev.draft_manifest,
                    "serving": {**rev.draft_manifest["serving"],
                                "runtime_release": {"name": release,
                                                    "source_commit": source_commit}}}
        view = await self.reg.publish(model_id, manifest)
        await self._change(session_id, self._close("promoted", model_id))
        return view
