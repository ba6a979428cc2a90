"""A conversation's context comes from the device: the same history after a restart,
labels from participant keys (runtime/history.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _gateway_env import ALL, TINY_MODEL, embedded, make_runtime_file, short_dir
from test_executor import _finished, _input, _offline, _result, _room

from aotx_trio.engine import Engine
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
