"""Conversations' KV pages kept between turns (runtime/resident.py): the next input
forks its conversation's resident sequence, prefills only what it does not share,
and produces exactly what a fresh prefill of the whole context produces; resident
sequences give way to inputs that need their pages."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import synth_gguf as sg
import trio
from _gateway_env import ALL, TINY, TINY_MODEL, Env, embedded
from test_executor import _finished, _input, _offline, _result, _room

from aotx_trio.native import lib as native
from aotx_trio.native.engine import Engine
from aotx_trio.runtime.executor import Executor
from aotx_trio.runtime.history import label_of
from aotx_trio.runtime.prompt import Turn
from aotx_trio.runtime.resident import ResidentCache, common_prefix
from aotx_trio.runtime.served import ModelSet, TextModel
from aotx_trio.vocab import principal_key

pytestmark = pytest.mark.timeout(120)
# a window wider than a page: a fork keeps what the sliding-window layers need
WIDE = dataclasses.replace(TINY, window=64)
NAMES = ("alice", "bob")


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == common_prefix([1], [2]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_the_cache_keeps_one_sequence_per_conversation(tmp_path: Path) -> None:
    with Engine.load(sg.write_model(tmp_path / "m.gguf", WIDE), max_seqs=4) as eng:
        cache = ResidentCache()
        seqs = []
        for _ in range(3):
            s = eng.add_sequence()
            eng.reserve(s, 40)
            eng.prefill(s, list(range(10, 40)))
            seqs.append(s)
        cache.keep("c1", eng, seqs[0], list(range(10, 40)))
        cache.keep("c2", eng, seqs[1], list(range(10, 40)))
        cache.keep("c1", eng, seqs[2], list(range(10, 40)))   # replaces c1's first one
        assert len(cache) == 2 and seqs[0].released and not seqs[2].released
        assert cache.get("c1", eng) is not None and cache.get("c3", eng) is None
        # least recently kept first (c2), the spared one last
        spare = cache.get("c1", eng)
        assert cache.make_room(eng, spare=spare) and seqs[1].released
        assert cache.make_room(eng, spare=spare) and seqs[2].released
        assert not cache.make_room(eng) and len(cache) == 0
        assert cache.evictions == 2
        assert eng.kv_stats().free_pages == eng.kv_stats().n_pages


@asynccontextmanager
async def wide_env(tmp_path: Path, kv_pages: int = 0) -> AsyncIterator[tuple[Env, Executor,
                                                                            Engine]]:
    async with embedded(tmp_path, dict.fromkeys(NAMES, ALL)) as env:
        # pages of 16 positions: the scenarios' geometry (the default page is 8)
        eng = Engine.load(sg.write_model(tmp_path / "wide.gguf", WIDE), kv_pages=kv_pages,
                          max_seqs=4, page_tokens=16)
        state = env.handler.state
        assert state is not None
        # revision 2: the pool is sized for its contexts (the tiny byte-level vocabulary
        # spends ~75 tokens on revision 3's historical-data rule)
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            revision=2)
        env.handler.models = ModelSet({TINY_MODEL: TextModel(TINY_MODEL, "0" * 64, eng)}, [])
        env.handler.executor = executor
        try:
            async with trio.open_nursery() as n:
                await n.start(executor.run)
                yield env, executor, eng
                n.cancel_scope.cancel()
        finally:
            executor.resident.clear()
            eng.close()


async def test_the_next_turn_reuses_the_pages_and_matches_a_fresh_prefill(
        tmp_path: Path) -> None:
    async with wide_env(tmp_path) as (env, executor, _eng):
        con = await _room(env, NAMES)
        _, r1 = await _input(env, "alice", con, "Hello world the capital of France",
                             max_output_tokens=12)
        assert (await _finished(env, "alice", r1["operation"]))["status"] == "succeeded"
        first = await _result(env, "alice", r1["operation"])
        fed_before = executor.prefill_tokens
        prompts: list[list[int]] = []
        executor.on_complete = lambda job, status: prompts.append(job.prompt)
        _, r2 = await _input(env, "bob", con, "a city in France", max_output_tokens=8)
        assert (await _finished(env, "bob", r2["operation"]))["status"] == "succeeded"
        second = await _result(env, "bob", r2["operation"])
        fed = executor.prefill_tokens - fed_before
    reused = executor.resident.reused_tokens
    assert reused >= 16 and fed == len(prompts[0]) - reused      # only the rest was fed
    turn1 = Turn(label_of(principal_key("alice")), b"Hello world the capital of France",
                 first)
    bob = Turn(label_of(principal_key("bob")), b"a city in France")
    assert second == _offline(tmp_path / "wide.gguf", [turn1], bob, 8)


async def test_resident_sequences_give_way(tmp_path: Path) -> None:
    """A pool that holds one conversation's pages at a time (an input needs about 9 of
    its 12 pages): each conversation's input evicts the other's resident sequence
    instead of waiting or failing."""
    async with wide_env(tmp_path, kv_pages=12) as (env, executor, eng):
        cons = [await _room(env, NAMES)]
        for _ in range(3):
            for con in cons:
                status, r = await _input(env, "alice", con, "Hello world " * 3,
                                         max_output_tokens=20)
                assert status == 202
                done = await _finished(env, "alice", r["operation"])
                assert done["status"] == "succeeded", await _result(env, "alice",
                                                                    r["operation"])
            if len(cons) == 1:
                cons.append(await _second_conversation(env))
        assert executor.resident.evictions == 3    # each switch of conversation
        assert len(executor.resident) == 1
        assert eng.kv_stats().n_seqs == 1


async def _second_conversation(env: Env) -> str:
    from test_executor import _post
    seq = env.next_seq["alice"]  # type: ignore[attr-defined]
    status, space = await _post(env, "alice", "/spaces", env.body(900, seq, scope="room"))
    assert status == 202
    status, con = await _post(env, "alice", f"/spaces/{space['resource']}/conversations",
                              env.body(901, seq + 1))
    assert status == 202
    env.next_seq["alice"] = seq + 2  # type: ignore[attr-defined]
    resource: str = con["resource"]
    return resource
