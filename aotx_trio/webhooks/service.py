"""The webhook routes' answers and the supervisor of the delivery tasks.

:meth:`WebhookService.run` (a supervised task of the gateway app's nursery) keeps
one delivery task per active subscription: it lists the store's subscriptions at
start, whenever this router registers or disables one, and every ``sync_s`` (the
ones other routers registered or disabled); a task that fails on the store is
restarted after ``retry_interval_s``.  A router that stops keeps its leases until
they expire (``lease_s``): a stop is indistinguishable from a crash, by design.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import time
import uuid as uuidlib
from collections.abc import Callable, Sequence
from typing import Any

import nacl.signing
import trio

from aotx_trio import errors
from aotx_trio.identity import canonical
from aotx_trio.registry.records import canonical_uuid, parse_time, rfc3339
from aotx_trio.registry.store import StoreBackend
from aotx_trio.webhooks import signing
from aotx_trio.webhooks.delivery import Context, Settings, deliver
from aotx_trio.webhooks.records import Subscription, check_events, load
from aotx_trio.webhooks.targets import check_url, policy, vet

log = logging.getLogger("aotx.webhooks")
MAX_WHY_CHARS = 1024


async def _in_thread(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    return await trio.to_thread.run_sync(functools.partial(fn, *args, **kw))


class WebhookService:
    def __init__(self, store: StoreBackend, key: nacl.signing.SigningKey | None,
                 settings: Settings | None = None, *, now: Callable[[], float] = time.time,
                 holder: str | None = None) -> None:
        self.store = store
        self.key = key
        self.settings = settings or Settings()
        self.now = now
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuidlib.uuid4().hex[:8]}"
        self._tasks: dict[str, trio.CancelScope] = {}
        self._wake = trio.Event()

    # ------------------------------------------------------------------ routes

    def _unconfigured(self) -> errors.NotReady:
        return errors.NotReady("this router has no webhook signing key (set "
                               "webhooks.signing_key_file in gateway.json)",
                               code="webhooks_unconfigured")

    def signing_key(self) -> dict[str, Any]:
        if self.key is None:
            raise self._unconfigured()
        return {"algorithm": "ed25519", "public_key": signing.public_hex(self.key),
                "signed": "{X-Serving-Timestamp}.{raw body}",
                "tolerance_s": signing.TOLERANCE_S}

    async def create(self, body: Any, owner: str) -> dict[str, Any]:
        """Register a subscription of principal ``owner``: 429 ``over_quota``
        (``quota: "webhooks"``) when it holds ``max_webhooks`` active ones."""
        if self.key is None:
            raise self._unconfigured()
        if not isinstance(body, dict):
            raise errors.InvalidParams("body", "type", "the body must be a JSON object")
        for k in body:
            if k not in ("url", "events", "backfill"):
                raise errors.InvalidParams(str(k)[:80], "unknown",
                                          f"unknown field {str(k)[:80]!r}")
        s = self.settings
        target = check_url(body.get("url"), s.allow_insecure_targets)
        events = check_events(body.get("events"))
        backfill = body.get("backfill", False)
        if not isinstance(backfill, bool):
            raise errors.InvalidParams("backfill", "type", "backfill must be a boolean")
        await vet(target, policy(s.allow_insecure_targets, s.timeout_s, s.ca_file))
        cursor, cursor_at = 0, None
        if not backfill:
            cursor = await _in_thread(self.store.feed_head)
            if cursor:
                head = await _in_thread(self.store.feed_read, cursor - 1, 1)
                cursor_at = _event_at(head)
        uid = str(uuidlib.uuid4())
        sub = Subscription(uuid=uid, url=body["url"], events=events, owner=owner,
                           created_at=rfc3339(self.now()), cursor=cursor, cursor_at=cursor_at)
        limit = s.max_webhooks

        def admit(existing: list[bytes]) -> None:
            held = sum(1 for x in _loaded(existing)
                       if x.owner == owner and x.state == "active")
            if held >= limit:
                raise errors.Refusal(
                    f"{owner!r} holds {held} active webhook subscriptions (the limit, "
                    "limits.max_webhooks); disable one first", code="over_quota",
                    quota="webhooks", limit=limit)
        await _in_thread(self.store.hook_create, uid, sub.body(), admit)
        try:
            await self._trim(_loaded(await _in_thread(self.store.hook_list)))
        except (errors.AotxError, OSError) as exc:   # registered; the next sync trims
            log.warning("webhooks: trimming disabled subscriptions failed: %s", exc)
        log.info("webhook %s registered for %s (%s, cursor %d)", uid, target.shown(),
                 events if events == "*" else ",".join(events), cursor)
        self._wake.set()
        return sub.public()

    async def list(self, cursor: str | None = None, limit: int = 500) -> dict[str, Any]:
        """One page, oldest first: the subscriptions after ``cursor`` (a
        ``next_cursor`` of an earlier page), at most ``limit``."""
        after = None if cursor is None else _position(cursor)
        subs = sorted(_loaded(await _in_thread(self.store.hook_list)), key=_order)
        if after is not None:
            subs = [x for x in subs if _order(x) > after]
        page = subs[:limit]
        more = len(subs) > limit
        return {"webhooks": [x.public() for x in page],
                "next_cursor": ",".join(_order(page[-1])) if more else None}

    async def disable(self, uid: str, why: str | None) -> dict[str, Any]:
        if why is not None and len(why) > MAX_WHY_CHARS:
            raise errors.InvalidParams("why", "length",
                                      f"why must be at most {MAX_WHY_CHARS} characters")
        missing = errors.NotFound(f"no active webhook subscription {uid[:80]!r}",
                                  code="webhook_not_found", uuid=uid[:80])
        if canonical_uuid(uid) is None:
            raise missing
        now = rfc3339(self.now())

        def off(old: bytes | None) -> bytes:
            assert old is not None
            sub = load(old, uid)
            if sub.state != "active":
                raise missing
            return canonical({**sub.public(), "state": "disabled", "why": why,
                              "disabled_at": now})
        try:
            new = await _in_thread(self.store.hook_update, uid, off)
        except KeyError:
            raise missing from None
        assert new is not None
        log.info("webhook %s disabled", uid)
        self._wake.set()
        return load(new, uid).public()

    # ------------------------------------------------------------------ tasks

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Supervise the delivery tasks; ``started()`` once the active ones run."""
        if self.key is None:
            log.warning("webhooks: no signing key; nothing is delivered")
            task_status.started()
            return
        ctx = Context(self.store, self.key, self.settings, self.holder, self.now, _in_thread)
        async with trio.open_nursery() as nursery:
            first = True
            while True:
                try:
                    await self._sync(ctx, nursery)
                except (errors.AotxError, OSError) as exc:   # the store is down: next time
                    log.warning("webhooks: listing subscriptions failed: %s", exc)
                if first:
                    task_status.started()
                    first = False
                with trio.move_on_after(self.settings.sync_s):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _trim(self, subs: Sequence[Subscription]) -> None:
        """Delete the disabled subscriptions past the feed's retention, and each
        owner's disabled ones beyond its newest ``max_webhooks``."""
        s = self.settings
        oldest = rfc3339(self.now() - s.retention_s)
        kept: dict[str | None, int] = {}
        disabled = [x for x in subs if x.state == "disabled"]
        disabled.sort(key=lambda x: (x.disabled_at or "", x.uuid), reverse=True)
        for sub in disabled:
            kept[sub.owner] = kept.get(sub.owner, 0) + 1
            if (sub.disabled_at or "") < oldest or kept[sub.owner] > s.max_webhooks:
                await _in_thread(self.store.hook_delete, sub.uuid)
                log.info("webhook %s deleted (disabled at %s)", sub.uuid, sub.disabled_at)

    async def _sync(self, ctx: Context, nursery: trio.Nursery) -> None:
        subs = _loaded(await _in_thread(self.store.hook_list))
        await self._trim(subs)
        active = {sub.uuid for sub in subs if sub.state == "active"}
        for uid, scope in list(self._tasks.items()):
            if uid not in active:
                scope.cancel()
        for uid in sorted(active - self._tasks.keys()):
            await nursery.start(self._supervised, ctx, uid)

    async def _supervised(self, ctx: Context, uid: str, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                          ) -> None:
        with trio.CancelScope() as scope:
            self._tasks[uid] = scope
            task_status.started()
            try:
                while True:
                    try:
                        await deliver(ctx, uid)
                        return
                    except* (errors.AotxError, OSError) as group:
                        log.warning("webhook %s: delivery failed on the store (%s); "
                                    "restarting in %g s", uid, group.exceptions[0],
                                    self.settings.retry_interval_s)
                    await trio.sleep(self.settings.retry_interval_s)
            finally:
                if self._tasks.get(uid) is scope:
                    del self._tasks[uid]


def _loaded(listed: Sequence[bytes]) -> list[Subscription]:
    """The subscriptions of a listing; a corrupt document is logged and left out (it
    stops only itself)."""
    out = []
    for raw in listed:
        try:
            out.append(load(raw, "(listed)"))
        except errors.FormatError as exc:
            log.warning("webhooks: %s", exc.message)
    return out


def _order(sub: Subscription) -> tuple[str, str]:
    return sub.created_at, sub.uuid


def _position(cursor: str) -> tuple[str, str]:
    """The (created_at, uuid) a ``next_cursor`` names (422 naming ``cursor``)."""
    at, _, uid = cursor.partition(",")
    try:
        parse_time(at)
    except ValueError:
        uid = ""
    if canonical_uuid(uid) is None:
        raise errors.InvalidParams("cursor", "format", "cursor must be the next_cursor of "
                                   "an earlier page")
    return at, uid


def _event_at(events: list[bytes]) -> str | None:
    return str(json.loads(events[0])["at"]) if events else None
