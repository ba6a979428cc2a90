"""The runtime's event fanout: one task feeds every live event stream.

A stream of a conversation's events (``conversation.watch``) or of an
operation's output (``operation.watch``) first reads what it is behind on
with its caller's own grants (its *new read*: membership and grants are
checked there, runtime/conv_events.py and the handler).  Once caught up it
*follows*: it joins its resource's topic here and the fanout pushes it what
appears next.  :meth:`Fanout.run` is one supervised task per runtime; it
makes one pass over the topics whenever the journal saves records (new
conversation events are saved admissions) or the executor makes progress
(new output bytes).  Per topic and pass it reads the device *once*:

* a conversation topic reads the inputs saved after its frontier with the
  runtime's own view and renders each at most twice (its actor's own view,
  and the foreign view with ``sequence`` and ``operation_key`` null, exactly
  what the device shows another participant); inputs retired before a
  follower got them (a run of its cursor's successors missing) are pushed to
  it as one gap item first (runtime/conv_events.py), never skipped silently;
* an operation topic takes the executor's output once and cuts one span per
  distinct subscriber position.

Before it pushes, the pass checks the read right again once per distinct
reader (grant mask, principal key) with the reader's current grants, not once
per subscriber; a reader who lost it gets the error, which ends its streams.
Every subscriber shares the same :class:`aotx_trio.service.pushed.Pushed` items, so
the socket and the gateway encode each event once.  Each follower has a
bounded buffer (``depth`` items); one that is full is dropped: its iteration
raises :class:`aotx_trio.errors.OverCapacity` with code ``slow_consumer``
(the device client ends the subscription with that reason).  A follower whose
cursor is behind the topic's frontier when it joins (it read a page, then the
topic moved on) ends at once with nothing pushed, and its stream reads again
with its own grants; so does an operation's follower once the executor no
longer holds the operation (the rest is read from the device).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any

import trio

from aotx_trio import errors
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import Receipt
from aotx_trio.runtime.render import render_receipt, render_span
from aotx_trio.service.pushed import Pushed
from aotx_trio.service.wire import SLOW_CONSUMER

log = logging.getLogger("aotx.fanout")

DEPTH = 256                 # items a follower may be behind before it is dropped
BATCH = 64                  # inputs per device read of a conversation topic

Caller = Callable[[], tuple[int, str]]      # (grant mask, principal key), read now


def _saved(r: Receipt) -> bool:
    return r.admission_saved or r.save.saved_records > r.admission_record


class Follow:
    """One stream's live phase: ``with fanout.follow_...(...) as f: async for item in f``.

    Iteration ends (StopAsyncIteration) when the stream must read by itself again
    (behind the topic, or the operation left the executor); raises the reader's
    error, or OverCapacity (``slow_consumer``) when dropped."""

    def __init__(self, fanout: Fanout, topic: _Topic, key: str, caller: Caller, cursor: int,
                 depth: int) -> None:
        self._fanout = fanout
        self._topic = topic
        self.key = key
        self.caller = caller
        self.cursor = cursor
        self.send, self._receive = trio.open_memory_channel[Pushed](depth)
        self.dropped = False
        self.stopped = False
        self.error: errors.AotxError | None = None

    def push(self, item: Pushed) -> bool:
        """Queue ``item``; False when it was not (this push dropped the follower, or its
        live phase ended before: a pass may hold several rows for one follower)."""
        if self.stopped:
            return False
        try:
            self.send.send_nowait(item)
        except trio.WouldBlock:
            self.dropped = True
            self._fanout.dropped += 1
            self.stop()
            return False
        self._fanout.pushed += 1
        return True

    def fail(self, exc: errors.AotxError) -> None:
        self.error = exc
        self.stop()

    def stop(self) -> None:
        """End the live phase (what was pushed is still read first)."""
        self.stopped = True
        self.send.close()
        self._topic.followers.discard(self)

    def __enter__(self) -> Follow:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
        self._receive.close()
        self._fanout._forget(self._topic)

    def __aiter__(self) -> Follow:
        return self

    async def __anext__(self) -> Pushed:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            pass
        if self.error is not None:
            raise self.error
        if self.dropped:
            raise errors.OverCapacity(
                f"the subscriber fell more than {self._fanout.depth} events behind and was "
                "dropped", code=SLOW_CONSUMER)
        raise StopAsyncIteration


class _Topic:
    def __init__(self, kind: str, name: str, frontier: int, executor: Any = None) -> None:
        self.kind = kind              # "conversation" | "operation"
        self.name = name              # the conversation's or operation's device id
        self.frontier = frontier      # conversation: the last input index read
        self.executor = executor      # operation: the executor that runs it
        self.followers: set[Follow] = set()


class Fanout:
    """See the module doc."""

    def __init__(self, device: Device, saver: Any, lineage: str, *,
                 depth: int = DEPTH, batch: int = BATCH) -> None:
        self.device = device
        self.saver = saver                  # saved_records, wait_saved(record)
        self.lineage = lineage
        self.depth = depth
        self.batch = batch
        self._topics: dict[tuple[str, str], _Topic] = {}
        self._kick = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._executors: set[int] = set()   # id() of the executors a waker follows
        self.passes = 0                     # passes made (tests, metrics)
        self.pushed = 0                     # items pushed to followers
        self.dropped = 0                    # followers dropped as slow consumers
        self.reads = 0                      # device reads made by passes

    # -- joining ----------------------------------------------------------------------
    def follow_conversation(self, conversation: str, key: str, caller: Caller,
                            cursor: int) -> Follow:
        """Follow the conversation's saved inputs after ``cursor`` (caught up to it)."""
        return self._join("conversation", conversation, key, caller, cursor)

    def follow_operation(self, op: str, key: str, caller: Caller, offset: int,
                         executor: Any) -> Follow:
        """Follow the output bytes ``executor`` (``output(op)``, ``wait_progress()``)
        produces for ``op`` from ``offset``."""
        if self._nursery is None:
            raise errors.RuntimeUnavailable("the event fanout is not running")
        if id(executor) not in self._executors:
            self._executors.add(id(executor))
            self._nursery.start_soon(self._progress, executor)
        return self._join("operation", op, key, caller, offset, executor)

    def _join(self, kind: str, name: str, key: str, caller: Caller, cursor: int,
              executor: Any = None) -> Follow:
        topic = self._topics.get((kind, name))
        if topic is None:
            topic = self._topics[(kind, name)] = _Topic(kind, name, cursor, executor)
        f = Follow(self, topic, key, caller, cursor, self.depth)
        if kind == "conversation" and cursor < topic.frontier:
            f.stop()                      # behind what was pushed: read again first
        else:
            topic.followers.add(f)
            self._kick.set()              # its first span may be ready now
        return f

    def _forget(self, topic: _Topic) -> None:
        if not topic.followers and self._topics.get((topic.kind, topic.name)) is topic:
            del self._topics[(topic.kind, topic.name)]

    def followers(self) -> int:
        return sum(len(t.followers) for t in self._topics.values())

    # -- the task -----------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
                  ) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._saves)
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    await self._kick.wait()
                    self._kick = trio.Event()
                    self.fan()
                    await trio.lowlevel.checkpoint()
            finally:
                self._nursery = None

    async def _saves(self) -> None:
        while True:
            await self.saver.wait_saved(self.saver.saved_records)
            if self._topics:
                self._kick.set()

    async def _progress(self, executor: Any) -> None:
        """Kick a pass on each round of ``executor`` while a topic follows it."""
        try:
            while True:
                await executor.wait_progress()
                if not any(t.executor is executor for t in self._topics.values()):
                    return
                self._kick.set()
        finally:
            self._executors.discard(id(executor))

    def fan(self) -> None:
        """One pass over every topic (see the module doc)."""
        self.passes += 1
        for topic in list(self._topics.values()):
            if topic.kind == "conversation":
                self._conversation(topic)
            else:
                self._operation(topic)
            self._forget(topic)

    def _readers(self, followers: list[Follow]) -> dict[tuple[int, str], list[Follow]]:
        """Followers by reader, with each reader's grants as they are now."""
        out: dict[tuple[int, str], list[Follow]] = {}
        for f in followers:
            try:
                grants, _ = f.caller()
            except errors.AotxError as exc:
                f.fail(exc)
                continue
            out.setdefault((grants, f.key), []).append(f)
        return out

    def _conversation(self, topic: _Topic) -> None:
        new: list[Receipt] = []
        at = topic.frontier
        floor = 0
        try:
            while True:
                self.reads += 1
                rows, more, floor = self.device.conversation_inputs(0, None, topic.name, at,
                                                                    self.batch)
                for r in rows:
                    if not _saved(r):        # saves are a prefix: nothing saved follows
                        more = 0
                        break
                    new.append(r)
                    at = r.input_index
                if not more or not rows:
                    break
        except errors.AotxError as exc:
            for f in list(topic.followers):
                f.fail(exc)
            return
        if not new:
            return
        topic.frontier = at
        views: dict[tuple[int, bool], Pushed] = {}
        full: dict[int, dict[str, Any]] = {}
        for (grants, key), followers in self._readers(list(topic.followers)).items():
            try:
                self.reads += 1
                self.device.conversation(grants, key, topic.name)   # the read right, now
            except errors.AotxError as exc:
                for f in followers:
                    f.fail(exc)
                continue
            for r in new:
                own = r.participant == key
                item = views.get((r.input_index, own))
                if item is None:
                    item = views[(r.input_index, own)] = self._event(r, own, full)
                for f in followers:
                    if r.input_index <= f.cursor:
                        continue
                    if r.input_index > f.cursor + 1 and not f.push(_gap(   # retired meanwhile
                            f.cursor, r.input_index - 1, floor)):
                        continue
                    if f.push(item):
                        f.cursor = r.input_index

    def _event(self, r: Receipt, own: bool, full: dict[int, dict[str, Any]]) -> Pushed:
        """The event of input ``r`` as its actor (``own``) or anyone else sees it."""
        receipt = full.get(r.input_index)
        if receipt is None:
            receipt = full[r.input_index] = render_receipt(r, self.lineage)
        if not own:
            receipt = {**receipt, "sequence": None, "operation_key": None}
        return Pushed({"cursor": str(r.input_index), "receipt": receipt})

    def _operation(self, topic: _Topic) -> None:
        live = topic.executor.output(topic.name)
        if live is None:     # not (or no longer) in the executor: the streams read it
            for f in list(topic.followers):
                f.stop()
            return
        total = len(live)
        behind = [f for f in topic.followers if f.cursor < total]
        if not behind:
            return
        spans: dict[tuple[int, int], Pushed] = {}
        for (grants, key), followers in self._readers(behind).items():
            try:
                self.reads += 1
                receipt = self.device.receipt(grants, key, topic.name)  # the read right, now
                # the actor follows the live bytes; anyone else only what is saved (the
                # device's result read of a running input: its saved OUTPUT transfers)
                end = total if receipt.participant == key else \
                    min(total, self.device.result(grants, key, topic.name, 0, 0)[1])
            except errors.AotxError as exc:
                for f in followers:
                    f.fail(exc)
                continue
            for f in followers:
                if f.cursor >= end:
                    continue
                item = spans.get((f.cursor, end))
                if item is None:
                    item = spans[(f.cursor, end)] = Pushed(
                        render_span(f.cursor, live[f.cursor:end]))
                if f.push(item):
                    f.cursor = end


def _gap(cursor: int, last: int, floor: int) -> Pushed:
    """The gap item of retired inputs ``cursor+1..last`` a follower passes
    (runtime/conv_events.py)."""
    return Pushed({"gap": True, "cursor": str(cursor), "first": str(cursor + 1),
                   "last": str(last), "event_floor": str(floor)})
