"""Shared memory in the runtime: retention (mode 1), the memory reads, recall.

**Retention.**  Once an input's admission is saved and before it is handed to the
executor, :meth:`MemoryService.retain` embeds its text with the runtime's embedding
model (all-MiniLM-L6-v2, our C encoder, in a worker thread, one call at a time) and
has the device retain the text and the embedding as two memory rows of the
conversation's space, journaled in one MEMORY transfer (docs/formats/device.md).
The embedding is kept on the job as its recall query.  A runtime without a loaded
embedding model retains nothing (``capabilities.features.memory`` is false).

**Reads** render memory rows as JSON (:func:`render_row`) and one object's payload
span like an operation's result (:func:`aotx_trio.runtime.render.render_span`).

**Recall** (:func:`recall_block`, in the executor before generation): the saved text
memories of the conversation's space that the input's participant may read, ranked
by cosine similarity to the input's embedding (the device ranks), without the input
itself and without inputs still live in this conversation's history (the context
carries those already), at or above :data:`MIN_SIMILARITY`, rendered most similar
first within :data:`RECALL_BYTES` bytes (docs/api.md, "Memory").  Recalled text is
caller text: tokenized with special tokens off, and a media link in it stays text.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import trio

from aotx_trio import errors, vocab
from aotx_trio.device import Device, MemoryRow
from aotx_trio.runtime import render
from aotx_trio.runtime.models import EmbeddingModel
from aotx_trio.vocab import ALL_GRANTS, format_id

log = logging.getLogger("aotx.memory")

RECALL_ROWS = 8              # candidates the device ranks
RECALL_BYTES = 1024          # the recalled block's byte limit in a context
MIN_SIMILARITY = 0.3         # cosine below this is not recalled
RECALL_HEADER = b"Notes recalled from this space:\n"


class MemoryService:
    """Retention for one device with the runtime's embedding model (or none)."""

    def __init__(self, device: Device, embedding: EmbeddingModel | None) -> None:
        self.device = device
        self.embedding = embedding if embedding is not None and \
            embedding.embedder is not None else None
        self.limiter = trio.CapacityLimiter(1)
        self.retained = 0

    @property
    def enabled(self) -> bool:
        return self.embedding is not None

    async def embed(self, texts: list[str]) -> list[np.ndarray]:
        assert self.embedding is not None and self.embedding.embedder is not None
        vectors = await trio.to_thread.run_sync(self.embedding.embedder.embed, texts,
                                                limiter=self.limiter)
        return [np.asarray(v, dtype=np.float32) for v in vectors]

    async def retain(self, op_id: str, text: bytes) -> np.ndarray | None:
        """Retain ``text`` for input ``op_id``; its embedding (the recall query), or None
        when nothing was retained (no text, no embedding model, or a device refusal:
        logged, the input still runs)."""
        if not text or self.embedding is None:
            return None
        (vec,) = await self.embed([text.decode("utf-8")])
        try:
            self.device.memory_retain(op_id, vec)
        except errors.AotxError as exc:
            log.warning("retaining the memory of %s failed: %s", op_id, exc)
            return None
        self.retained += 1
        return vec


def render_row(row: MemoryRow, lineage: str) -> dict[str, Any]:
    """A memory row as JSON (ids in their resource forms)."""
    space = vocab.PREFIXES["space"]
    source_prefix = vocab.PREFIXES["operation"] \
        if row.kind == "text" and row.origin == "retained" else vocab.PREFIXES["memory"]
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
    out = []
    for row, score in device.memory_recall(actor, space, query, RECALL_ROWS, exclude):
        if score < MIN_SIMILARITY or row.source in live:
            continue
        try:
            _, text = device.memory_read(ALL_GRANTS, actor, space, row.object)
        except errors.AotxError:
            continue
        out.append((row, score, text))
    return out


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
