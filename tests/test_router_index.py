"""The GET /models index (aotx_trio.router.index) on both store backends: the first
load before started(), following the feed, a cursor the trimmed feed no longer holds
(reload), a refresh that fails (logged, retried, the old rows kept), filters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)

from aotx_trio.errors import NotReady
from aotx_trio.identity import Descriptor
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.store import StoreBackend
from aotx_trio.router.artifacts import store_artifact
from aotx_trio.router.index import ModelIndex
from aotx_trio.router.registry import Registry

pytestmark = pytest.mark.timeout(120)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPEC = {"spec_dsl": 2, "interaction": "request_response", "params": [], "results": {}}


@pytest.fixture(params=["folder", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StoreBackend:
    store = open_store(data=tmp_path) if request.param == "folder" else \
        open_store(url=request.getfixturevalue("postgres_url"))
    request.addfinalizer(store.close)
    return store


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
async def reg(backend: StoreBackend) -> AsyncIterator[Registry]:
    yield Registry(backend, now=Clock())


async def _publish(reg: Registry, tmp_path: Path, model_id: str,
                   model_type: str = "textgen") -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + b"w")
    art = await reg.run(store_artifact, reg.store, path)
    await reg.mint_release("r1", art, Descriptor(), COMMIT)
    await reg.publish(model_id, {"model_type": model_type,
                                 "artifact": art.model_dump(mode="json"),
                                 "serving": {"runtime_release": {"name": "r1",
                                                                 "source_commit": COMMIT},
                                             "spec": SPEC}})


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["model_id"] for r in rows]


async def test_first_load_then_follows_the_feed(reg: Registry, tmp_path: Path,
                                                autojump_clock: trio.testing.MockClock,
                                                ) -> None:
    await _publish(reg, tmp_path, "m/b")
    await _publish(reg, tmp_path, "m/a")
    index = ModelIndex(reg, interval_s=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        assert ids(index.list()) == ["m/a", "m/b"]          # complete before started()
        await _publish(reg, tmp_path, "m/c")
        await reg.set_model_state("m/a", "deprecated")
        await index.refreshed.wait()      # (MockClock: the interval passes at once)
        await index.refreshed.wait()
        assert ids(index.list()) == ["m/b", "m/c"]
        assert ids(index.list(state_filter="deprecated")) == ["m/a"]
        assert ids(index.list(state_filter="all")) == ["m/a", "m/b", "m/c"]
        assert index.list(model_type="embedding") == []
        await reg.unpublish("m/b")
        await index.refreshed.wait()
        await index.refreshed.wait()      # one refresh that began after the change
        assert ids(index.list(state_filter="all")) == ["m/a", "m/c"]
        nursery.cancel_scope.cancel()


async def test_a_trimmed_feed_reloads(reg: Registry, tmp_path: Path) -> None:
    await _publish(reg, tmp_path, "m/a")
    index = ModelIndex(reg)
    await index.reload()
    head = index.cursor
    assert head > 0
    # other writers move on, then the feed is trimmed past our cursor (the newest kept)
    await _publish(reg, tmp_path, "m/b")
    await reg.set_model_state("m/a", "disabled")
    assert isinstance(reg.now, Clock)
    reg.now.t += reg.retention_s + 10
    await _publish(reg, tmp_path, "m/c")
    assert await reg.trim() > 0
    first = (await reg.events(0, 1))[0]["seq"]
    assert first > head + 1
    await index.refresh()
    assert ids(index.list()) == ["m/b", "m/c"]
    assert ids(index.list(state_filter="disabled")) == ["m/a"]


class Flaky:
    """A store whose feed reads fail while ``down`` (every other call passes through)."""

    def __init__(self, inner: StoreBackend) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def feed_read(self, after: int, limit: int) -> list[bytes]:
        if self.down:
            raise NotReady("the PostgreSQL registry store cannot be reached")
        return self.inner.feed_read(after, limit)


async def test_a_failed_refresh_keeps_the_rows_and_retries(
        backend: StoreBackend, tmp_path: Path, autojump_clock: trio.testing.MockClock,
        caplog: pytest.LogCaptureFixture) -> None:
    flaky = Flaky(backend)
    reg = Registry(flaky, now=Clock())   # type: ignore[arg-type]
    await _publish(reg, tmp_path, "m/a")
    index = ModelIndex(reg, interval_s=30)
    async with trio.open_nursery() as nursery:
        await nursery.start(index.run)
        flaky.down = True
        await _publish(reg, tmp_path, "m/b")
        await index.refreshed.wait()
        await index.refreshed.wait()
        assert ids(index.list()) == ["m/a"]
        assert "index refresh failed" in caplog.text
        flaky.down = False
        await index.refreshed.wait()
        await index.refreshed.wait()
        assert ids(index.list()) == ["m/a", "m/b"]
        nursery.cancel_scope.cancel()


def test_a_bad_interval_is_refused(tmp_path: Path) -> None:
    reg = Registry(open_store(data=tmp_path))
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            ModelIndex(reg, interval_s=bad)
