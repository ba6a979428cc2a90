"""Shared memory in the runtime: retention (modes 1 and 2), the memory reads, recall.

**The mode** is decided in one place, :meth:`MemoryService.retention_mode`: 2 when
the input's model has the automatic-memory capability (its runtime-file flag,
``aotx pack --auto-memory MODEL``) and its interpretation has not failed in the
last :data:`FALLBACK_S` seconds, else 1.  The job carries it
(``Job.retention_mode``); the device records it in the memory rows (byte 26) and
recovery replays the recorded mode, whatever the flags say at the next boot.

**Retention** (:meth:`MemoryService.process`, the job's ``prepare``: the handler hands
a saved admission over with its mode and submits it at once, the executor applies the
lease that records the mode, then runs it, within the deadline that starts there): the
input's text is embedded with the runtime's embedding model (all-MiniLM-L6-v2, our C
encoder, in a worker thread, one call at a time) and the device retains the text and
the embedding as two memory rows of the conversation's space, journaled in one
MEMORY transfer (docs/formats/device.md).  The embedding is kept on the job as its
recall query.  A runtime without a loaded embedding model retains nothing
(``capabilities.features.memory`` is false).

**Mode 2** adds the two memory calls, both on the input's own model, run after its
retention, before the input joins (:meth:`MemoryService.interpret`, as two ephemeral
greedy generations batched with everything else, within the input's deadline and at
most :data:`CALL_TIMEOUT_S`): call 1, the interpretation (:data:`INTERPRET_PROMPT`),
retained with its embedding as an ``interpretation`` row and an embedding row (a
second MEMORY transfer); call 2, the recall query (:data:`RECALL_QUERY_PROMPT`),
whose embedding ranks memories next to the input's own.  A call that fails or times
out leaves the input running on its mode 1 memory, and the model's next inputs are
recorded with mode 1 for :data:`FALLBACK_S` seconds (docs/decisions.md).

**Reads** render memory rows as JSON (:func:`render_row`) and one object's payload
span like an operation's result (:func:`aotx_trio.runtime.render.render_span`).

**Recall** (:func:`recall_block`, in the executor before generation): the saved text
and interpretation memories of the conversation's space that the input's participant
may read, ranked by cosine similarity to the input's embedding (mode 2: the better of
it and the recall query's; the device ranks), without the input
itself and without inputs still live in this conversation's history (the context
carries those already), at or above :data:`MIN_SIMILARITY`, rendered most similar
first within :data:`RECALL_BYTES` bytes (docs/api.md, "Memory").  Recalled text is
caller text: tokenized with special tokens off, and a media link in it stays text.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import trio

from aotx_trio import errors, vocab
from aotx_trio.native.device import Device
from aotx_trio.native.device_codec import MemoryRow
from aotx_trio.runtime import render
from aotx_trio.runtime.prompt import Turn, render_chat
from aotx_trio.runtime.served import EmbeddingModel, TextModel
from aotx_trio.vocab import ALL_GRANTS, MAX_TEXT_BYTES, format_id

if TYPE_CHECKING:
    from aotx_trio.runtime.job import Job


class Executor(Protocol):
    """What memory processing needs of runtime/executor.py's Executor (which imports
    this module: a protocol, not an import back)."""

    deadline_s: float

    def clock(self) -> float: ...
    def submit(self, job: Job) -> None: ...
    async def wait_progress(self) -> None: ...
    def ended(self, op_id: str) -> Job | None: ...
    def abandon(self, op_id: str) -> None: ...

log = logging.getLogger("aotx.memory")

RECALL_ROWS = 8              # candidates the device ranks
RECALL_BYTES = 1024          # the recalled block's byte limit in a context
MIN_SIMILARITY = 0.3         # cosine below this is not recalled
RECALL_HEADER = b"Notes recalled from this space:\n"

# mode 2: the two memory calls (greedy, on the input's own model, the message appended;
# the phrasings the default 270M model follows best of those tried: docs/decisions.md)
INTERPRET_PROMPT = b"Summarize this as a short note to remember:\n\n"
RECALL_QUERY_PROMPT = b"Give a few search keywords for this message:\n\n"
EMBED_BATCH = 32            # retention texts per encoder run at most
CALL_TOKENS = 32            # output tokens per call
CALL_TIMEOUT_S = 20.0       # a call still running this long fails (deadline_exceeded)
FALLBACK_S = 300.0          # after a failed call the model's inputs use mode 1 this long
#: A test seam, off unless set: ``SECONDS`` each input's memory processing waits after
#: its lease before it retains, or with ``after:SECONDS`` after it retained, before
#: mode 2's calls (tests/test_executor_kill9.py kills a runtime there).
DELAY_ENV = "AOTX_TEST_MEMORY_DELAY_S"


def capable(model: TextModel) -> bool:
    """Whether ``model`` has the automatic-memory capability (its runtime-file flag)."""
    return model.automatic_memory


class MemoryService:
    """Retention for one device with the runtime's embedding model (or none)."""

    def __init__(self, device: Device, embedding: EmbeddingModel | None,
                 clock: Callable[[], float] = trio.current_time) -> None:
        self.device = device
        self.embedding = embedding if embedding is not None and \
            embedding.embedder is not None else None
        self.limiter = trio.CapacityLimiter(1)
        self.clock = clock
        self.retained = 0
        self.interpreted = 0                 # mode 2 interpretations retained
        self.embed_runs = 0                  # encoder runs for retention (batched)
        # retention texts waiting for the next encoder run: (text, done, [vector | error])
        self._queue: list[tuple[str, trio.Event, list[Any]]] = []
        self._draining = False
        self._ran = trio.Event()             # set (and replaced) after every encoder run
        self.calls_failed = 0                # mode 2 memory calls that failed or timed out
        self._unavailable: dict[str, float] = {}   # model name -> mode 2 again from then
        when, _, delay = (os.environ.get(DELAY_ENV) or "").rpartition(":")
        self.delay_s, self.delay_after = float(delay or 0.0), when == "after"

    def retention_mode(self, model: TextModel) -> int:
        """The retention mode recorded for an input on ``model``: 2 when the model has
        the automatic-memory capability and its interpretation has not failed in the
        last :data:`FALLBACK_S` seconds (and memory is retained at all), else 1."""
        if not self.enabled or not capable(model):
            return 1
        until = self._unavailable.get(model.name)
        if until is not None and self.clock() < until:
            return 1
        return 2

    async def hand_over(self, executor: Executor, job: Job, text: bytes) -> None:
        """Record ``job``'s retention mode (:meth:`retention_mode`; 0 when it retains
        nothing: no text, or no embedding model) and make its memory processing
        (:meth:`process`) the job's ``prepare``, then submit it.  Nothing here waits
        for the encoder: the executor applies the lease that records the mode first,
        then runs ``prepare``, within the deadline that starts at that lease."""
        retains = bool(text) and self.enabled
        job.retention_mode = self.retention_mode(job.model) if retains else 0
        if retains:
            job.prepare = functools.partial(self.process, executor, text)
        executor.submit(job)

    async def process(self, executor: Executor, text: bytes, job: Job) -> None:
        """``job``'s memory processing, after its lease: retain ``text`` with the mode
        the lease recorded (the embedding becomes the recall query); mode 2 then runs
        its memory calls (:meth:`interpret`)."""
        if self.delay_s and not self.delay_after:   # the kill -9 tests' seam (DELAY_ENV)
            await trio.sleep(self.delay_s)
        job.query = await self.retain(job.op_id, text, job.retention_mode)
        if self.delay_s and self.delay_after:
            await trio.sleep(self.delay_s)
        if job.retention_mode == 2 and job.query is not None and not job.cancelled:
            await self.interpret(executor, job)

    @property
    def enabled(self) -> bool:
        return self.embedding is not None

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        assert self.embedding is not None and self.embedding.embedder is not None
        vectors = await trio.to_thread.run_sync(self.embedding.embedder.embed, texts,
                                                limiter=self.limiter)
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    async def embed_one(self, text: str) -> np.ndarray:
        """The embedding of one retention text.  Texts handed over together share one
        encoder run: while a run is in flight the next texts queue, and the next run
        takes them all (at most :data:`EMBED_BATCH`): concurrent inputs retain at the
        encoder's batched rate instead of its one-sentence rate.  A waiting caller runs
        the next batch itself when no run is in flight; it stops once its own text is
        embedded."""
        done = trio.Event()
        box: list[Any] = []
        self._queue.append((text, done, box))
        while not done.is_set():
            if self._draining:
                await self._ran.wait()
                continue
            self._draining = True
            batch, self._queue = self._queue[:EMBED_BATCH], self._queue[EMBED_BATCH:]
            try:
                try:
                    vecs: list[Any] = list(await self.embed([t for t, _, _ in batch]))
                except errors.AotxError as exc:
                    vecs = [exc] * len(batch)
            except BaseException:
                self._queue[:0] = batch          # cancelled: the next caller runs them
                raise
            finally:
                self._draining = False
                ran, self._ran = self._ran, trio.Event()
                ran.set()
            self.embed_runs += 1
            for (_, ev, out), v in zip(batch, vecs, strict=True):
                out.append(v)
                ev.set()
        if isinstance(box[0], errors.AotxError):
            raise box[0]
        vec: np.ndarray = box[0]
        return vec

    async def retain(self, op_id: str, text: bytes, mode: int = 1) -> np.ndarray | None:
        """Retain ``text`` for input ``op_id`` with retention ``mode``; its embedding (the
        recall query), or None when nothing was retained (no text, no embedding model,
        or a device refusal: logged, the input still runs)."""
        if not text or self.embedding is None:
            return None
        vec = await self.embed_one(text.decode("utf-8"))
        try:
            self.device.memory_retain(op_id, vec, mode)
        except errors.AotxError as exc:
            log.warning("retaining the memory of %s failed: %s", op_id, exc)
            return None
        self.retained += 1
        return vec


    async def interpret(self, executor: Executor, job: Job) -> None:
        """Mode 2's memory calls for ``job`` on its own model (the job's ``prepare``):
        call 1 interprets the input, retained as an interpretation row and its
        embedding; call 2 writes a recall query, whose embedding joins the job's
        recall queries.  A failed or timed-out call is logged and makes the model's
        next inputs use mode 1 for :data:`FALLBACK_S` seconds; the input runs anyway."""
        deadline = min(job.deadline, executor.clock() + CALL_TIMEOUT_S)
        calls = [_call(job, k, prompt, deadline)
                 for k, prompt in enumerate((INTERPRET_PROMPT, RECALL_QUERY_PROMPT))]
        ended = await _run_calls(executor, job, calls)
        if job.cancelled:
            return
        outs: list[bytes] = []
        for done in ended:
            ok = done is not None and done.finish in ("stop", "length")
            outs.append(_line(bytes(done.out)) if ok and done is not None else b"")
            if not ok:
                self._call_failed(job.model, done)
        note, query = outs
        texts = [t.decode("utf-8") for t in (note, query) if t]
        vecs = await self.embed(texts) if texts else []
        if note:
            try:
                self.device.memory_interpret(job.op_id, note, vecs[0])
                self.interpreted += 1
            except errors.AotxError as exc:    # ended meanwhile, memory full: logged
                log.warning("retaining the interpretation of %s failed: %s", job.op_id, exc)
        if query:
            job.query = (job.query, vecs[-1])

    def _call_failed(self, model: TextModel, done: Job | None) -> None:
        self.calls_failed += 1
        self._unavailable[model.name] = self.clock() + FALLBACK_S
        log.warning("a memory call on %s ended %s: its inputs use retention mode 1 for "
                    "%g s", model.name, "unfinished" if done is None else done.finish,
                    FALLBACK_S)


def _call(job: Job, k: int, instruction: bytes, deadline: float) -> Job:
    """Memory call ``k`` of ``job``: an ephemeral greedy generation on its model of
    ``instruction`` + its text (one user turn in the model's chat template)."""
    model = job.model
    prompt = render_chat(model.engine, [("user", instruction + job.turn.text)])
    return type(job)(   # a Job
        f"{job.op_id[:30]}m{k}", "", model, Turn("", b""),
        min(CALL_TOKENS, max(1, model.context - len(prompt))), prompt=prompt,
        ephemeral=True, deadline=deadline, seed=0)


async def _run_calls(executor: Executor, job: Job, calls: list[Job]) -> list[Job | None]:
    """Run ``calls`` through ``executor``; each ended call, or None when ``job`` was
    cancelled first (the calls left are abandoned)."""
    ended: list[Job | None] = [None] * len(calls)
    try:
        for call in calls:
            executor.submit(call)
        while not job.cancelled and any(e is None for e in ended):
            await executor.wait_progress()
            for i, call in enumerate(calls):
                if ended[i] is None:
                    ended[i] = executor.ended(call.op_id)
    finally:
        for call, done in zip(calls, ended, strict=True):
            if done is None:
                executor.abandon(call.op_id)
    return ended


def _line(out: bytes) -> bytes:
    """The first non-empty line of a call's output, stripped, within the text limit
    (cut at a character boundary)."""
    line = next((ln.strip() for ln in out.splitlines() if ln.strip()), b"")
    return line.decode("utf-8", errors="replace").encode("utf-8")[:MAX_TEXT_BYTES] \
        .decode("utf-8", errors="ignore").encode("utf-8")


def render_row(row: MemoryRow, lineage: str) -> dict[str, Any]:
    """A memory row as JSON (ids in their resource forms)."""
    space = vocab.PREFIXES["space"]
    source_prefix = vocab.PREFIXES["operation"] \
        if row.kind in ("text", "interpretation") and row.origin == "retained" \
        else vocab.PREFIXES["memory"]
    return {"object": format_id(vocab.PREFIXES["memory"], lineage, row.object),
            "version": str(row.version), "kind": row.kind, "scope": row.scope,
            "owner": format_id(space, lineage, row.owner),
            "room": None if row.room is None else format_id(space, lineage, row.room),
            "byte_length": row.byte_length,
            "source": format_id(source_prefix, lineage, row.source),
            "actor": format_id(vocab.PREFIXES["participant"], lineage, row.actor),
            "conversation": format_id(vocab.PREFIXES["conversation"], lineage,
                                      row.conversation),
            "retention_mode": row.mode, "origin": row.origin, "dim": row.dim or None}


def render_object(row: MemoryRow, offset: int, data: bytes, lineage: str) -> dict[str, Any]:
    """One object read: its row and the payload span from ``offset``."""
    return {"memory": render_row(row, lineage), **render.render_span(offset, data),
            "total": row.byte_length}


def _live_sources(device: Device, conversation: str) -> set[str]:
    """Operation ids of the conversation's live inputs (its history)."""
    out: set[str] = set()
    cursor = 0
    while True:
        rows, nxt, _ = device.conversation_inputs(0, None, conversation, cursor, 128)
        out.update(r.op_id for r in rows)
        if not nxt:
            return out
        cursor = nxt


def recall(device: Device, actor: str, conversation: str, query: Any, exclude: str,
           ) -> list[tuple[MemoryRow, float, bytes]]:
    """(text row, similarity, text) of the memories recalled for an input of ``actor``
    in ``conversation`` with embedding ``query``, most similar first."""
    try:
        space = device.conversation(ALL_GRANTS, actor, conversation).space
    except errors.AotxError:
        return []       # the actor may not read the conversation's space: nothing
    live = _live_sources(device, conversation)
    best: dict[str, tuple[MemoryRow, float]] = {}
    for q in _queries(query):
        for row, score in device.memory_recall(actor, space, q, RECALL_ROWS, exclude):
            if row.object not in best or best[row.object][1] < score:
                best[row.object] = (row, score)
    out = []
    ranked = sorted(best.values(), key=lambda rs: -rs[1])[:RECALL_ROWS]
    for row, score in ranked:
        if score < MIN_SIMILARITY or row.source in live:
            continue
        try:
            _, text = device.memory_read(ALL_GRANTS, actor, space, row.object)
        except errors.AotxError:
            continue
        out.append((row, score, text))
    return out


def _queries(query: Any) -> list[Any]:
    """The recall queries of a job: its embedding, or (mode 2) a tuple of embeddings."""
    return list(query) if isinstance(query, tuple) else [query]


def render_recalled(items: list[tuple[MemoryRow, float, bytes]],
                    limit: int = RECALL_BYTES) -> bytes:
    """The recalled block that opens the input's user turn: a header, then one line per
    memory (``- {text}``, newlines as spaces) in rank order while the block stays
    within ``limit`` bytes (a memory that does not fit whole is left out), then a blank
    line; empty when nothing fits.  (No participant labels: with them the default
    270M model echoes the label instead of the note.)"""
    block = bytearray(RECALL_HEADER)
    lines = 0
    for _, _, text in items:
        line = b"- " + text.replace(b"\n", b" ") + b"\n"
        if len(block) + len(line) + 1 > limit:
            continue
        block += line
        lines += 1
    return bytes(block) + b"\n" if lines else b""


def recall_block(device: Device, actor: str, conversation: str, query: Any,
                 exclude: str) -> bytes:
    """:func:`render_recalled` of :func:`recall` (empty without a query)."""
    if query is None:
        return b""
    return render_recalled(recall(device, actor, conversation, query, exclude))
