"""Webhook delivery (aotx_trio/webhooks/delivery.py, service.py) to a real consumer
over HTTPS (trustme CA, loopback allowed by allow_insecure_targets): every post
verified with PyNaCl, in feed order, at least once; a consumer down then back loses
nothing; backfill replays; a disabled subscription stops; a holder cancelled between
post and cursor advance (its lease left to expire) is re-posted by the next holder;
two routers on one PostgreSQL store lose and reorder nothing."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
import trio
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from _webhook_env import Receiver, append_events, first_seen, receiving

from aotx_trio.registry.backends import open_store
from aotx_trio.registry.store import StoreBackend
from aotx_trio.webhooks import signing
from aotx_trio.webhooks.delivery import Settings
from aotx_trio.webhooks.service import WebhookService

pytestmark = pytest.mark.timeout(120)

KEY = nacl.signing.SigningKey(bytes(range(32)))


def fast(ca_file: str | None, **kw: Any) -> Settings:
    base: dict[str, Any] = {"retry_interval_s": 0.05, "timeout_s": 5.0,
                            "allow_insecure_targets": True, "ca_file": ca_file,
                            "lease_s": 1.0, "poll_s": 0.02, "sync_s": 0.2}
    return Settings(**{**base, **kw})


@pytest.fixture
def store(tmp_path: Path) -> StoreBackend:
    return open_store(data=tmp_path / "data")


async def until(check: Any, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not check():
            await trio.sleep(0.02)


async def started(nursery: trio.Nursery, svc: WebhookService) -> trio.CancelScope:
    """Run ``svc`` in its own cancel scope (cancelling it = the router dying)."""
    async def run(task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            await svc.run(task_status=_Relay(task_status, scope))
    scope: trio.CancelScope = await nursery.start(run)
    return scope


class _Relay:
    def __init__(self, status: trio.TaskStatus[trio.CancelScope], scope: trio.CancelScope,
                 ) -> None:
        self.status, self.scope = status, scope

    def started(self, value: None = None) -> None:
        self.status.started(self.scope)


@pytest.fixture
async def consumer(tmp_path: Path) -> AsyncIterator[tuple[Receiver, str, str | None]]:
    rx = Receiver(public_key=signing.public_hex(KEY))
    async with receiving(tmp_path, rx) as (url, ca):
        yield rx, url, ca


async def test_signed_posts_in_feed_order(store: StoreBackend, consumer: Any,
                                          caplog: pytest.LogCaptureFixture) -> None:
    rx, url, ca = consumer
    ops = append_events(store, 5)
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        sub = await svc.create({"url": url, "backfill": True}, "ops")
        ops += append_events(store, 5, start=5)
        await until(lambda: len(rx.accepted) >= 10)
        # cursor writes are coalesced (at most one per 0.25 s): wait for the last one
        with trio.fail_after(10):
            while (await svc.list())["webhooks"][0]["cursor"] != 10:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    assert rx.accepted == ops and rx.refused == 0      # every post verified, in order
    body = rx.posts[0]
    assert set(body) == {"schema", "type", "subject", "at", "object_sha256", "operation_id",
                         "payload"} and body["schema"] == 1 and body["type"] == "alias.moved"
    assert rx.heads[0]["x-serving-signature"].startswith("ed25519=")
    got = (await svc.list())["webhooks"]
    assert got[0]["uuid"] == sub["uuid"] and got[0]["cursor"] == 10
    assert got[0]["last_delivered_at"] is not None and got[0]["cursor_at"] is not None
    assert "SECRET-TOKEN" not in caplog.text


async def test_consumer_down_then_back_loses_nothing(store: StoreBackend,
                                                     consumer: Any,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    rx, url, ca = consumer
    rx.answer = lambda n, body: 500 if n < 8 else 200     # down for 8 posts
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        await svc.create({"url": url}, "ops")
        ops = append_events(store, 6)
        await until(lambda: len(rx.accepted) >= 6)
        nursery.cancel_scope.cancel()
    assert rx.accepted == ops
    assert [p["operation_id"] for p in rx.posts[:9]] == [ops[0]] * 9   # the same event retried
    assert "status 500" in caplog.text and "SECRET-TOKEN" not in caplog.text


async def test_head_start_filters_and_backfill(store: StoreBackend, consumer: Any) -> None:
    rx, url, ca = consumer
    old = append_events(store, 3)
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        head = await svc.create({"url": url + "&head=1", "events": ["model.published"]}, "ops")
        assert head["cursor"] == 3 and head["events"] == ["model.published"]
        new_alias = append_events(store, 2, start=3)
        published = append_events(store, 2, start=5, kind="model.published")
        await until(lambda: len(rx.accepted) >= 2)
        await until(lambda: any(w["cursor"] == 7 for w in [*_subs(store)]))
        back = await svc.create({"url": url, "backfill": True}, "ops")
        assert back["cursor"] == 0
        await until(lambda: len(rx.accepted) >= 2 + 7)
        nursery.cancel_scope.cancel()
    assert rx.accepted[:2] == published             # filtered types skipped, cursor moved
    assert rx.accepted[2:] == old + new_alias + published   # the replay, in order


def _subs(store: StoreBackend) -> list[dict[str, Any]]:
    return [json.loads(b) for b in store.hook_list()]


async def test_disable_stops_delivery_and_keeps_history(store: StoreBackend,
                                                        consumer: Any) -> None:
    rx, url, ca = consumer
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        sub = await svc.create({"url": url}, "ops")
        append_events(store, 2)
        await until(lambda: len(rx.accepted) >= 2)
        off = await svc.disable(sub["uuid"], "rotating the consumer")
        assert off["state"] == "disabled" and off["why"] == "rotating the consumer"
        await until(lambda: not svc._tasks)
        append_events(store, 3, start=2)
        await trio.sleep(0.5)
        nursery.cancel_scope.cancel()
    assert len(rx.accepted) == 2
    (row,) = (await svc.list())["webhooks"]
    assert row["url"] == url and row["state"] == "disabled" and row["disabled_at"]
    assert row["cursor"] == 2


async def test_holder_killed_between_post_and_advance_reposts(store: StoreBackend,
                                                              consumer: Any) -> None:
    rx, url, ca = consumer
    ops = append_events(store, 6)
    a = WebhookService(store, KEY, fast(ca), holder="router-a")
    b = WebhookService(store, KEY, fast(ca), holder="router-b")
    async with trio.open_nursery() as nursery:
        scope_a = await started(nursery, a)
        killed: list[str] = []

        def kill_on_third(body: dict[str, Any]) -> None:
            if len(rx.posts) == 3 and not killed:
                killed.append(body["operation_id"])
                scope_a.cancel()         # no release: the lease stays until it expires
        rx.on_post = kill_on_third
        await a.create({"url": url, "backfill": True}, "ops")
        await until(lambda: bool(killed))
        await trio.sleep(0.1)
        lease = json.loads((Path(store.root) / "webhooks"  # type: ignore[attr-defined]
                            / f"{_subs(store)[0]['uuid']}.lease").read_bytes())
        assert lease["holder"] == "router-a"
        await started(nursery, b)
        await until(lambda: len(set(rx.accepted)) >= 6)
        await until(lambda: _subs(store)[0]["cursor"] == 6)   # coalesced cursor writes
        nursery.cancel_scope.cancel()
    assert first_seen(rx.accepted) == ops
    assert rx.accepted.count(killed[0]) == 2        # re-posted by the next holder
    assert _subs(store)[0]["cursor"] == 6


async def test_two_routers_on_postgres_lose_and_reorder_nothing(
        postgres_url: str, tmp_path: Path) -> None:  # noqa: F811
    s1, s2 = open_store(url=postgres_url), open_store(url=postgres_url)
    rx = Receiver(public_key=signing.public_hex(KEY))
    try:
        async with receiving(tmp_path, rx) as (url, ca), trio.open_nursery() as nursery:
            a = WebhookService(s1, KEY, fast(ca), holder="router-a")
            b = WebhookService(s2, KEY, fast(ca), holder="router-b")
            scope_a = await started(nursery, a)
            await started(nursery, b)
            for i in range(2):
                await a.create({"url": url + f"&s={i}"}, "ops")
            ops: list[str] = []
            for round_ in range(4):
                ops += await trio.to_thread.run_sync(
                    lambda r=round_: append_events(s1 if r % 2 else s2, 25, start=25 * r))
                await trio.sleep(0.2)
                if round_ == 1:
                    scope_a.cancel()     # router A dies; B takes its leases over
            await until(lambda: len(set(rx.accepted)) >= 100 and
                        all(json.loads(x)["cursor"] == 100 for x in s1.hook_list()) and
                        all(len(set(rx.accepted_for(f"s={i}"))) == 100 for i in range(2)), 30)
            nursery.cancel_scope.cancel()
    finally:
        s1.close()
        s2.close()
    assert rx.refused == 0
    for i in range(2):          # per subscription: nothing lost, nothing reordered
        assert first_seen(rx.accepted_for(f"s={i}")) == ops


async def test_real_changes_and_a_healed_event(tmp_path: Path, store: StoreBackend,
                                               consumer: Any) -> None:
    """A registry change posts its feed event as is; a change whose event append was
    lost is re-emitted by the rescan at the head and posted with the heal time."""
    from _gateway_env import make_runtime_file
    from _router_env import tiny_gguf

    from aotx_trio.identity import Descriptor
    from aotx_trio.registry import feed
    from aotx_trio.registry.records import parse_time
    from aotx_trio.router.artifacts import store_artifact
    from aotx_trio.router.registry import Registry

    rx, url, ca = consumer
    reg = Registry(store)
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        await svc.create({"url": url, "events": ["release.minted"]}, "ops")
        make_runtime_file(tmp_path / "rt")
        art = await reg.run(store_artifact, store, tiny_gguf(tmp_path))
        await reg.mint_release("tiny-r1", art, Descriptor(), "a" * 40)
        await until(lambda: len(rx.accepted) >= 1)
        # the same release document written without its event (a lost append)
        body = store.get("releases", "tiny-r1")
        assert body is not None
        lost = body.replace(b'"tiny-r1"', b'"tiny-r2"')
        store.create("releases", "tiny-r2", lost)
        t = time.time()
        assert len(feed.heal(store, t)) == 1
        await until(lambda: len(rx.accepted) >= 2)
        nursery.cancel_scope.cancel()
    minted, healed = rx.posts
    assert minted["type"] == "release.minted" and minted["subject"] == "tiny-r1"
    assert minted["payload"]["source_commit"] == "a" * 40 and "healed" not in minted["payload"]
    assert healed["subject"] == "tiny-r2" and healed["payload"]["healed"] is True
    assert abs(parse_time(healed["at"]) - t) < 1e-3            # the heal time
    assert healed["operation_id"] == feed.operation_id("release.minted", "tiny-r2",
                                                       healed["object_sha256"])


async def test_a_corrupt_subscription_stops_only_itself(store: StoreBackend,
                                                        consumer: Any,
                                                        caplog: pytest.LogCaptureFixture,
                                                        ) -> None:
    rx, url, ca = consumer
    store.hook_create("00000000-0000-4000-8000-000000000000", b'{"not": "a subscription"}')
    svc = WebhookService(store, KEY, fast(ca))
    async with trio.open_nursery() as nursery:
        await started(nursery, svc)
        await svc.create({"url": url}, "ops")
        ops = append_events(store, 2)
        await until(lambda: len(rx.accepted) >= 2)
        nursery.cancel_scope.cancel()
    assert rx.accepted == ops and "is corrupt" in caplog.text
