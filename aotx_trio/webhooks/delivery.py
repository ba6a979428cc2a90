"""One subscription's delivery (docs/webhooks.md, "Delivery").

:func:`deliver` runs while the subscription is active: it takes the subscription's
store lease (``hook_lease``; renewed every third of ``lease_s``; another router
takes over once it expires), then posts every event after the cursor in feed order.
The cursor advances (a write conditional on holding the lease) only past a 2xx, so
any other answer, a timeout or a connection error retries the same event every
``retry_interval_s``.  Events the subscription does not select advance the cursor
unposted.  A router that dies between a post and the cursor's advance leaves the
event to be posted again by the next holder: at least once, in order.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import nacl.signing
import trio

from aotx_trio.errors import AotxError, LeaseLost, OutboundFailed
from aotx_trio.identity import canonical
from aotx_trio.registry.feed import RETENTION_S
from aotx_trio.registry.records import rfc3339
from aotx_trio.registry.store import StoreBackend
from aotx_trio.webhooks import signing
from aotx_trio.webhooks.post import post
from aotx_trio.webhooks.records import Subscription, load, post_body
from aotx_trio.webhooks.targets import check_url, policy, vet

log = logging.getLogger("aotx.webhooks")
T = TypeVar("T")


@dataclass(frozen=True)
class Settings:
    """``gateway.json`` ``webhooks`` (docs/configuration.md) and the internal paces."""

    retry_interval_s: float = 30.0
    timeout_s: float = 10.0
    allow_insecure_targets: bool = False
    ca_file: str | None = None
    #: how long a router's hold on a subscription lasts unrenewed
    lease_s: float = 30.0
    #: how often a caught-up delivery looks at the feed again
    poll_s: float = 1.0
    #: how often the supervisor lists the subscriptions (another router's new ones)
    sync_s: float = 5.0
    batch: int = 100
    #: active subscriptions one principal may hold (``limits.max_webhooks``); it also
    #: keeps at most this many of its disabled ones
    max_webhooks: int = 32
    #: a disabled subscription is deleted this long after it was disabled (the feed's
    #: retention: past it, its cursor points at nothing the feed still holds)
    retention_s: float = RETENTION_S
    #: how often a run of successful posts writes the cursor (the rest: a retry wait
    #: or a batch's end); a crash re-posts at most this much
    advance_s: float = 0.25

    def __post_init__(self) -> None:
        for name in ("retry_interval_s", "timeout_s", "lease_s", "poll_s", "sync_s",
                     "advance_s", "retention_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError(f"webhooks {name} must be a positive number of seconds")
        if self.max_webhooks < 1:
            raise ValueError("webhooks max_webhooks must be at least 1")


@dataclass
class Context:
    """What every delivery task of one router shares."""

    store: StoreBackend
    key: nacl.signing.SigningKey
    settings: Settings
    holder: str
    now: Callable[[], float]
    run: Callable[..., Awaitable[Any]] = field(repr=False)

    async def call(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        result: T = await self.run(fn, *args, **kw)
        return result


@dataclass
class _Hold:
    """Until when this router surely holds the lease (the time before the last
    successful take or renewal, plus ``lease_s``)."""

    until: float = 0.0

    def budget(self, ctx: Context) -> float:
        """How long a post may still take: it must end before the lease could have
        passed to another router (else that router's re-post of an earlier event
        could arrive after this one's later event)."""
        return self.until - ctx.now() - 0.1 * ctx.settings.lease_s


async def deliver(ctx: Context, uid: str) -> None:
    """Deliver until the subscription is disabled (or gone); cancel to stop."""
    s = ctx.settings
    while True:
        hold = _Hold()
        t0 = ctx.now()
        if not await ctx.call(ctx.store.hook_lease, uid, ctx.holder, t0, s.lease_s):
            if not await _active(ctx, uid):
                return
            await trio.sleep(s.lease_s / 3)
            continue
        hold.until = t0 + s.lease_s
        lost: list[bool] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_renew, ctx, uid, nursery.cancel_scope, lost, hold)
            try:
                await _pump(ctx, uid, hold)
            except LeaseLost:
                lost.append(True)
            nursery.cancel_scope.cancel()
        if lost:
            log.info("webhook %s: lost the delivery lease (another router holds it)", uid)
            continue
        await ctx.call(ctx.store.hook_release, uid, ctx.holder)
        return


async def _active(ctx: Context, uid: str) -> bool:
    body = await ctx.call(ctx.store.hook_get, uid)
    return body is not None and load(body, uid).state == "active"


async def _renew(ctx: Context, uid: str, scope: trio.CancelScope, lost: list[bool],
                 hold: _Hold) -> None:
    s = ctx.settings
    while True:
        await trio.sleep(s.lease_s / 3)
        t0 = ctx.now()
        if not await ctx.call(ctx.store.hook_lease, uid, ctx.holder, t0, s.lease_s):
            lost.append(True)
            scope.cancel()
            return
        hold.until = t0 + s.lease_s


async def _pump(ctx: Context, uid: str, hold: _Hold) -> None:
    """Post events after the cursor until the subscription is disabled.  The cursor
    write (an fsync on the folder store) is coalesced: at most every ``advance_s``
    while posts succeed, and always before a retry wait and at a batch's end."""
    s = ctx.settings
    while True:
        body = await ctx.call(ctx.store.hook_get, uid)
        if body is None:
            return
        sub = load(body, uid)
        if sub.state != "active":
            return
        events = [json.loads(e) for e in
                  await ctx.call(ctx.store.feed_read, sub.cursor, s.batch)]
        if not events:
            await trio.sleep(s.poll_s)
            continue
        pending: dict[str, Any] | None = None     # passed, cursor not yet written
        delivered = False
        written = trio.current_time()
        for ev in events:
            if sub.wants(ev["type"]):
                while not await _post_once(ctx, sub, ev, hold):
                    if pending is not None:
                        sub = await _advance(ctx, uid, pending, delivered)
                        pending, delivered = None, False
                    await trio.sleep(s.retry_interval_s)
                    if not await _active(ctx, uid):
                        return
                delivered = True
            pending = ev
            if delivered and trio.current_time() - written >= s.advance_s:
                sub = await _advance(ctx, uid, pending, delivered)
                pending, delivered, written = None, False, trio.current_time()
                if sub.state != "active":
                    return   # disabled by another router meanwhile
        if pending is not None:
            await _advance(ctx, uid, pending, delivered)


async def _advance(ctx: Context, uid: str, ev: dict[str, Any], delivered: bool,
                   ) -> Subscription:
    now = ctx.now()

    def past(old: bytes | None) -> bytes:
        assert old is not None
        sub = load(old, uid)
        if ev["seq"] <= sub.cursor:
            return old
        upd: dict[str, Any] = {"cursor": ev["seq"], "cursor_at": ev["at"]}
        if delivered:
            upd["last_delivered_at"] = rfc3339(now)
        return canonical({**sub.public(), **upd})

    new = await ctx.call(ctx.store.hook_update, uid, past, holder=ctx.holder, now=now)
    if new is None:
        raise LeaseLost
    return load(new, uid)


async def _post_once(ctx: Context, sub: Subscription, ev: dict[str, Any], hold: _Hold,
                     ) -> bool:
    """One post of ``ev``: True on a 2xx; anything else is logged (never the URL's
    path or query) and False.  Its time is bounded by ``timeout_s`` and by the
    lease (:class:`_Hold`); no time left is :class:`LeaseLost` (take it again)."""
    s = ctx.settings
    body = canonical(post_body(ev))
    budget = min(s.timeout_s, hold.budget(ctx))
    if budget <= 0:
        raise LeaseLost
    pol = policy(s.allow_insecure_targets, budget, s.ca_file)
    shown = "the subscription's URL"
    try:
        target = check_url(sub.url, s.allow_insecure_targets)   # the settings may change
        shown = target.shown()
        addresses = await vet(target, pol)
        status = await post(target, addresses, body,
                            signing.sign(ctx.key, int(ctx.now()), body), pol)
        if 200 <= status < 300:
            return True
        why = f"status {status}"
    except OutboundFailed as exc:
        why = str(exc)
    except AotxError as exc:    # refused by the URL rules or the address policy now
        why = str(exc.fields.get("rule", exc.code))
    log.warning("webhook %s: post of seq %d to %s failed (%s); retrying in %g s",
                sub.uuid, ev["seq"], shown, why, s.retry_interval_s)
    return False
