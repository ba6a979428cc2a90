"""Inputs run: admitted -> running -> succeeded on the runtime's own model, with the
conversation's history as context, batched, within the KV page budget; bad inputs are
refused by name (real device, journal and a tiny real GGUF, in-process app)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _gateway_env import ALL, TINY_MODEL, Env, embedded

from aotx_trio.native import lib as native
from aotx_trio.native.engine import Engine
from aotx_trio.runtime.executor import Executor, _prefill_shares
from aotx_trio.runtime.history import label_of
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.prompt import Turn, render
from aotx_trio.runtime.served import ModelSet, TextModel
from aotx_trio.vocab import ALL_GRANTS, principal_key

pytestmark = pytest.mark.timeout(120)
BASE = "/aotx/v1/shared"


async def _post(env: Env, who: str, path: str, body: Any) -> tuple[int, Any]:
    resp = await env.client.post(BASE + path, headers=env.auth(who), json=body)
    return resp.status_code, await resp.get_json(force=True)


async def _get(env: Env, who: str, path: str) -> Any:
    resp = await env.client.get(BASE + path, headers=env.auth(who))
    assert resp.status_code == 200, await resp.get_data(as_text=True)
    return await resp.get_json(force=True)


async def _room(env: Env, names: tuple[str, ...]) -> str:
    """Everyone registers; the first creates a room, adds the others, makes a
    conversation; returns its id."""
    for i, who in enumerate(names):
        status, _ = await _post(env, who, "/participant", env.body(100 + i, 1))
        assert status == 202
    owner = names[0]
    status, space = await _post(env, owner, "/spaces", env.body(200, 2, scope="room"))
    assert status == 202
    seq = 3
    for who in names[1:]:
        status, _ = await _post(env, owner, f"/spaces/{space['resource']}/members",
                                env.body(300 + seq, seq, participant=env.par(who),
                                         permissions=["read", "write"]))
        assert status == 202
        seq += 1
    status, con = await _post(env, owner, f"/spaces/{space['resource']}/conversations",
                              env.body(400, seq))
    assert status == 202
    env.next_seq = {owner: seq + 1, **{w: 2 for w in names[1:]}}  # type: ignore[attr-defined]
    resource: str = con["resource"]
    return resource


async def _input(env: Env, who: str, con: str, text: str, **fields: Any) -> tuple[int, Any]:
    seq = env.next_seq[who]  # type: ignore[attr-defined]
    status, body = await _post(env, who, f"/conversations/{con}/inputs",
                               env.body(1000 + seq * 10 + len(who), seq, text=text,
                                        model=TINY_MODEL, **fields))
    if status == 202:
        env.next_seq[who] = seq + 1  # type: ignore[attr-defined]
    return status, body


async def _finished(env: Env, who: str, op: str) -> dict[str, Any]:
    with trio.fail_after(60):
        while True:
            receipt = await _get(env, who, f"/operations/{op}")
            if receipt["status"] not in ("admitted", "running"):
                return receipt
            await trio.sleep(0.01)


async def _result(env: Env, who: str, op: str) -> bytes:
    got = await _get(env, who, f"/operations/{op}/result")
    assert got["length"] == len(base64.b64decode(got["data"]))
    return base64.b64decode(got["data"])


def _offline(model: Path, history: list[Turn], turn: Turn, max_output: int) -> bytes:
    """The same greedy completion with the engine alone."""
    with Engine.load(model, max_seqs=1) as eng:
        prompt = render(eng, history, turn, eng.info.max_tokens - max_output)
        return b"".join(eng.generate(prompt, max_tokens=max_output))


async def test_an_input_runs_and_the_next_sees_the_history(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL}) as env:
        con = await _room(env, ("alice", "bob"))
        status, receipt = await _input(env, "alice", con, "Hello world", max_output_tokens=6)
        assert status == 202, receipt
        assert receipt["kind"] == "input" and receipt["admission"]["saved"] is True
        done = await _finished(env, "alice", receipt["operation"])
        assert done["status"] == "succeeded"
        assert 1 <= done["result"]["output_tokens"] <= 6
        assert done["result"]["input_tokens"] > 0
        # the finish reason: the tiny model has no end-of-turn: it ran out of tokens
        assert done["finish"] == ("length" if done["result"]["output_tokens"] == 6 else "stop")
        read = await _get(env, "alice", f"/operations/{receipt['operation']}/result")
        assert read["finish"] == done["finish"]
        first = await _result(env, "alice", receipt["operation"])
        model = tmp_path / "rt" / TINY_MODEL
        turn1 = Turn(label_of(principal_key("alice")), b"Hello world")
        assert first == _offline(model, [], turn1, 6)
        # bob reads alice's result (a member with read), then asks in the same conversation
        assert await _result(env, "bob", receipt["operation"]) == first
        status, r2 = await _input(env, "bob", con, "the capital of France", max_output_tokens=5)
        assert status == 202
        assert (await _finished(env, "bob", r2["operation"]))["status"] == "succeeded"
        turn1.output = first
        second = await _result(env, "bob", r2["operation"])
        bob = Turn(label_of(principal_key("bob")), b"the capital of France")
        assert second == _offline(model, [turn1], bob, 5)


async def test_concurrent_inputs_share_one_batch(tmp_path: Path) -> None:
    names = ("alice", "bob", "carol")
    async with embedded(tmp_path, dict.fromkeys(names, ALL)) as env:
        con = await _room(env, names)
        groups: list[int] = []
        executor = env.handler.executor
        assert executor is not None
        executor.on_complete = lambda job, status: groups.append(status == "succeeded")
        ops: dict[str, str] = {}

        async def ask(who: str) -> None:
            status, body = await _input(env, who, con, f"{who} says hello",
                                        max_output_tokens=24)
            assert status == 202, body
            ops[who] = body["operation"]

        async with trio.open_nursery() as n:
            for who in names:
                n.start_soon(ask, who)
        for who, op in ops.items():
            assert (await _finished(env, who, op))["status"] == "succeeded"
        assert groups == [True, True, True]
        assert executor.max_group >= 2           # they ran side by side


async def test_inputs_that_join_together_share_one_lease(tmp_path: Path) -> None:
    """Three saved inputs joining in one round are one execution group: one lease of
    three rows (revision 3: nothing retained here), applied before the first step."""
    names = ("alice", "bob", "carol")
    async with embedded(tmp_path, dict.fromkeys(names, ALL)) as env:
        con = await _room(env, names)
        state = env.handler.state
        assert state is not None
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"])
        env.handler.executor = executor                    # rounds by hand
        ops = {}
        for who in names:
            status, body = await _input(env, who, con, f"{who} says hello",
                                        max_output_tokens=4)
            assert status == 202
            ops[who] = body["operation"].rsplit("-", 1)[1]
        await executor.cycle()
        assert executor.leases == 1 and executor.steps == 1
        rows = {who: state.device.receipt(ALL_GRANTS, principal_key(who), op)
                for who, op in ops.items()}
        assert all(r.status == "running" and r.leased and r.lease_revision == 3
                   and r.lease_mode == 0 for r in rows.values())


async def test_the_page_budget_queues_instead_of_failing(tmp_path: Path) -> None:
    """A pool too small for all inputs at once: the ones that do not fit wait in order
    and all succeed (the engine refuses any over-commitment, so a step never fails)."""
    names = ("alice", "bob", "carol")
    async with embedded(tmp_path, dict.fromkeys(names, ALL)) as env:
        con = await _room(env, names)
        # 12 pages of 16 positions: the scenario's geometry (the default page is 8)
        eng = Engine.load(tmp_path / "rt" / TINY_MODEL, kv_pages=12, max_seqs=4, page_tokens=16)
        small = TextModel(TINY_MODEL, "0" * 64, eng)
        state = env.handler.state
        assert state is not None
        # revision 2: the pool is sized for its contexts (the tiny byte-level vocabulary
        # spends ~75 tokens on revision 3's historical-data rule)
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            revision=2)
        env.handler.models = ModelSet({TINY_MODEL: small}, [])
        env.handler.executor = executor
        try:
            async with trio.open_nursery() as n:
                ops: list[tuple[str, str]] = []

                async def ask(who: str) -> None:
                    status, body = await _input(env, who, con, f"{who}: a city",
                                                max_output_tokens=40)
                    assert status == 202
                    ops.append((who, body["operation"]))

                for who in names:             # all three saved and queued first ...
                    await ask(who)
                await n.start(executor.run)   # ... then the executor starts
                for who, op in ops:
                    got = await _finished(env, who, op)
                    assert got["status"] == "succeeded", (got, await _result(env, who, op))
                assert executor.page_waits > 0          # some waited for pages ...
                assert executor.completed == 3          # ... and none failed for it
                # the conversation's last sequence stays resident for its next input
                assert len(executor.resident) == 1
                executor.resident.clear()
                assert eng.kv_stats().free_pages == eng.kv_stats().n_pages
                # an input that needs more pages than the whole pool fails, naming it
                status, body = await _input(env, "alice", con, "a city " * 40,
                                            max_output_tokens=200)
                assert status == 202
                done = await _finished(env, "alice", body["operation"])
                assert done["status"] == "failed"
                assert b"KV pages" in await _result(env, "alice", body["operation"])
                n.cancel_scope.cancel()
        finally:
            eng.close()


@pytest.mark.parametrize(("fields", "status", "code", "field"), [
    ({"model": "nope.gguf"}, 422, "unknown_model", "model"),
    ({"max_output_tokens": 5000}, 422, "invalid_argument", "max_output_tokens"),
    ({"max_output_tokens": 0}, 422, "invalid_argument", "max_output_tokens"),
    ({"temperature": -0.5}, 422, "invalid_argument", "temperature"),
    ({"top_p": 0}, 422, "invalid_argument", "top_p"),
    ({"top_p": 1.5}, 422, "invalid_argument", "top_p"),
    ({"max_output_tokens": "8"}, 422, "invalid_argument", "max_output_tokens"),
    ({"text": "x" * 2049}, 422, "text_invalid", None),
    ({"media": [{"type": "video", "sha256": "a" * 64}]}, 422, "invalid_argument", "media.0.type"),
    ({"media": [{"type": "image", "sha256": "A" * 64}]}, 422, "invalid_argument",
     "media.0.sha256"),
])
async def test_bad_inputs_are_refused_by_name(tmp_path: Path, fields: dict[str, Any],
                                              status: int, code: str,
                                              field: str | None) -> None:
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        seq = env.next_seq["alice"]  # type: ignore[attr-defined]
        body = env.body(9, seq, text="hi", model=TINY_MODEL)
        body.update(fields)
        got, err = await _post(env, "alice", f"/conversations/{con}/inputs", body)
        assert got == status, err
        assert err["error"]["code"] == code
        if field is not None:
            assert err["error"]["field"] == field
        # nothing was admitted: the same sequence still works for a good input
        got, ok = await _post(env, "alice", f"/conversations/{con}/inputs",
                              env.body(10, seq, text="hi", model=TINY_MODEL,
                                       max_output_tokens=2))
        assert got == 202, ok


async def test_an_unknown_conversation_is_404(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL}) as env:
        await _room(env, ("alice",))
        con = f"con-{env.lineage}-{7:032x}"
        got, err = await _post(env, "alice", f"/conversations/{con}/inputs",
                               env.body(9, 4, text="hi", model=TINY_MODEL))
        assert got == 404 and err["error"]["code"] == "conversation_not_found"


async def test_cancellation_of_a_waiting_and_of_a_running_input(tmp_path: Path) -> None:
    """POST /participant/cancellations names the exact target sequence: a queued input
    ends cancelled without running; a running one ends cancelled before its next step
    and keeps the bytes it made.  The executor is driven a round at a time."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"])
        env.handler.executor = executor                    # not running: rounds by hand
        seq = env.next_seq["alice"]  # type: ignore[attr-defined]
        status, queued = await _input(env, "alice", con, "first", max_output_tokens=50)
        assert status == 202
        status, cancel = await _post(env, "alice", "/participant/cancellations",
                                     env.body(700, seq + 1, target_sequence=str(seq)))
        assert status == 202, cancel
        assert cancel["kind"] == "cancellation" and cancel["resource"] == queued["operation"]
        await executor.cycle()
        done = await _get(env, "alice", f"/operations/{queued['operation']}")
        assert done["status"] == done["finish"] == "cancelled"
        assert done["result"]["output_tokens"] == 0
        env.next_seq["alice"] = seq + 2  # type: ignore[attr-defined]

        status, running = await _input(env, "alice", con, "second", max_output_tokens=50)
        assert status == 202
        for _ in range(4):                                  # prefill, then some tokens
            await executor.cycle()
        got = await _get(env, "alice", f"/operations/{running['operation']}")
        assert got["status"] == "running"
        status, _ = await _post(env, "alice", "/participant/cancellations",
                                env.body(701, seq + 3, target_sequence=str(seq + 2)))
        assert status == 202
        await executor.cycle()
        done = await _get(env, "alice", f"/operations/{running['operation']}")
        assert done["status"] == done["finish"] == "cancelled"
        assert 1 <= done["result"]["output_tokens"] < 50   # what it made before the cancel
        # cancelling an operation that already ended changes nothing
        status, again = await _post(env, "alice", "/participant/cancellations",
                                    env.body(702, seq + 4, target_sequence=str(seq + 2)))
        assert status == 202, again
        after = await _get(env, "alice", f"/operations/{running['operation']}")
        assert (after["status"], after["result"], after["terminal"]["record"]) == \
            (done["status"], done["result"], done["terminal"]["record"])
        assert after["terminal"]["saved"] is True


async def test_an_input_past_its_deadline_ends_and_its_result_read_is_504(
        tmp_path: Path) -> None:
    """The deadline counts from the start of execution (a controlled clock: no sleeps);
    the input ends deadline_exceeded before its next step, keeping its bytes, and its
    result read answers 504 deadline_exceeded."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        now = [1000.0]
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            deadline_s=30.0, clock=lambda: now[0])
        env.handler.executor = executor
        status, body = await _input(env, "alice", con, "tick tock", max_output_tokens=100)
        assert status == 202
        op = body["operation"]
        for _ in range(3):
            await executor.cycle()
        now[0] += 29.9                                  # still inside the deadline
        await executor.cycle()
        assert (await _get(env, "alice", f"/operations/{op}"))["status"] == "running"
        now[0] += 0.2                                   # past it
        await executor.cycle()
        done = await _get(env, "alice", f"/operations/{op}")
        assert done["status"] == done["finish"] == "deadline_exceeded"
        assert 1 <= done["result"]["output_tokens"] < 100
        resp = await env.client.get(f"{BASE}/operations/{op}/result", headers=env.auth("alice"))
        assert resp.status_code == 504
        err = (await resp.get_json())["error"]
        assert err["code"] == "deadline_exceeded" and err["operation"] == op


async def test_the_deadline_counts_from_the_applied_lease(tmp_path: Path) -> None:
    """Execution starts with the recorded lease: while the journal cannot take it (a
    hold) the input waits admitted and no deadline runs; once the lease is applied,
    the deadline counts from there (a MockClock moved by hand: no sleeps)."""
    from aotx_trio.native.journal import HOLD_DISK

    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        clock = trio.testing.MockClock()
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            deadline_s=30.0, clock=clock.current_time)
        env.handler.executor = executor
        status, body = await _input(env, "alice", con, "tick tock", max_output_tokens=100)
        assert status == 202
        op = body["operation"]
        journal = state.journal_file.journal
        journal.set_hold(HOLD_DISK, True)
        await executor.cycle()                 # its lease waits for the journal
        clock.jump(100.0)                      # far past a deadline counted from joining
        await executor.cycle()
        assert (await _get(env, "alice", f"/operations/{op}"))["status"] == "admitted"
        assert executor.leases == 0 and executor.steps == 0      # nothing ran unleased
        journal.set_hold(HOLD_DISK, False)
        await executor.cycle()                 # the lease is applied: running from now
        op_hex = op.rsplit("-", 1)[1]
        receipt = state.device.receipt(ALL_GRANTS, principal_key("alice"), op_hex)
        assert receipt.status == "running" and receipt.leased and receipt.lease_revision == 3
        clock.jump(29.9)
        await executor.cycle()
        assert (await _get(env, "alice", f"/operations/{op}"))["status"] == "running"
        clock.jump(0.2)
        await executor.cycle()
        done = await _get(env, "alice", f"/operations/{op}")
        assert done["status"] == done["finish"] == "deadline_exceeded"


async def test_two_equal_inputs_are_two_turns(tmp_path: Path) -> None:
    """The same participant asking the same text twice, both queued before either runs:
    the second input's context holds the first one (turns are told apart by identity,
    not by value)."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"])
        env.handler.executor = executor                    # rounds by hand
        prompts: dict[str, list[int]] = {}
        executor.on_complete = lambda job, status: prompts.setdefault(job.op_id, job.prompt)
        ops = []
        for _ in range(2):
            status, body = await _input(env, "alice", con, "Hello world", max_output_tokens=3)
            assert status == 202
            ops.append(body["operation"])
        with trio.fail_after(30):
            while len(prompts) < 2:
                await executor.cycle()
        first, second = (prompts[op.rsplit("-", 1)[1]] for op in ops)
        assert len(first) < len(second)          # the first input is in the second's context
        eng = env.handler.models.text[TINY_MODEL].engine   # type: ignore[union-attr]
        # revision 3 (the default, nothing retained): one user turn, a line per input
        assert eng.detokenize(first).count(b"world") == 1
        assert eng.detokenize(second).count(b"world") == 2
        assert eng.turns is not None
        tail = len(eng.turns.user_close) + len(eng.turns.generation)
        assert second[:len(first) - tail] == first[:-tail]   # it opens with the first's line


async def test_a_completion_waits_out_a_journal_hold(tmp_path: Path) -> None:
    """An input that ends while the journal holds (a disk error, the cap) is not left
    running for ever: its completion waits in the executor and is retried every round
    until the journal takes it (found by scripts/chaos.py --disk-faults)."""
    from aotx_trio.native.journal import HOLD_DISK

    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        # revision 2: the tiny model's greedy output for that context is several tokens
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            revision=2)
        env.handler.executor = executor                    # not running: rounds by hand
        status, receipt = await _input(env, "alice", con, "held", max_output_tokens=4)
        assert status == 202
        op = receipt["operation"]
        journal = state.journal_file.journal
        await executor.cycle()                             # joins, its lease is applied
        assert (await _get(env, "alice", f"/operations/{op}"))["status"] == "running"
        with trio.fail_after(10):      # the lease saved (an ack in flight clears a hold)
            while journal.save_state().pending_bytes or journal.save_state().in_flight_records:
                await trio.sleep(0.01)
        journal.set_hold(HOLD_DISK, True)
        for _ in range(12):                                # it runs and ends ...
            await executor.cycle()
        assert executor.completed == 1
        got = await _get(env, "alice", f"/operations/{op}")
        assert got["status"] == "running" and got["finish"] is None   # ... not journaled
        journal.set_hold(HOLD_DISK, False)
        await executor.cycle()                             # the next round completes it
        await _finished(env, "alice", op)
        done = await _get(env, "alice", f"/operations/{op}")
        assert done["status"] == "succeeded" and done["result"]["output_tokens"] >= 1
        with trio.fail_after(10):
            while not (await _get(env, "alice", f"/operations/{op}"))["terminal"]["saved"]:
                await trio.sleep(0.01)


async def test_a_follow_up_that_shares_a_long_prefix_fits_the_context(tmp_path: Path) -> None:
    """Regression: a sequence forked from the conversation's resident one reserves only
    what it adds (its prompt past the shared prefix and its output), not the whole prompt
    again on top of the prefix: once a conversation's context passed half the model's,
    the next input ran into the sequence's maximum length and took the executor down."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        context = env.handler.models.get(TINY_MODEL).context
        for i in range(40):
            status, r = await _input(env, "alice", con, f"The quick brown fox jumps ({i}).",
                                     max_output_tokens=2)
            assert status == 202, r
            done = await _finished(env, "alice", r["operation"])
            assert done["status"] == "succeeded", await _result(env, "alice", r["operation"])
            if done["result"]["input_tokens"] > context * 2 // 3:
                break
        assert done["result"]["input_tokens"] > context * 2 // 3
        assert env.handler.executor.resident.reused_tokens > context // 2   # it forked


@pytest.fixture
def switch_clock() -> trio.testing.MockClock:
    """Real time (rate 1) until the test makes it a MockClock(autojump_threshold=0)."""
    return trio.testing.MockClock(rate=1.0)


async def test_the_deadline_includes_memory_processing_from_the_lease(
        tmp_path: Path, switch_clock: trio.testing.MockClock) -> None:
    """The lease comes first: an input's memory processing (here 4 s of it, the job's
    ``prepare``) starts at the applied lease and is charged to the deadline that starts
    there (5 s): the input generates in the 1 s left and ends deadline_exceeded 5 s
    after its lease, not 5 s after its memory processing (once the input is answered,
    a MockClock(autojump_threshold=0): no real sleeps)."""
    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        state = env.handler.state
        assert state is not None
        marks: dict[str, Any] = {}

        async def memory_processing(job: Job) -> None:
            marks.update(leased=job.leased, started=job.started, memory_from=trio.current_time())
            await trio.sleep(4.0)
            marks["memory_to"] = trio.current_time()

        class WithMemory(Executor):
            def submit(self, job: Job) -> None:
                job.prepare = memory_processing
                super().submit(job)

        executor = WithMemory(state.device, state.emitter, native.capacities()["result_bytes"],
                              deadline_s=5.0)
        ended: dict[str, Any] = {}
        executor.on_complete = lambda job, status: ended.update(
            status=status, at=trio.current_time(), started=job.started, deadline=job.deadline,
            tokens=len(job.out_tokens))
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            env.handler.executor = executor
            status, body = await _input(env, "alice", con, "tick tock", max_output_tokens=200)
            assert status == 202
            switch_clock.rate = 0.0                  # virtual time from here:
            switch_clock.autojump_threshold = 0.0    # it jumps whenever everything waits
            while not ended:
                await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert marks["leased"] is True and executor.leases == 1
        assert marks["started"] == ended["started"]                 # the lease's time
        assert marks["memory_from"] == pytest.approx(marks["started"], abs=0.01)
        assert marks["memory_to"] - marks["started"] == pytest.approx(4.0, abs=0.01)
        assert ended["status"] == "deadline_exceeded"
        assert ended["deadline"] == ended["started"] + 5.0      # lease + 5 s, memory in it
        assert ended["at"] >= ended["deadline"]
        assert 1 <= ended["tokens"] < 200                        # generated after memory
        done = await _get(env, "alice", f"/operations/{body['operation']}")
        assert done["status"] == done["finish"] == "deadline_exceeded"


async def test_an_inputs_history_texts_are_read_once(tmp_path: Path) -> None:
    """The lease takes the recorded revision from the receipts (history.revision_before):
    an input whose earlier turns were all leased reads each earlier text and output
    once, when it joins, not a second time at its lease."""
    from aotx_trio.native import device as D

    async with embedded(tmp_path, {"alice": ALL}) as env:
        con = await _room(env, ("alice",))
        earlier = []
        for i in range(3):
            status, r = await _input(env, "alice", con, f"turn {i}", max_output_tokens=2)
            assert status == 202, r
            assert (await _finished(env, "alice", r["operation"]))["status"] == "succeeded"
            earlier.append(r["operation"].rsplit("-", 1)[1])
        reads: list[str] = []
        real_canonical, real_result = D.Device.canonical, D.Device.result

        def canonical(self: D.Device, op_id: str) -> bytes:
            reads.append(op_id)
            return real_canonical(self, op_id)

        def result(self: D.Device, *a: Any, **k: Any) -> Any:
            reads.append(a[2])
            return real_result(self, *a, **k)

        D.Device.canonical = canonical  # type: ignore[method-assign]
        D.Device.result = result  # type: ignore[method-assign]
        try:
            status, r = await _input(env, "alice", con, "turn 3", max_output_tokens=2)
            assert status == 202, r
            assert (await _finished(env, "alice", r["operation"]))["status"] == "succeeded"
        finally:
            D.Device.canonical = real_canonical  # type: ignore[method-assign]
            D.Device.result = real_result  # type: ignore[method-assign]
        # each earlier turn: its text once and its output once (the join's render)
        assert {op: reads.count(op) for op in earlier} == dict.fromkeys(earlier, 2)


async def test_one_principals_queue_does_not_hold_anothers_input_back(
        tmp_path: Path) -> None:
    """Fair execution (issue 25 item 3): alice queues 12 inputs that fill every sequence
    slot; bob's one input, submitted while they run, finishes within 2x its steps alone
    plus one of alice's inputs (a group's turn), not after her whole queue.  Counted in
    engine steps (through the real runtime, device and tiny real model), not wall time."""
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL}) as env:
        hog = await _room(env, ("alice",))
        seq = 1                                  # bob's own space and conversation
        for path, fields in (("/participant", {}), ("/spaces", {"scope": "room"})):
            status, body = await _post(env, "bob", path, env.body(900 + seq, seq, **fields))
            assert status == 202, body
            seq += 1
        status, con = await _post(env, "bob", f"/spaces/{body['resource']}/conversations",
                                  env.body(900 + seq, seq))
        assert status == 202, con
        mine = con["resource"]
        env.next_seq["bob"] = seq + 1  # type: ignore[attr-defined]
        eng = Engine.load(tmp_path / "rt" / TINY_MODEL, kv_pages=64, max_seqs=4,
                          page_tokens=16)
        env.handler.models = ModelSet({TINY_MODEL: TextModel(TINY_MODEL, "0" * 64, eng)}, [])
        state = env.handler.state
        assert state is not None
        done_at: dict[str, int] = {}             # op id (hex) -> steps when it ended

        def executor() -> Executor:
            ex = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                          revision=2)
            ex.on_complete = lambda job, status: done_at.setdefault(job.op_id, ex.steps)
            env.handler.executor = ex
            return ex

        async def steps_alone(ex: Executor, who: str, con: str, n_out: int) -> int:
            before = ex.steps
            status, body = await _input(env, who, con, f"{who}: a city", max_output_tokens=n_out)
            assert status == 202, body
            assert (await _finished(env, who, body["operation"]))["status"] == "succeeded"
            return done_at[body["operation"].rsplit("-", 1)[1]] - before

        try:
            ex = executor()
            async with trio.open_nursery() as n:
                await n.start(ex.run)
                alone = await steps_alone(ex, "bob", mine, 2)
                group = await steps_alone(ex, "alice", hog, 24)
                n.cancel_scope.cancel()
            ex.resident.clear()
            ex = executor()
            hogs = []
            for _ in range(12):                  # all queued before the executor starts
                status, body = await _input(env, "alice", hog, "alice: a city",
                                            max_output_tokens=24)
                assert status == 202, body
                hogs.append(body["operation"])
            async with trio.open_nursery() as n:
                await n.start(ex.run)
                with trio.fail_after(60):
                    while ex.steps < 2:          # alice's inputs run, every slot taken
                        await trio.sleep(0.001)
                start = ex.steps
                status, body = await _input(env, "bob", mine, "bob: a city",
                                            max_output_tokens=2)
                assert status == 202, body
                assert (await _finished(env, "bob", body["operation"]))["status"] == \
                    "succeeded"
                waited = done_at[body["operation"].rsplit("-", 1)[1]] - start
                for op in hogs:
                    assert (await _finished(env, "alice", op))["status"] == "succeeded"
                n.cancel_scope.cancel()
            ex.resident.clear()
        finally:
            eng.close()
        assert ex.max_group >= 3 and group > 4 * alone   # alice ran side by side
        assert waited <= 2 * alone + group, (waited, alone, group)
        # alice's queue itself took about three groups: bob did not wait for it
        last = max(done_at[op.rsplit("-", 1)[1]] for op in hogs)
        assert last - start > 2 * group > waited


def test_prefill_budget_is_shared_across_principals() -> None:
    """A step's prefill budget: each principal's inputs take up to an equal share
    first, the rest goes in group order; a principal's short prompt is never left out
    behind another's long ones."""
    def job(actor: str, prompt: int, fed: int = 0) -> Job:
        return Job(op_id=f"{actor}{prompt}", conversation=actor, model=None,  # type: ignore[arg-type]
                   turn=None, max_output=1, prompt=[1] * prompt, fed=fed,  # type: ignore[arg-type]
                   actor=actor)

    hog = [job("a", 300), job("a", 300), job("a", 300)]
    # a's share (128), b's 5, then the 123 left to a's first input in group order
    assert _prefill_shares([*hog, job("b", 5)], 256) == [251, 0, 0, 5]
    assert _prefill_shares([job("a", 300), job("b", 300)], 256) == [128, 128]
    assert _prefill_shares([job("a", 10, fed=4), job("b", 3)], 256) == [6, 3]
    assert _prefill_shares([job("a", 300)], 0) == [0]
