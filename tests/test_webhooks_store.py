"""Webhook subscriptions and their delivery leases in both store backends (folder and
a real PostgreSQL): write-once creation, locked updates, the lease taken, refused to
another holder, taken over after expiry, and cursor writes conditional on holding it."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)

from aotx_trio.registry.backends import open_store
from aotx_trio.registry.store import StoreBackend

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["folder", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "folder":
        s = open_store(data=tmp_path / "data")
    else:
        s = open_store(url=request.getfixturevalue("postgres_url"))
    yield s
    s.close()


def test_create_get_list_update(store: StoreBackend) -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    assert store.hook_create(a, b'{"n":1}') is None
    assert store.hook_create(a, b'{"n":2}') == b'{"n":1}'        # write-once
    assert store.hook_create(b, b'{"n":3}') is None
    assert store.hook_get(a) == b'{"n":1}' and store.hook_get(str(uuid.uuid4())) is None
    assert sorted(store.hook_list()) == [b'{"n":1}', b'{"n":3}']
    assert store.hook_update(a, lambda old: old + b" ") == b'{"n":1} '
    with pytest.raises(KeyError):
        store.hook_update(str(uuid.uuid4()), lambda old: b"x")


def test_create_admits_under_the_lock_and_delete(store: StoreBackend) -> None:
    """``admit`` sees every subscription and may refuse (nothing is created); threads
    creating at once under a bound of 3 create exactly 3; a delete drops the document
    and its lease."""
    def at_most(n: int) -> Any:
        def admit(existing: list[bytes]) -> None:
            if len(existing) >= n:
                raise OverflowError(len(existing))
        return admit

    made: list[str] = []

    def one() -> None:
        u = str(uuid.uuid4())
        try:
            store.hook_create(u, b"{}", at_most(3))
            made.append(u)
        except OverflowError:
            pass
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 3 and len(store.hook_list()) == 3
    assert store.hook_lease(made[0], "a", 100.0, 10.0)
    store.hook_delete(made[0])
    store.hook_delete(made[0])                                    # absent: nothing
    assert store.hook_get(made[0]) is None and len(store.hook_list()) == 2
    assert store.hook_create(made[0], b"{}") is None              # no lease left over
    assert store.hook_lease(made[0], "b", 101.0, 10.0)


def test_lease_and_conditional_cursor_write(store: StoreBackend) -> None:
    u = str(uuid.uuid4())
    store.hook_create(u, b"0")
    assert store.hook_lease(u, "a", 100.0, 10.0)
    assert not store.hook_lease(u, "b", 105.0, 10.0)              # a holds it
    assert store.hook_lease(u, "a", 105.0, 10.0)                  # renewed to 115
    assert store.hook_update(u, lambda o: b"1", holder="a", now=106.0) == b"1"
    assert store.hook_update(u, lambda o: b"2", holder="b", now=106.0) is None
    assert not store.hook_lease(u, "b", 114.0, 10.0)
    assert store.hook_lease(u, "b", 116.0, 10.0)                  # expired: taken over
    assert store.hook_update(u, lambda o: b"3", holder="a", now=117.0) is None   # a lost it
    assert store.hook_get(u) == b"1"
    store.hook_release(u, "a")                                    # not a's: no effect
    assert not store.hook_lease(u, "a", 117.0, 10.0)
    store.hook_release(u, "b")
    assert store.hook_lease(u, "a", 117.0, 10.0)


def test_one_holder_among_racing_takers(store: StoreBackend) -> None:
    u = str(uuid.uuid4())
    store.hook_create(u, b"0")
    won: list[str] = []

    def take(name: str) -> None:
        if store.hook_lease(u, name, 50.0, 30.0):
            won.append(name)
    threads = [threading.Thread(target=take, args=(f"h{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1


def test_feed_head(store: StoreBackend) -> None:
    assert store.feed_head() == 0
    store.feed_append(b'{"operation_id":"op_1","at":"x"}', "op_1", 1.0)
    store.feed_append(b'{"operation_id":"op_2","at":"x"}', "op_2", 2.0)
    assert store.feed_head() == 2
