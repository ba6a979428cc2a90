"""The executor: runs saved input admissions on the engine, batched.

One supervised task per runtime (:meth:`Executor.run`).  The handler hands it
an input only after its admission record is saved (:meth:`Executor.submit`);
inputs wait, and join in a fair order across principals (least served first:
:meth:`Executor._fair_order`; each conversation's in admission order), and a
step's prefill budget is shared evenly between principals
(:func:`_prefill_shares`), so one principal's queue holds another's input back
by about one input's run at most.  Each text model keeps a group of running
inputs; an input joins the group when its KV pages can be reserved
(``prompt + max_output_tokens`` positions, the engine's page accounting), so
the pool is never over-committed and a queued input is never failed for lack
of pages: it waits for a running one to finish (continuous batching: inputs
join and leave between steps).  Every step feeds each running input either
its next prefill chunk or its one decode token, in one native step per model
run in a worker thread (the GIL is released for the step).

**Leases.**  A saved input's execution lease comes first: the inputs the executor
takes off its queue in one round (the runtime nursery's supervised executor task is
the lease applier) get one execution lease per model and revision on the device
(``Device.lease``: every row checked before anything changes, one LEASE transfer
journaled, each input ``running``), at the revision its context will be rendered with
(runtime/prompt.py, "Revisions"; the conversation's recorded revision family, else
``revision``, by the input's retention mode), each row carrying the input's retention
mode (``Job.retention_mode``, memory.py).  The execution deadline starts when the
lease is applied and covers everything after it: the input's memory processing
(retention, mode 2's memory calls: the job's ``prepare``, run in the executor's
nursery right after the lease), waiting for pages, generation and the result's
publication.  A lease the journal cannot take yet (a hold) is retried every round;
the inputs do nothing meanwhile.  Then an input waits in admission order and joins its
model's group as below (its context, with what memory recalls, rendered then).

**Output.**  A running input's output bytes are journaled as OUTPUT transfers, one
per :data:`OUTPUT_BATCH_BYTES` produced (one journal record each), so its result
read is served from the device while it runs and a restart keeps what was
journaled (it reads ``interrupted`` with those bytes).  A finished input is
completed on the device (status, the whole result, token counts); the device
journals the bytes after the OUTPUT ones; the emitter is woken to save it.
Its engine sequence stays resident for the conversation's next input, which
forks it and prefills only what it does not share (runtime/resident.py);
resident sequences are freed whenever an input needs their pages.
An input still unfinished ``deadline_s`` after its lease was applied (the execution
deadline, ``limits.execution_deadline_s``) ends ``deadline_exceeded`` before its next
step, keeping the bytes it produced; one whose deadline passed in memory processing or
waiting for pages ends so before it joins.  The runtime restarts
an input never: one left running when the process
dies reads ``interrupted`` after recovery (the device marks it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import trio

from aotx_trio import _latency, errors
from aotx_trio.config import DEFAULT_DEADLINE_S
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import LEASE_MAX_ROWS
from aotx_trio.native.engine import Engine, EngineSequence, StepResult
from aotx_trio.runtime import history, memory
from aotx_trio.runtime.job import Job
from aotx_trio.runtime.prompt import DEFAULT_REVISION, lease_revision, render
from aotx_trio.runtime.resident import ResidentCache, common_prefix
from aotx_trio.runtime.stats import Histogram

log = logging.getLogger("aotx.executor")
COMPLETION_RETRY_S = 0.05
#: Output bytes per OUTPUT transfer: 32 header bytes + 128 = one 160-byte journal part.
OUTPUT_BATCH_BYTES = 128


class Waker(Protocol):
    def wake(self) -> None: ...


def _lowered_step(eng: Engine, feeds: list[tuple[EngineSequence, list[int]]],
                  want: list[bool]) -> StepResult:
    """``eng.step`` on a worker thread whose priority is below the trio thread's
    (aotx_trio/_latency.py: the step's spinning pool must not take the loop's slices)."""
    _latency.lower_this_thread()
    return eng.step(feeds, want)


def _prefill_shares(jobs: list[Job], budget: int) -> list[int]:
    """The prefill tokens each of ``jobs`` (in group order) feeds in one step of
    ``budget`` tokens, shared fairly across principals: each principal's inputs take up
    to an equal share of the budget first (in group order), then what is left goes to
    the inputs in group order.  So a principal's short input is not held back a step
    behind another principal's long prefills."""
    left = [len(job.prompt) - job.fed for job in jobs]
    takes = [0] * len(jobs)
    actors: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        actors.setdefault(job.actor, []).append(i)
    if not actors or budget <= 0:
        return takes
    share = max(1, budget // len(actors))
    for idx in actors.values():
        quota = share
        for i in idx:
            t = min(quota, budget, left[i])
            takes[i] += t
            left[i] -= t
            quota -= t
            budget -= t
    for i in range(len(jobs)):
        t = min(budget, left[i])
        takes[i] += t
        budget -= t
    return takes


class Executor:
    """See the module doc.  ``result_cap`` is the device's result limit in bytes."""

    def __init__(self, device: Device, saver: Waker, result_cap: int, *,
                 queue_size: int = 4096, deadline_s: float = DEFAULT_DEADLINE_S,
                 clock: Callable[[], float] = trio.current_time,
                 revision: int = DEFAULT_REVISION) -> None:
        self.device = device
        self.revision = revision            # the lease revision family for new conversations
        self.deadline_s = deadline_s
        self.clock = clock
        self.saver = saver
        self.result_cap = result_cap
        self._send, self._receive = trio.open_memory_channel[Job](queue_size)
        self._waiting: deque[Job] = deque()
        self._running: dict[int, list[Job]] = {}   # id(model) -> its group
        self._jobs: dict[str, Job] = {}               # op id -> job handed over, until it ends
        self._ended: dict[str, Job] = {}              # ephemeral jobs that ended, untaken
        self._changed = trio.Event()                  # set (and replaced) on any progress
        self.steps = 0
        self.prefill_tokens = 0
        self.output_tokens = 0
        self.finished: dict[str, int] = {}            # status -> inputs ended so far
        self.ttft = Histogram()                       # start of execution -> first token
        self.resident = ResidentCache()               # conversations' pages between turns
        # ended inputs whose completion the journal has not taken yet (it holds):
        # (op id, status, result, input tokens, output tokens, finish), oldest first
        self._completions: deque[tuple[str, str, bytes, int, int, str]] = deque()
        self._completion_held = False
        self.max_group = 0            # the most inputs one step has run together
        self.page_waits = 0           # times an input waited for KV pages
        self.on_complete: Callable[[Job, str], None] | None = None  # tests, metrics
        self._nursery: trio.Nursery | None = None     # runs jobs' ``prepare`` (run())
        self._unleased: list[Job] = []    # taken off the queue, lease not applied yet
        self._lease_held = False
        self._engines: set[int] = set()   # id() of the engines stepped so far
        self.leases = 0               # lease transfers applied
        self.output_transfers = 0     # OUTPUT transfers journaled

    # -- the handler's side ------------------------------------------------------------
    def knows(self, op_id: str) -> bool:
        return op_id in self._jobs

    def submit(self, job: Job) -> None:
        """Queue a saved admission (its context is read from the device when it
        joins a group: ``history.before``)."""
        self._send.send_nowait(job)
        self._jobs[job.op_id] = job

    def cancel(self, op_id: str) -> None:
        """A saved cancellation of ``op_id``: the input ends ``cancelled`` at the next
        round, before it runs (a waiting one) or before its next step (a running one,
        keeping the bytes it produced); an input that already ended is left as it is."""
        job = self._jobs.get(op_id)
        if job is not None:
            job.cancelled = True

    def output(self, op_id: str) -> bytes | None:
        """The bytes a waiting or running input has produced so far (within the result
        limit); None once it ended (read the device's result) or when unknown."""
        job = self._jobs.get(op_id)
        return None if job is None else bytes(job.out[:self.result_cap])

    def abandon(self, op_id: str) -> None:
        """An ephemeral job nobody waits for any more: cancel it, keep nothing."""
        job = self._jobs.get(op_id)
        if job is not None:
            job.abandoned = True
            self.cancel(op_id)
        self._ended.pop(op_id, None)

    def ended(self, op_id: str) -> Job | None:
        """An ephemeral job once it ended (taken: a second call answers None)."""
        return self._ended.pop(op_id, None)

    async def wait_progress(self) -> None:
        """Return after the next round that produced bytes or ended an input."""
        await self._changed.wait()

    def _progressed(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    @property
    def completed(self) -> int:
        """Inputs that ended, any status."""
        return sum(self.finished.values())

    def queued(self) -> int:
        return len(self._waiting) + self._receive.statistics().current_buffer_used

    def metrics(self) -> dict[str, Any]:
        """The executor's numbers for ``/metrics``."""
        return {"queued": self.queued(),
                "running": sum(len(g) for g in self._running.values()),
                "steps": self.steps, "prefill_tokens": self.prefill_tokens,
                "output_tokens": self.output_tokens, "finished": dict(self.finished),
                "reused_tokens": self.resident.reused_tokens,
                "resident_sequences": len(self.resident),
                "leases": self.leases, "output_transfers": self.output_transfers,
                "time_to_first_token_seconds": self.ttft.snapshot()}

    # -- the task ----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        _latency.lower_worker_priority()     # the engines' pool threads: below the loop
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                if not self._waiting and not any(self._running.values()):
                    if self._completions or self._unleased:
                        # a held journal: retry completions and leases every 50 ms
                        with trio.move_on_after(COMPLETION_RETRY_S):
                            self._take(await self._receive.receive())
                    else:
                        self._take(await self._receive.receive())
                await self.cycle()
                await trio.lowlevel.checkpoint()

    def _take(self, job: Job) -> None:
        """A job off the queue: a device input not leased yet waits for its lease
        (:meth:`_lease`, this round); any other waits to join."""
        if not job.ephemeral and not job.leased:
            self._unleased.append(job)
        else:
            self._waiting.append(job)

    def _leased(self, job: Job) -> None:
        """Its lease is applied: its memory processing runs now (in the nursery), then
        it queues again to join; without memory processing it waits at once."""
        if job.prepare is None:
            self._waiting.append(job)
            return
        assert self._nursery is not None, "jobs with memory processing need run()"
        self._nursery.start_soon(self._prepare, job)

    async def _prepare(self, job: Job) -> None:
        prepare, job.prepare = job.prepare, None
        assert prepare is not None
        try:
            await prepare(job)
        except errors.AotxError as exc:   # the input still runs (mode 1 memory is kept)
            log.warning("memory processing of %s failed: %s", job.op_id, exc)
        await self._send.send(job)

    def _complete(self) -> None:
        """Hand ended inputs' results to the device, oldest first.  While the journal
        holds (a disk error, the file cap, disk pressure: a Refusal), a completion
        waits here and is retried every round: an input never stays ``running``
        because its result could not be journaled at once."""
        while self._completions:
            op_id, status, result, n_in, n_out, finish = self._completions[0]
            try:
                self.device.complete(op_id, status, result, n_in, n_out, finish)
            except errors.Refusal as exc:
                if not self._completion_held:
                    log.warning("completing %s waits: %s", op_id, exc)
                self._completion_held = True
                return
            except errors.AotxError as exc:   # refused for good: logged, not retried
                log.warning("completing %s failed: %s", op_id, exc)
            self._completions.popleft()
            self._completion_held = False
            self.saver.wake()

    async def cycle(self) -> None:
        """One round: take what was queued, end what was cancelled, join what fits,
        and run one step for every model with running inputs."""
        self._complete()
        while True:
            try:
                self._take(self._receive.receive_nowait())
            except trio.WouldBlock:
                break
        for job in [j for j in self._waiting if j.cancelled]:
            self._waiting.remove(job)
            self._finish(job, "cancelled")
        now = self.clock()
        for job in [j for j in self._waiting if j.deadline <= now]:
            self._waiting.remove(job)      # passed in memory processing or a page wait
            self._finish(job, "deadline_exceeded")
        for group in self._running.values():
            for job in [j for j in group if j.cancelled]:
                self._finish(job, "cancelled")
            for job in [j for j in group if j.deadline <= now]:
                self._finish(job, "deadline_exceeded")
        self._lease()
        self._admit()
        for group in list(self._running.values()):
            if group:
                await self._step(group)
        self._progressed()

    def _fair_order(self) -> list[Job]:
        """The waiting inputs in the order they may join (fair execution): least served
        principal first.  A principal's k-th waiting input (k = 0, 1, ...) ranks
        ``running + k``, where ``running`` is how many of its inputs run now, ties in
        admission order; so one principal's queue of many inputs never holds another's
        one input back by more than one group.  An input never ranks before an earlier
        one of its conversation (conversations keep their admission order)."""
        running: dict[str, int] = {}
        for group in self._running.values():
            for job in group:
                running[job.actor] = running.get(job.actor, 0) + 1
        seen: dict[str, int] = {}
        last_in: dict[str, int] = {}   # conversation -> the rank of its latest input
        ranked: list[tuple[int, int, Job]] = []
        for pos, job in enumerate(self._waiting):
            k = seen.get(job.actor, 0)
            seen[job.actor] = k + 1
            rank = running.get(job.actor, 0) + k
            if not job.ephemeral:
                rank = max(rank, last_in.get(job.conversation, 0))
                last_in[job.conversation] = rank
            ranked.append((rank, pos, job))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [job for _, _, job in ranked]

    def _admit(self) -> None:
        """Join waiting inputs to their model's group, in fair order
        (:meth:`_fair_order`); an input whose pages cannot be reserved waits (and so do
        the ones after it on the same model), and an input waits while an earlier one
        of its conversation does (conversations join in admission order).  Pages and
        sequence slots free up only when an input ends, so an input that could not
        join is tried again (its context read and rendered again) only once another
        input has ended since."""
        blocked: set[int] = set()
        behind: set[str] = set()   # conversations with an earlier input still waiting
        still: list[Job] = []
        ended = self.completed
        for job in self._fair_order():
            key = id(job.model)
            if key in blocked or (not job.ephemeral and job.conversation in behind):
                still.append(job)
                if not job.ephemeral:
                    behind.add(job.conversation)
                continue
            if job.tried_at != ended:
                if self._join(job):
                    if job.seq is not None:
                        self._running.setdefault(key, []).append(job)
                    continue
                if not self._running.get(key):
                    # nothing runs on this model and still no room: it can never fit
                    kv = job.model.engine.kv_stats()
                    self._finish(job, "failed", f"the input needs more KV pages than the "
                                 f"model's pool holds ({kv.n_pages} of {kv.page_tokens} "
                                 "tokens)")
                    continue
                job.tried_at = ended
            self.page_waits += 1
            blocked.add(key)
            still.append(job)
            if not job.ephemeral:
                behind.add(job.conversation)
        # back in admission order (their order in _waiting is that order)
        order = {id(job): i for i, job in enumerate(self._waiting)}
        self._waiting = deque(sorted(still, key=lambda j: order[id(j)]))

    def _join(self, job: Job) -> bool:
        eng = job.model.engine
        context = job.model.context
        if not job.ephemeral:
            budget = self._history_budget(job)
            earlier = history.before(self.device, job.conversation, job.input_index,
                                     self.result_cap, budget)
            recalled = memory.recall_block(self.device, job.actor, job.conversation,
                                           job.query, job.op_id)
            job.prompt = render(eng, earlier, job.turn, budget, recalled, job.revision)
        job.max_output = min(job.max_output, context - len(job.prompt))
        if job.max_output < 1:
            self._finish(job, "failed", "the input alone does not fit the model's context")
            return True    # done with (failed), not waiting any more
        seq = self._sequence(job, eng)
        if seq is None:
            return False
        job.seq = seq
        if job.ephemeral:   # from the moment it starts, or earlier (memory.py)
            job.started = self.clock()
            job.deadline = min(job.deadline, job.started + self.deadline_s)
        return True

    def _history_budget(self, job: Job) -> int:
        """The tokens of history ``job``'s context may hold (:meth:`_join`): cut to fit
        the context and the whole page pool (one page of slack for rounding), so an
        input alone never waits for pages that cannot be freed."""
        kv = job.model.engine.kv_stats()
        room = min(job.model.context, (kv.n_pages - 1) * kv.page_tokens)
        return max(1, room - job.max_output)

    def _revision(self, job: Job) -> int:
        """The lease revision of ``job``: its conversation's recorded family, else the
        executor's default, by its retention mode (prompt.lease_revision).  The family
        comes from the receipts (history.revision_before): the texts and outputs are
        read once, when the input joins (:meth:`_join`)."""
        recorded = history.revision_before(self.device, job.conversation, job.input_index,
                                           self.result_cap, self._history_budget(job))
        return lease_revision(self.revision, job.retention_mode, recorded)

    def _lease(self) -> None:
        """Apply the execution leases of the inputs taken off the queue: one per model
        and revision (at most LEASE_MAX_ROWS rows), each row carrying the input's
        retention mode, rows checked by the device before it changes anything.  The
        execution deadline starts here; then each input's memory processing runs
        (:meth:`_leased`).  A refusal that may pass (a journal hold) leaves them for
        the next round; any other ends them failed.  One cancelled before its lease
        ends ``cancelled`` unleased."""
        for job in [j for j in self._unleased if j.cancelled]:
            self._finish(job, "cancelled")
        if not self._unleased:
            return
        groups: dict[tuple[int, int], list[Job]] = {}
        for job in self._unleased:
            job.revision = self._revision(job)
            groups.setdefault((id(job.model), job.revision), []).append(job)
        self._unleased = []
        for (_, revision), jobs in groups.items():
            for at in range(0, len(jobs), LEASE_MAX_ROWS):
                chunk = jobs[at:at + LEASE_MAX_ROWS]
                try:
                    rows = [dataclasses.replace(self.device.lease_row(j.op_id, i),
                                                mode=j.retention_mode)
                            for i, j in enumerate(chunk)]
                    self.device.lease(revision, rows)
                except errors.Refusal as exc:
                    if not self._lease_held:
                        log.warning("a lease of %d inputs waits: %s", len(chunk), exc)
                    self._lease_held = True
                    self._unleased += chunk
                    continue
                except errors.AotxError as exc:
                    log.warning("a lease of %d inputs failed: %s", len(chunk), exc)
                    for job in chunk:
                        self._finish(job, "failed", f"the execution lease failed: {exc}")
                    continue
                self._lease_held = False
                self.leases += 1
                now = self.clock()
                for job in chunk:
                    job.leased = True
                    job.started = now
                    job.deadline = min(job.deadline, now + self.deadline_s)
                    self._leased(job)
                self.saver.wake()

    def _journal_output(self, job: Job) -> None:
        """Journal the output bytes not journaled yet (within the result limit), in
        OUTPUT_BATCH_BYTES pieces; a journal that holds keeps them for later (the
        completion carries whatever is left)."""
        end = min(len(job.out), self.result_cap)
        while end - job.journaled >= OUTPUT_BATCH_BYTES:
            take = min(OUTPUT_BATCH_BYTES, end - job.journaled)
            piece = bytes(job.out[job.journaled:job.journaled + take])
            try:
                self.device.output(job.op_id, piece, len(job.prompt), len(job.out_tokens))
            except errors.Refusal:
                return
            except errors.AotxError as exc:
                log.warning("journaling output of %s failed: %s", job.op_id, exc)
                return
            job.journaled += take
            self.output_transfers += 1
            self.saver.wake()

    def _sequence(self, job: Job, eng: Engine) -> EngineSequence | None:
        """A sequence for ``job`` with its positions reserved, forked from its
        conversation's resident sequence when they share a prefix (``job.fed`` = the
        positions it shares); resident sequences in the way are freed first.  None:
        no room even then (the input waits)."""
        seed = job.seed if job.seed is not None else int(job.op_id[:8], 16)
        res = None if job.ephemeral else self.resident.get(job.conversation, eng)
        while True:
            n = 0 if res is None else min(common_prefix(res.tokens, job.prompt),
                                          len(job.prompt) - 1)
            try:
                if res is not None and n > 0:
                    seq, shared = eng.fork_sequence(res.seq, n, seed=seed)
                else:
                    seq, shared = eng.add_sequence(seed=seed), 0
                try:   # what it adds past the shared prefix (the fork has ``shared``)
                    eng.reserve(seq, len(job.prompt) + job.max_output - shared)
                except errors.OverCapacity:
                    eng.release(seq)
                    raise
            except errors.OverCapacity:
                if not self.resident.make_room(eng, spare=res):
                    return None
                if res is not None:
                    res = self.resident.get(job.conversation, eng)
                continue
            except errors.Refusal:
                # the resident no longer holds what the prefix needs (a sliding-window
                # layer dropped its older pages): start afresh
                self.resident.drop(job.conversation)
                res = None
                continue
            if res is not None:
                self.resident.drop(job.conversation)   # the new sequence supersedes it
            job.fed = shared
            self.resident.reused_tokens += shared
            return seq

    async def _step(self, group: list[Job]) -> None:
        eng = group[0].model.engine
        budget = eng.info.max_batch_tokens
        feeds: list[tuple[EngineSequence, list[int]]] = []
        want: list[bool] = []
        fed: list[Job] = []
        for job in group:                                  # decodes first: latency
            if job.next_token is not None and job.seq is not None and budget > 0 \
                    and (job.leased or job.ephemeral):
                feeds.append((job.seq, [job.next_token]))
                want.append(True)
                fed.append(job)
                budget -= 1
        pre = [job for job in group                          # then prefill chunks
               if job.next_token is None and job.seq is not None
               and (job.leased or job.ephemeral)]
        for job, take in zip(pre, _prefill_shares(pre, budget), strict=True):
            if job.seq is not None and (take or job.fed == len(job.prompt)):
                feeds.append((job.seq, job.prompt[job.fed:job.fed + take]))
                want.append(job.fed + take == len(job.prompt))
                fed.append(job)
        if not feeds:
            return
        self.max_group = max(self.max_group, len(feeds))
        self.steps += 1
        if id(eng) not in self._engines:   # loaded since: its pool threads go below the loop
            self._engines.add(id(eng))
            _latency.lower_worker_priority()
        try:
            res = await trio.to_thread.run_sync(_lowered_step, eng, feeds, want)
        except errors.AotxError as exc:
            log.error("engine step of %d inputs failed: %s", len(fed), exc)
            for job in fed:
                self._finish(job, "failed", str(exc))
            return
        row = 0
        for job, (_, tokens), w in zip(fed, feeds, want, strict=True):
            if job.next_token is None:
                job.fed += len(tokens)
                self.prefill_tokens += len(tokens)
            if not w:
                continue
            assert job.seq is not None
            tok = eng.sample(job.seq, res, row, job.temperature, job.top_p)
            row += 1
            self._token(job, tok)

    def _token(self, job: Job, tok: int) -> None:
        eng = job.model.engine
        assert job.seq is not None
        if tok in eng.stop_ids:
            job.finish = "stop"
            self._finish(job, "succeeded")
            return
        if not job.out_tokens:
            self.ttft.observe(max(0.0, self.clock() - job.started))
        job.out_tokens.append(tok)
        self.output_tokens += 1
        job.out += eng.detok_push(job.seq, tok)
        if not job.ephemeral and len(job.out) - job.journaled >= OUTPUT_BATCH_BYTES:
            self._journal_output(job)
        for stop in job.stop:
            at = job.out.find(stop)
            if at >= 0:
                del job.out[at:]
                job.finish = "stop"
                self._finish(job, "succeeded")
                return
        if len(job.out_tokens) >= job.max_output or len(job.out) >= self.result_cap \
                or job.seq.length + 1 >= job.model.context:
            job.finish = "length"
            self._finish(job, "succeeded")
        else:
            job.next_token = tok

    def _finish(self, job: Job, status: str, why: str = "") -> None:
        eng = job.model.engine
        if job.seq is not None:
            if job.finish != "stop" or not job.stop:   # a cut at a stop sequence stays cut
                job.out += eng.detok_flush(job.seq)
            if job.ephemeral or status == "failed":
                eng.release(job.seq)
            else:   # the conversation's next input may reuse these pages
                self.resident.keep(job.conversation, eng, job.seq,
                                   job.prompt + job.out_tokens)
            job.seq = None
        if job.finish is None:
            job.finish = {"failed": "error"}.get(status, status)
        result = bytes(job.out[:self.result_cap])
        if status == "failed" and not result:
            result = why.encode("utf-8")[:self.result_cap]
        group = self._running.get(id(job.model))
        if group is not None and job in group:
            group.remove(job)
        if job in self._unleased:
            self._unleased.remove(job)
        self._jobs.pop(job.op_id, None)
        job.turn.output = result if status in ("succeeded", "cancelled",
                                               "deadline_exceeded") else b""
        if job.ephemeral:
            if not job.abandoned:
                self._ended[job.op_id] = job
        else:
            self._completions.append((job.op_id, status, result, len(job.prompt),
                                      len(job.out_tokens),
                                      job.finish if status == "succeeded" else "none"))
            self._complete()
        self._progressed()
        self.finished[status] = self.finished.get(status, 0) + 1
        if self.on_complete is not None:
            self.on_complete(job, status)
