"""A conversation's context comes from the device: the same history after a restart,
labels from participant keys (runtime/history.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _gateway_env import ALL, TINY_MODEL, embedded, make_runtime_file, short_dir
from test_executor import _finished, _input, _offline, _result, _room

from aotx_trio.native.engine import Engine
from aotx_trio.runtime.history import label_of
from aotx_trio.runtime.prompt import Turn, render
from aotx_trio.vocab import principal_key

pytestmark = pytest.mark.timeout(120)
PEOPLE = {"alice": ALL, "bob": ALL}


def test_labels_are_short_and_stable() -> None:
    key = principal_key("alice")
    assert label_of(key) == "p" + key[:8] == label_of(key)
    assert "alice" not in label_of(key)


async def test_the_history_survives_a_restart(tmp_path: Path) -> None:
    folder = short_dir()
    ccir = make_runtime_file(tmp_path / "rt")
    try:
        async with embedded(tmp_path, PEOPLE, ccir=ccir, folder=folder) as env:
            con = await _room(env, ("alice", "bob"))
            status, r1 = await _input(env, "alice", con, "Hello world", max_output_tokens=6)
            assert status == 202, r1
            assert (await _finished(env, "alice", r1["operation"]))["status"] == "succeeded"
            first = await _result(env, "alice", r1["operation"])
            seqs = dict(env.next_seq)  # type: ignore[attr-defined]
        async with embedded(tmp_path, PEOPLE, ccir=ccir, folder=folder) as env:
            env.next_seq = seqs  # type: ignore[attr-defined]
            prompts: list[list[int]] = []
            executor = env.handler.executor
            assert executor is not None
            executor.on_complete = lambda job, status: prompts.append(job.prompt)
            status, r2 = await _input(env, "bob", con, "the capital of France",
                                      max_output_tokens=5)
            assert status == 202, r2
            assert (await _finished(env, "bob", r2["operation"]))["status"] == "succeeded"
            second = await _result(env, "bob", r2["operation"])
        turn1 = Turn(label_of(principal_key("alice")), b"Hello world", first)
        bob = Turn(label_of(principal_key("bob")), b"the capital of France")
        # the context after the restart held alice's turn and its output
        assert second == _offline(ccir.parent / TINY_MODEL, [turn1], bob, 5)
        with Engine.load(ccir.parent / TINY_MODEL, max_seqs=1) as eng:
            assert prompts == [render(eng, [turn1], bob, 10_000)]
            assert len(prompts[0]) > len(render(eng, [], bob, 10_000))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_only_turns_that_could_fit_are_read() -> None:
    """history.before reads turns newest first and stops once they hold more bytes than
    the token budget could take (BYTES_PER_TOKEN per token): a long conversation's
    old turns are never read for a context they cannot enter."""
    from test_device import A, Rig

    from aotx_trio.native import device as D
    from aotx_trio.runtime import history

    rig = Rig()
    try:
        rig.register(A)
        space = rig.space(A, "private")
        conv = rig.conversation(A, space)
        ops = [rig.input(A, conv, text=f"{i:03d}" + "x" * 97).op_id for i in range(40)]
        rig.journal.save()
        rig.dev.complete(ops[0], "succeeded", b"first answer", 1, 2, finish="stop")
        every = history.before(rig.dev, conv, 41, 65536)
        assert [t.text[:3] for t in every] == [f"{i:03d}".encode() for i in range(40)]
        assert every[0].output == b"first answer" and every[1].output is None
        assert all(t.label == history.label_of(A) for t in every)
        reads: list[str] = []
        real = D.Device.canonical

        def counted(self: D.Device, op_id: str) -> bytes:
            reads.append(op_id)
            return real(self, op_id)

        D.Device.canonical = counted  # type: ignore[method-assign]
        try:
            newest = history.before(rig.dev, conv, 41, 65536, budget_tokens=3)
        finally:
            D.Device.canonical = real  # type: ignore[method-assign]
        # 3 tokens x 64 bytes = 192 bytes: two turns of ~110 bytes pass it
        assert [t.text[:3] for t in newest] == [b"038", b"039"]
        assert len(reads) == 2
        assert history.before(rig.dev, conv, 5, 65536, budget_tokens=3)[-1].text[:3] == b"003"
    finally:
        rig.dev.close()


def test_turns_carry_their_recorded_lease_revision() -> None:
    """Each turn knows its input's lease revision, also after recovery: a restored
    conversation keeps rendering with the family it was leased in (prompt.lease_revision)."""
    from test_device import A, Rig, recover_from

    from aotx_trio.runtime import history
    from aotx_trio.runtime.prompt import lease_revision

    rig = Rig()
    try:
        rig.register(A)
        conv = rig.conversation(A, rig.space(A, "private"))
        first = rig.input(A, conv, text="first")
        rig.input(A, conv, text="second")
        rig.journal.save()
        assert history.recorded_revision(history.before(rig.dev, conv, 3, 65536)) is None
        rig.dev.lease(2, [rig.dev.lease_row(first.op_id)])
        rig.dev.complete(first.op_id, "succeeded", b"answer", 1, 1, finish="stop")
        rig.journal.save()
        turns = history.before(rig.dev, conv, 3, 65536)
        assert [t.revision for t in turns] == [2, None]
        _j, dev, _k = recover_from(bytes(rig.journal.file))
        restored = history.before(dev, conv, 3, 65536)
        assert [t.revision for t in restored] == [2, None]
        assert lease_revision(3, 0, history.recorded_revision(restored)) == 2
        dev.close()
    finally:
        rig.dev.close()


def test_the_lease_revision_reads_receipts_in_the_same_window() -> None:
    """history.revision_before (the executor's lease-time read) answers what
    recorded_revision(before(...)) answers for every budget, leased rows at any place
    and unleased turns of any size in front of them (the budget window's edge,
    docs/decisions.md), and reads no leased turn's text or output: only the unleased
    turns newer than the newest leased one."""
    from test_device import A, Rig

    from aotx_trio.native import device as D
    from aotx_trio.runtime import history

    rig = Rig()
    try:
        rig.register(A)
        conv = rig.conversation(A, rig.space(A, "private"))
        # 1 leased rev 2 (long output), 2 unleased, 3 leased rev 3, 4..6 unleased, of
        # growing sizes: the window reaches 3 (or 1) only for large enough budgets
        sizes = [40, 300, 20, 100, 200, 400]
        ops = [rig.input(A, conv, text="t" * n).op_id for n in sizes]
        rig.journal.save()
        rig.dev.lease(2, [rig.dev.lease_row(ops[0])])
        rig.dev.complete(ops[0], "succeeded", b"a" * 500, 1, 1, finish="stop")
        rig.dev.lease(3, [rig.dev.lease_row(ops[2])])
        rig.journal.save()
        reads: list[str] = []
        real_canonical, real_result = D.Device.canonical, D.Device.result

        def canonical(self: D.Device, op_id: str) -> bytes:
            reads.append(op_id)
            return real_canonical(self, op_id)

        def result(self: D.Device, *a: object, **k: object) -> object:
            reads.append(f"result {a[2]}")
            return real_result(self, *a, **k)  # type: ignore[arg-type]

        seen = set()
        for before in range(1, 8):
            for budget in [None, 1, 2, 3, 4, 5, 8, 10, 12, 16, 20, 40]:
                want = history.recorded_revision(history.before(rig.dev, conv, before,
                                                                65536, budget))
                D.Device.canonical = canonical  # type: ignore[method-assign]
                D.Device.result = result  # type: ignore[method-assign,assignment]
                reads.clear()
                try:
                    got = history.revision_before(rig.dev, conv, before, 65536, budget)
                finally:
                    D.Device.canonical = real_canonical  # type: ignore[method-assign]
                    D.Device.result = real_result  # type: ignore[method-assign]
                assert got == want, (before, budget)
                seen.add(got)
                newest = max([i for i in (1, 3) if i < before], default=0)
                newer_unleased = ops[newest:before - 1]   # inputs newest+1 .. before-1
                assert set(reads) <= set(newer_unleased), (before, budget, reads)
        assert seen == {None, 2, 3}      # every edge was met: no window, rev 2, rev 3
    finally:
        rig.dev.close()
