"""The registry store on both backends (folder and a real PostgreSQL server):
publication and unpublication markers, releases, aliases, the event feed and its
rescan heal, scratch sessions."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _postgres import postgres_server, postgres_url  # noqa: F401  (fixtures)
from pydantic import ValidationError

from aotx_trio.errors import AotxError, Conflict, Forbidden, FormatError, Gone, NotFound, NotReady
from aotx_trio.identity import Descriptor, canonical, sha256_hex
from aotx_trio.registry import feed
from aotx_trio.registry.backends import open_store
from aotx_trio.registry.records import ArtifactRef, Event, Release, parse, rfc3339
from aotx_trio.registry.store import StoreBackend
from aotx_trio.router.aliases import resolve, resolve_alias, set_alias
from aotx_trio.router.artifacts import export_artifact, store_artifact, verify_artifact
from aotx_trio.router.registry import Registry
from aotx_trio.router.scratch import Scratch

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SPEC = {"spec_dsl": 2, "interaction": "request_response", "params": [], "results": {}}
MID = "runs/demo/r1/checkpoints/step-000200000.inference-gemma-r1.json"
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(params=["folder", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> StoreBackend:
    if request.param == "folder":
        store = open_store(data=tmp_path)
    else:
        store = open_store(url=request.getfixturevalue("postgres_url"))
    request.addfinalizer(store.close)
    return store


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def reg(backend: StoreBackend, clock: Clock) -> AsyncIterator[Registry]:
    yield Registry(backend, now=clock)


def gguf(folder: Path, name: str = "m.gguf", body: bytes = b"weights") -> Path:
    path = folder / name
    path.write_bytes(b"GGUF" + body)
    return path


def manifest(art: ArtifactRef, release: str = "gemma-r1", **extra: Any) -> dict[str, Any]:
    return {"model_type": "textgen", "artifact": art.model_dump(mode="json"),
            "serving": {"runtime_release": {"name": release, "source_commit": COMMIT},
                        "spec": SPEC}, **extra}


async def published(reg: Registry, tmp_path: Path, model_id: str = MID,
                    release: str = "gemma-r1", body: bytes = b"weights") -> ArtifactRef:
    art = await reg.run(store_artifact, reg.store, gguf(tmp_path, f"{release}.gguf", body))
    await reg.mint_release(release, art, Descriptor(), COMMIT)
    await reg.publish(model_id, manifest(art, release))
    return art


def code_of(info: pytest.ExceptionInfo[AotxError]) -> str:
    return info.value.code


# descriptor_sha256 of descriptors that do not set kv_type, computed on the commit
# before the field existed (f0054dc): existing releases keep their digests
DEFAULT_DESCRIPTOR_SHA256 = "9792627ce99c3288462979be0f0e45697686c3bdb7116ca3e4f179683c066573"
THREADS4_CONTEXT4096_SHA256 = "1ca6b103708b5a80ed0a63b40d0ef8791d984d2f0a6f79e16e08a30b1a0a7e23"


def test_descriptor_digests_are_pinned_and_kv_type_is_part_of_them_when_set() -> None:
    def digest(d: Descriptor) -> str:
        return sha256_hex(d.body())

    assert digest(Descriptor()) == DEFAULT_DESCRIPTOR_SHA256
    assert digest(Descriptor(kv_type=None)) == DEFAULT_DESCRIPTOR_SHA256
    assert Descriptor().body() == (b'{"backend":"cpu","context":2048,"kv_page_tokens":8,'
                                   b'"threads":0}')
    assert digest(Descriptor(threads=4, context=4096)) == THREADS4_CONTEXT4096_SHA256
    assert digest(Descriptor.model_validate({"threads": 4, "context": 4096,
                                             "kv_type": None})) == THREADS4_CONTEXT4096_SHA256
    # unset is absent from every dump (the release document, the CLI's JSON, model.load)
    assert "kv_type" not in Descriptor().model_dump(mode="json")
    assert "kv_type" not in json.loads(Descriptor().model_dump_json())
    # set (even to the default, f16) it is another descriptor with another digest
    f16, f32 = Descriptor(kv_type="f16"), Descriptor(kv_type="f32")
    assert len({digest(Descriptor()), digest(f16), digest(f32)}) == 3
    assert json.loads(f32.body()) == {"backend": "cpu", "context": 2048,
                                      "kv_page_tokens": 8, "kv_type": "f32", "threads": 0}
    assert (Descriptor().kv_f16, f16.kv_f16, f32.kv_f16) == (True, True, False)
    with pytest.raises(ValidationError) as bad:
        Descriptor(kv_type="bf16")  # type: ignore[arg-type]
    assert bad.value.errors()[0]["loc"] == ("kv_type",)


def test_a_release_document_keeps_its_bytes_and_round_trips_kv_type() -> None:
    art = ArtifactRef(sha256="4f" * 32, kind="gguf", size=10)
    for d in (Descriptor(), Descriptor(kv_type="f32")):
        rel = Release(name="r1", artifact=art, descriptor=d,
                      descriptor_sha256=sha256_hex(d.body()), source_commit=COMMIT,
                      minted_at=rfc3339(T0))
        assert json.loads(rel.body())["descriptor"] == json.loads(d.body())
        assert parse(Release, rel.body(), "releases/r1") == rel
    corrupt = rel.body().replace(b'"f32"', b'"f8"')
    with pytest.raises(FormatError) as info:
        parse(Release, corrupt, "releases/r1")
    assert code_of(info) == "registry_corrupt"


async def test_publish_read_and_unpublish_marker(reg: Registry, tmp_path: Path,
                                                 clock: Clock) -> None:
    with trio.fail_after(30):
        art = await published(reg, tmp_path)
        view = await reg.get_model(MID)
        assert view.state == "active" and view.manifest.model_type == "textgen"
        assert view.manifest.artifact == art and view.published.release == "gemma-r1"
        assert [v.model_id for v in await reg.list_models()] == [MID]
        assert await reg.list_models(model_type="embedding") == []
        # a retry of the same publication is a no-op; other content under the id is 409
        assert (await reg.publish(MID, manifest(art))).manifest_sha256 == view.manifest_sha256
        with pytest.raises(Conflict):
            await reg.publish(MID, manifest(art, note="other"))
        # a stored training manifest that was never published
        await reg.put_manifest("runs/demo/r1/unpub.json", manifest(art))
        with pytest.raises(NotFound) as info:
            await reg.get_model("runs/demo/r1/unpub.json")
        assert code_of(info) == "model_not_found"
        assert info.value.fields["reason"] == "unpublished"
        with pytest.raises(NotFound) as info:
            await reg.get_model("runs/none")
        assert code_of(info) == "model_not_found" and "reason" not in info.value.fields
        with pytest.raises(NotFound):
            await reg.get_model("../etc/passwd")
        # unpublication is write-once and final
        clock.t += 10
        marker = await reg.unpublish(MID, reason="superseded")
        clock.t += 10
        assert await reg.unpublish(MID) == marker
        for call in (reg.get_model(MID), reg.publish(MID, manifest(art))):
            with pytest.raises(Gone) as gone:
                await call
            assert code_of(gone) == "model_removed"
            assert gone.value.fields["removed_at"] == rfc3339(T0 + 10)
        assert await reg.list_models(state_filter="all") == []
        types = [e["type"] for e in await reg.events()]
        assert types == ["release.minted", "model.published", "model.unpublished"]


async def test_model_state_and_filters(reg: Registry, tmp_path: Path) -> None:
    with trio.fail_after(30):
        await published(reg, tmp_path)
        await published(reg, tmp_path, "runs/demo/r2.json", "gemma-r2", b"other")
        await reg.set_model_state(MID, "deprecated", successor_id="runs/demo/r2.json")
        view = await reg.get_model(MID)
        assert (view.state, view.successor_id) == ("deprecated", "runs/demo/r2.json")
        assert [v.model_id for v in await reg.list_models()] == ["runs/demo/r2.json"]
        assert [v.model_id for v in await reg.list_models(state_filter="deprecated")] == [MID]
        assert len(await reg.list_models(state_filter="all")) == 2
        with pytest.raises(AotxError) as info:
            await reg.set_model_state(MID, "sleeping")
        assert code_of(info) == "invalid_params"
        with pytest.raises(AotxError):
            await reg.set_model_state(MID, "disabled", successor_id=MID)
        ev = (await reg.events())[-1]
        assert ev["type"] == "model.state_changed" and ev["payload"]["state"] == "deprecated"


async def test_release_mint_deploy_and_state(reg: Registry, tmp_path: Path) -> None:
    with trio.fail_after(30):
        art = await reg.run(store_artifact, reg.store, gguf(tmp_path))
        rel = await reg.mint_release("gemma-r1", art, Descriptor(threads=2), COMMIT)
        assert rel.descriptor_sha256 and rel.engine_set_sha256 is None
        assert await reg.mint_release("gemma-r1", art, Descriptor(threads=2), COMMIT) == rel
        with pytest.raises(Conflict):
            await reg.mint_release("gemma-r1", art, Descriptor(threads=4), COMMIT)
        with pytest.raises(AotxError) as info:   # an artifact the store lacks
            await reg.mint_release("ghost", ArtifactRef(sha256="0" * 64, kind="gguf", size=1),
                                   Descriptor(), COMMIT)
        assert info.value.fields["rule"] == "present"
        dep = await reg.deploy_release("gemma-r1", "host-a")
        assert dep.descriptor_sha256 == rel.descriptor_sha256
        await reg.mint_release("gemma-r2", art, Descriptor(), COMMIT)
        with pytest.raises(AotxError) as info:
            await reg.set_release_state("gemma-r1", "deprecated")
        assert (code_of(info), info.value.fields["rule"]) == ("invalid_params", "enum")
        await reg.set_release_state("gemma-r1", "disabled", successor="gemma-r2")
        view = await reg.get_release("gemma-r1")
        assert (view.state, view.successor) == ("disabled", "gemma-r2")
        with pytest.raises(Forbidden) as forbidden:
            await reg.deploy_release("gemma-r1", "host-b")
        assert code_of(forbidden) == "release_disabled"
        assert forbidden.value.fields["successor"] == "gemma-r2"
        with pytest.raises(NotFound):
            await reg.get_release("nope")
        # a manifest whose binding disagrees with its release is refused
        other = manifest(art)
        other["serving"]["runtime_release"]["source_commit"] = "f" * 40
        with pytest.raises(AotxError) as info:
            await reg.publish("runs/x.json", other)
        assert info.value.fields["rule"] == "release_binding"
        types = [e["type"] for e in await reg.events()]
        assert types == ["release.minted", "release.deployed", "release.minted",
                         "release.state_changed"]


async def test_alias_chain_table(reg: Registry, tmp_path: Path, backend: StoreBackend) -> None:
    with trio.fail_after(30):
        await published(reg, tmp_path)
        await set_alias(reg, "default/text", MID, 0)
        await set_alias(reg, "chat/stable", "default/text", 1)
        await set_alias(reg, "chat/latest", "chat/stable", 2)
        res = await resolve_alias(reg, "chat/latest")
        assert res.model_id == MID
        assert res.chain == [{"name": "chat/latest", "level": 2, "target": "chat/stable"},
                             {"name": "chat/stable", "level": 1, "target": "default/text"},
                             {"name": "default/text", "level": 0, "target": MID}]
        view, via = await resolve(reg, "chat/latest")
        assert view.model_id == MID and via is not None
        assert (await resolve(reg, MID))[1] is None

        async def unresolved(name: str) -> dict[str, Any]:
            with pytest.raises(NotFound) as info:
                await resolve_alias(reg, name)
            assert code_of(info) == "alias_unresolved"
            return info.value.fields

        # missing target
        await set_alias(reg, "a/missing", "runs/none.json", 0, verify=False)
        got = await unresolved("a/missing")
        assert got["reason"] == "missing"
        assert got["chain"] == [{"name": "a/missing", "level": 0, "target": "runs/none.json"}]
        assert (await unresolved("no/such/alias"))["reason"] == "missing"
        # corrupt link in the middle
        await set_alias(reg, "a/top", "a/mid", 1, verify=False)
        await reg.run(backend.put, "aliases", "a/mid", b"{not json")
        got = await unresolved("a/top")
        assert (got["reason"], got["at"], len(got["chain"])) == ("corrupt", "a/mid", 1)
        # level mismatch: a level-1 alias pointing straight at a model, a level-2 at level 0
        await set_alias(reg, "a/skip", MID, 1, verify=False)
        assert (await unresolved("a/skip"))["reason"] == "level_mismatch"
        await set_alias(reg, "a/jump", "default/text", 2, verify=False)
        assert (await unresolved("a/jump"))["reason"] == "level_mismatch"
        # cycle
        await set_alias(reg, "c/one", "c/two", 1, verify=False)
        await set_alias(reg, "c/two", "c/one", 0, verify=False)
        got = await unresolved("c/one")
        assert got["reason"] == "cycle" and [c["name"] for c in got["chain"]] == ["c/one",
                                                                                 "c/two"]
        # over-deep: a chain a deeper registry accepts is too deep for the default one
        deep = Registry(backend, now=reg.now, max_alias_level=7)
        prev = "default/text"
        for level in range(1, 6):
            await set_alias(deep, f"d/{level}", prev, level)
            prev = f"d/{level}"
        assert (await resolve_alias(deep, "d/5")).model_id == MID
        got = await unresolved("d/5")
        assert got["reason"] == "too_deep" and got["chain"][0]["level"] == 5
        with pytest.raises(AotxError):
            await set_alias(reg, "d/6", "d/5", 6)
        # verify refuses what would not resolve; an alias cannot shadow a model id
        with pytest.raises(NotFound):
            await set_alias(reg, "a/bad", "runs/none.json", 0)
        with pytest.raises(Conflict):
            await set_alias(reg, MID, "default/text", 1)
        with pytest.raises(Conflict):
            await reg.publish("default/text", manifest(view.manifest.artifact))
        # removed model: every alias on it stops resolving
        await reg.unpublish(MID)
        got = await unresolved("chat/latest")
        assert got["reason"] == "removed" and len(got["chain"]) == 3


async def test_feed_order_dedupe_heal_and_trim(reg: Registry, tmp_path: Path,
                                               backend: StoreBackend, clock: Clock) -> None:
    with trio.fail_after(30):
        await published(reg, tmp_path)
        clock.t += 1
        await set_alias(reg, "default/text", MID, 0)
        events = await reg.events()
        assert [e["seq"] for e in events] == [1, 2, 3]
        for e in events:
            Event.model_validate(e)
            assert e["operation_id"] == feed.operation_id(e["type"], e["subject"],
                                                          e["object_sha256"])
        assert await reg.events(after=2) == events[2:]
        assert await reg.heal() == []   # nothing lost
        # lose an event: the object is written, its append never happens
        clock.t += 100
        from aotx_trio.registry.records import Alias
        doc = Alias(name="default/text", target=MID, level=0, set_at=rfc3339(clock.t)).body()
        await reg.run(backend.put, "aliases", "default/text", doc)
        clock.t += 5
        assert await reg.heal() == [4]
        healed = (await reg.events(after=3))[0]
        assert healed["type"] == "alias.moved" and healed["payload"]["healed"] is True
        assert healed["at"] == rfc3339(clock.t)
        assert await reg.heal() == []   # the heal is idempotent
        # retention: old events go, the newest stays, seq continues
        clock.t += feed.RETENTION_S + 10
        assert await reg.trim() == 3
        assert [e["seq"] for e in await reg.events()] == [4]
        await set_alias(reg, "default/text", MID, 0)
        assert [e["seq"] for e in await reg.events()] == [4, 5]
        # a change older than the retention is not re-emitted
        assert await reg.run(feed.heal, backend, clock.t + 2 * feed.RETENTION_S) == []


def test_feed_appends_from_threads_are_dense(backend: StoreBackend) -> None:
    def worker(n: int) -> None:
        for i in range(10):
            ev = canonical({"type": "alias.moved", "subject": f"w{n}", "at": rfc3339(T0),
                            "object_sha256": "0" * 64, "operation_id": f"op_{n}_{i}",
                            "payload": {}})
            backend.feed_append(ev, f"op_{n}_{i}", T0)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    seqs = [json.loads(b)["seq"] for b in backend.feed_read(0, 1000)]
    assert seqs == list(range(1, 41))
    assert backend.feed_append(b'{"operation_id":"op_0_0"}', "op_0_0", T0) is None


async def test_rescan_task_heals_on_its_interval(reg: Registry, tmp_path: Path,
                                                 backend: StoreBackend) -> None:
    with trio.fail_after(30):
        await published(reg, tmp_path)
        from aotx_trio.registry.records import Alias
        doc = Alias(name="x", target=MID, level=0, set_at=rfc3339(T0)).body()
        await reg.run(backend.put, "aliases", "x", doc)
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status=trio.TASK_STATUS_IGNORED: feed.run_rescan(
                backend, interval_s=0.05, now=reg.now, task_status=task_status))
            while len(await reg.events()) < 3:
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()
        assert (await reg.events())[-1]["payload"]["healed"] is True
        with pytest.raises(ValueError):
            await feed.run_rescan(backend, interval_s=0)


async def test_embedding_folder_artifact_roundtrip(reg: Registry, tmp_path: Path) -> None:
    with trio.fail_after(30):
        src = tmp_path / "minilm"
        (src / "sub").mkdir(parents=True)
        for name, body in [("config.json", b"{}"), ("tokenizer.json", b"{}"),
                           ("model.safetensors", b"\0" * 1000), ("sub/extra.txt", b"x")]:
            (src / name).write_bytes(body)
        art = await reg.run(store_artifact, reg.store, src)
        assert art.kind == "embedding_folder" and art.size == 1005
        assert await reg.run(verify_artifact, reg.store, art) == []
        out = await reg.run(export_artifact, reg.store, art, tmp_path / "out")
        assert (out / "sub" / "extra.txt").read_bytes() == b"x"
        assert (out / "model.safetensors").read_bytes() == b"\0" * 1000
        (src / "tokenizer.json").unlink()
        with pytest.raises(AotxError):
            await reg.run(store_artifact, reg.store, src)
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"nope")
        with pytest.raises(AotxError):
            await reg.run(store_artifact, reg.store, bad)


async def test_scratch_sessions_and_revisions(reg: Registry, tmp_path: Path,
                                              clock: Clock) -> None:
    with trio.fail_after(30):
        sc = Scratch(reg)
        art = await reg.run(store_artifact, reg.store, gguf(tmp_path))
        s = await sc.open(lease_s=60, based_on={"requested_selection": "demo/last"})
        with pytest.raises(NotReady) as info:
            await sc.current(s.session_id)
        assert code_of(info) == "scratch_not_ready"
        draft = {"model_type": "textgen",
                 "serving": {"runtime_release": {"name": "scratch", "source_commit": COMMIT}}}
        r1 = await sc.revise(s.session_id, spec=SPEC, artifact=art, draft_manifest=draft)
        r2 = await sc.revise(s.session_id,
                             spec={**SPEC, "params": [{"name": "x", "type": "string"}]},
                             artifact=art, draft_manifest=draft)
        assert (r1.generation, r2.generation) == (1, 2)
        rev, rev_sha = await sc.current(s.session_id)
        assert rev == r2 and len(rev_sha) == 64
        assert (await sc.get(s.session_id)).current_generation == 2
        with pytest.raises(AotxError) as bad:
            await sc.revise(s.session_id, spec={"spec_dsl": 1}, artifact=art,
                            draft_manifest=draft)
        assert code_of(bad) == "invalid_params"
        # the lease slides with each renewal, then expires, then the reaper closes it
        clock.t += 50
        await sc.renew(s.session_id)
        clock.t += 50
        await sc.renew(s.session_id)
        clock.t += 61
        with pytest.raises(Gone) as gone:
            await sc.renew(s.session_id)
        assert code_of(gone) == "scratch_expired"
        assert gone.value.fields["expired_at"] == rfc3339(T0 + 160)
        assert [x.session_id for x in await sc.reap()] == [s.session_id]
        with pytest.raises(Gone) as gone:
            await sc.renew(s.session_id)
        assert code_of(gone) == "scratch_closed" and gone.value.fields["reason"] == "expired"
        assert await sc.sessions(active=True) == []
        assert len(await sc.sessions(active=False)) == 1
        # stop; promote mints a release and publishes a model
        s2 = await sc.open()
        await sc.stop(s2.session_id)
        with pytest.raises(Gone):
            await sc.stop(s2.session_id)
        s3 = await sc.open()
        await sc.revise(s3.session_id, spec=SPEC, artifact=art, draft_manifest=draft)
        view = await sc.promote(s3.session_id, "runs/promoted.json", release="promo-r1",
                                source_commit=COMMIT)
        assert view.manifest.serving.runtime_release.name == "promo-r1"
        closed = await sc.get(s3.session_id)
        assert (closed.reason, closed.promoted_to) == ("promoted", "runs/promoted.json")
        with pytest.raises(NotFound) as nf:
            await sc.get(s3.session_id.upper())
        assert code_of(nf) == "scratch_not_found"
        with pytest.raises(NotFound):
            await sc.get("00000000-0000-4000-8000-000000000000")


async def test_corrupt_documents_are_format_errors(reg: Registry, tmp_path: Path,
                                                   backend: StoreBackend) -> None:
    with trio.fail_after(30):
        await published(reg, tmp_path)
        await reg.run(backend.put, "model_states", MID, b'{"state": 3}')
        with pytest.raises(FormatError) as info:
            await reg.get_model(MID)
        assert code_of(info) == "registry_corrupt"
        # the rescan skips what it cannot read
        assert await reg.heal() == []


def test_unreachable_postgresql_is_not_ready() -> None:
    from aotx_trio.registry.postgres import PostgresStore

    with pytest.raises(NotReady) as info:
        PostgresStore("postgresql://aotx@127.0.0.1:1/none", timeout_s=1.0)
    assert info.value.code == "not_ready" and info.value.fields["missing"] == "store"


def test_write_once_and_locked_update_under_threads(backend: StoreBackend) -> None:
    """Racing creators: one wins, the others read its bytes; racing read-modify-writes
    lose nothing."""
    winners: list[bytes] = []
    seen: list[bytes | None] = []

    def create(n: int) -> None:
        body = f'{{"n":{n}}}'.encode()
        old = backend.create("removed", "race/marker", body)
        (winners if old is None else seen).append(body if old is None else old)

    def bump(_: int) -> None:
        for _ in range(10):
            backend.update("sessions", "counter",
                           lambda old: str(int(old or b"0") + 1).encode())

    for fn in (create, bump):
        threads = [threading.Thread(target=fn, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert len(winners) == 1 and seen == [winners[0]] * 5
    assert backend.get("removed", "race/marker") == winners[0]
    assert backend.get("sessions", "counter") == b"60"
    assert backend.keys("removed") == ["race/marker"] and backend.keys("removed", "x") == []
