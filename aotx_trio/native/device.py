"""The durable shared-state device: a typed face over ``csrc/device/aotx_device.h``.

:class:`Device` holds the native device and makes its calls; the values they take
and return, and their packing to and from C, are native/device_codec.py's
(re-exported here, with the vocabulary, as the device's names).  Every 16-byte
value (principal keys, operation keys, lineage, space / conversation / operation
ids) goes in and comes out as 32 lowercase hex digits.  Every native code goes
through :func:`aotx_trio.native.lib.check`.  Calls take microseconds and never
block on I/O: the gateway may call them directly from trio.

The journal is borrowed: pass the ``aotx_journal *`` cdata (or any object with
a ``handle`` attribute holding it); it must outlive the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aotx_trio import errors
from aotx_trio.native.device_codec import (  # noqa: F401  (re-exported: the device's values)
    LEASE_HEADER,
    LEASE_MAX_ROWS,
    LEASE_ROW,
    LEASE_ROW_V1,
    OUTPUT_HEADER,
    OUTPUT_HEADER_V2,
    Conversation,
    LeaseRow,
    Member,
    MemoryRow,
    Participant,
    Receipt,
    Request,
    Space,
    Usage,
    conversation_of,
    decode_canonical,
    decode_lease,
    encode_canonical,
    encode_lease,
    fill_lease_rows,
    fill_request,
    floats,
    hex16,
    lease_row_of,
    member_of,
    memory_row_of,
    new_request,
    parse_resource_id,
    participant_of,
    receipt_of,
    resource_id,
    rights_mask,
    rights_names,
    space_of,
    u32,
    u64,
    usage_of,
)
from aotx_trio.native.journal import Anchor, JournalReader
from aotx_trio.native.lib import check, error_for, ffi, lib
from aotx_trio.vocab import (  # noqa: F401  (re-exported: the device's vocabulary)
    ALL_GRANTS,
    FINISH_CODES,
    GRANT_MANAGE,
    GRANT_READ,
    GRANT_WRITE,
    MEDIA_TYPES,
    SCOPES,
    STATUSES,
    Kind,
    finish_of,
)


@dataclass
class Device:
    """One native device over a borrowed journal."""

    journal: Any
    lineage: str
    default_pages: int = 0
    _handle: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        params = ffi.new("aotx_device_params *")
        lib.aotx_device_default_params(params)
        params.default_pages = self.default_pages
        out = ffi.new("aotx_device **")
        jh = getattr(self.journal, "handle", self.journal)
        check(lib.aotx_device_new(params, hex16(self.lineage, "lineage"), jh, out))
        self._handle = ffi.gc(out[0], lib.aotx_device_free)

    def close(self) -> None:
        if self._handle is not None:
            ffi.release(self._handle)
            self._handle = None

    # -- ids --
    def id_of(self, prefix: str, ident: str) -> str:
        return resource_id(prefix, self.lineage, ident)

    def parse_id(self, prefix: str, text: str) -> str | None:
        return parse_resource_id(prefix, self.lineage, text)

    # -- mutations --
    def submit(self, grants: int, actor: str, req: Request) -> Receipt:
        c = fill_request(req)
        out = ffi.new("aotx_receipt_view *")
        check(lib.aotx_device_submit(self._handle, grants, hex16(actor, "actor"), c, out))
        return receipt_of(out)

    def start(self, op_id: str) -> None:
        check(lib.aotx_device_start(self._handle, hex16(op_id, "op_id")))

    def lease_row(self, op_id: str, request_index: int = 0) -> LeaseRow:
        """The lease row of a live INPUT (the executor's own read): its slot, sequence,
        actor and recorded retention mode."""
        out = ffi.new("aotx_lease_row *")
        check(lib.aotx_device_lease_row(self._handle, hex16(op_id, "op_id"),
                                        u32(request_index, "request_index"), out))
        return lease_row_of(out)

    def lease(self, revision: int, rows: list[LeaseRow]) -> None:
        """Apply one execution lease: every row is checked before anything changes;
        then one LEASE transfer is journaled and each input runs, leased."""
        c = fill_lease_rows(rows)
        check(lib.aotx_device_lease(self._handle, u32(revision, "revision"), c, len(rows)))

    def output(self, op_id: str, data: bytes, input_tokens: int = 0,
               output_tokens: int = 0) -> None:
        """Journal output bytes of a leased, running INPUT (one OUTPUT transfer) with its
        token counts so far (what its receipt reports until it ends, and after a crash
        as ``interrupted``)."""
        check(lib.aotx_device_output(self._handle, hex16(op_id, "op_id"), data, len(data),
                                     input_tokens, output_tokens))

    def complete(self, op_id: str, status: str, result: bytes = b"", input_tokens: int = 0,
                 output_tokens: int = 0, finish: str = "none") -> None:
        """The terminal result of an INPUT; ``finish`` ``stop``/``length`` for a
        succeeded one (journaled in the completion transfer)."""
        if status not in STATUSES:
            raise errors.InvalidInput(f"unknown status {status!r}", code="status_invalid",
                                      field="status")
        if finish not in FINISH_CODES:
            raise errors.InvalidInput(f"unknown finish {finish!r}", code="status_invalid",
                                      field="finish")
        check(lib.aotx_device_complete(self._handle, hex16(op_id, "op_id"),
                                       STATUSES.index(status), FINISH_CODES.index(finish),
                                       result, len(result), input_tokens, output_tokens))

    # -- reads --
    def receipt(self, grants: int, actor: str, op_id: str) -> Receipt:
        out = ffi.new("aotx_receipt_view *")
        check(lib.aotx_device_receipt(self._handle, grants, hex16(actor, "actor"),
                                      hex16(op_id, "op_id"), out))
        return receipt_of(out)

    def result(self, grants: int, actor: str, op_id: str, offset: int = 0,
               limit: int = 65536) -> tuple[bytes, int]:
        """(bytes from offset, total result length)."""
        buf = ffi.new("uint8_t[]", max(limit, 1))
        total = ffi.new("uint32_t *")
        n = lib.aotx_device_result_read(self._handle, grants, hex16(actor, "actor"),
                                        hex16(op_id, "op_id"), u64(offset, "offset"), buf,
                                        limit, total)
        if n < 0:
            check(int(n))
        return bytes(ffi.buffer(buf, n)), int(total[0])

    def participant(self, grants: int, actor: str, key: str | None = None) -> Participant:
        out = ffi.new("aotx_participant_view *")
        check(lib.aotx_device_participant(self._handle, grants, hex16(actor, "actor"),
                                          hex16(key or actor, "participant"), out))
        return participant_of(out)

    def space(self, grants: int, actor: str, space: str) -> Space:
        out = ffi.new("aotx_space_view *")
        check(lib.aotx_device_space(self._handle, grants, hex16(actor, "actor"),
                                    hex16(space, "space"), out))
        return space_of(out)

    def spaces(self, grants: int, actor: str, cursor: int = 0,
               limit: int = 100) -> tuple[list[Space], int]:
        out = ffi.new("aotx_space_view[]", max(limit, 1))
        n = ffi.new("uint32_t *")
        nxt = ffi.new("uint64_t *")
        check(lib.aotx_device_spaces(self._handle, grants, hex16(actor, "actor"),
                                     u64(cursor, "cursor"), u32(limit, "limit"), out, n, nxt))
        return [space_of(out[i]) for i in range(n[0])], int(nxt[0])

    def _space_page(self, call: Any, view: str, grants: int, actor: str, space: str,
                    cursor: int, limit: int) -> tuple[Any, int, int]:
        """One page of a space-scoped list call: (views, row count, next cursor)."""
        out = ffi.new(f"{view}[]", max(limit, 1))
        n = ffi.new("uint32_t *")
        nxt = ffi.new("uint64_t *")
        check(call(self._handle, grants, hex16(actor, "actor"), hex16(space, "space"),
                   u64(cursor, "cursor"), u32(limit, "limit"), out, n, nxt))
        return out, int(n[0]), int(nxt[0])

    def members(self, grants: int, actor: str, space: str, cursor: int = 0,
                limit: int = 100) -> tuple[list[Member], int]:
        out, n, nxt = self._space_page(lib.aotx_device_members, "aotx_member_view", grants,
                                       actor, space, cursor, limit)
        return [member_of(out[i]) for i in range(n)], nxt

    def conversations(self, grants: int, actor: str, space: str, cursor: int = 0,
                      limit: int = 100) -> tuple[list[Conversation], int]:
        out, n, nxt = self._space_page(lib.aotx_device_conversations,
                                       "aotx_conversation_view", grants, actor, space,
                                       cursor, limit)
        return [conversation_of(out[i]) for i in range(n)], nxt

    def conversation(self, grants: int, actor: str, conversation: str) -> Conversation:
        out = ffi.new("aotx_conversation_view *")
        check(lib.aotx_device_conversation(self._handle, grants, hex16(actor, "actor"),
                                           hex16(conversation, "conversation"), out))
        return conversation_of(out)

    def conversation_inputs(self, grants: int, actor: str | None, conversation: str,
                            cursor: int = 0, limit: int = 100,
                            ) -> tuple[list[Receipt], int, int]:
        """(live INPUT receipts after input ``cursor`` in input order, the next cursor
        (0: none later), the event floor: inputs at or below it are retired).  ``actor``
        None is the runtime's own read (no grant or right check)."""
        out = ffi.new("aotx_receipt_view[]", max(limit, 1))
        n = ffi.new("uint32_t *")
        nxt = ffi.new("uint64_t *")
        floor = ffi.new("uint64_t *")
        who = ffi.NULL if actor is None else hex16(actor, "actor")
        check(lib.aotx_device_conversation_inputs(
            self._handle, grants, who, hex16(conversation, "conversation"),
            u64(cursor, "cursor"), u32(limit, "limit"), out, n, nxt, floor))
        return [receipt_of(out + i) for i in range(n[0])], int(nxt[0]), int(floor[0])

    def canonical(self, op_id: str) -> bytes:
        """The runtime's own read of a live receipt's canonical operation bytes."""
        key = hex16(op_id, "op_id")
        n = ffi.new("uint32_t *")
        check(lib.aotx_device_canonical(self._handle, key, ffi.NULL, 0, n))
        buf = ffi.new("uint8_t[]", max(int(n[0]), 1))
        check(lib.aotx_device_canonical(self._handle, key, buf, n[0], n))
        return bytes(ffi.buffer(buf, n[0]))

    def usage(self) -> Usage:
        u = ffi.new("aotx_device_usage *")
        lib.aotx_device_usage_get(self._handle, u)
        return usage_of(u)

    # -- memory --
    def memory_retain(self, op_id: str, embedding: Any, mode: int = 1) -> list[MemoryRow]:
        """Retain an input's source text and its embedding (float32 values) as two memory
        rows recorded with retention ``mode`` (1, or 2: its model has the automatic-memory
        capability), journaled in one MEMORY transfer; [] for a text-less input."""
        buf, dim = floats(embedding)
        out = ffi.new("aotx_memory_row[2]")
        n = ffi.new("uint32_t *")
        check(lib.aotx_device_memory_retain_mode(self._handle, hex16(op_id, "op_id"), mode, buf,
                                                 dim, out, n))
        return [memory_row_of(out[i]) for i in range(n[0])]

    def memory_interpret(self, op_id: str, text: bytes, embedding: Any) -> list[MemoryRow]:
        """Mode 2: retain the model's interpretation of input ``op_id`` (UTF-8) and its
        embedding as an interpretation row and an embedding row (one MEMORY transfer)."""
        buf, dim = floats(embedding)
        out = ffi.new("aotx_memory_row[2]")
        n = ffi.new("uint32_t *")
        check(lib.aotx_device_memory_interpret(self._handle, hex16(op_id, "op_id"), text,
                                               len(text), buf, dim, out, n))
        return [memory_row_of(out[i]) for i in range(n[0])]

    def memory_list(self, grants: int, actor: str, space: str, cursor: int = 0,
                    limit: int = 100) -> tuple[list[MemoryRow], int]:
        """Saved memory rows of ``space`` (read right on it), from table position
        ``cursor``; (rows, next cursor or 0)."""
        out, n, nxt = self._space_page(lib.aotx_device_memory_list, "aotx_memory_row", grants,
                                       actor, space, cursor, limit)
        return [memory_row_of(out[i]) for i in range(n)], nxt

    def memory_read(self, grants: int, actor: str, space: str, obj: str, offset: int = 0,
                    limit: int = 65536) -> tuple[MemoryRow, bytes]:
        """(row, payload bytes from ``offset``) of one saved memory object of ``space``."""
        buf = ffi.new("uint8_t[]", max(limit, 1))
        row = ffi.new("aotx_memory_row *")
        n = lib.aotx_device_memory_read(self._handle, grants, hex16(actor, "actor"),
                                        hex16(space, "space"), hex16(obj, "object"),
                                        u64(offset, "offset"), buf, limit, row)
        if n < 0:
            check(int(n))
        return memory_row_of(row), bytes(ffi.buffer(buf, n))

    def memory_recall(self, actor: str, space: str, query: Any, limit: int = 8,
                      exclude: str | None = None) -> list[tuple[MemoryRow, float]]:
        """The runtime's own read: saved text memories of ``space`` that ``actor`` may
        read, ranked by cosine similarity of their embeddings to ``query``, best first
        (at most ``limit``, 64 at most); ``exclude`` an operation id whose memory is
        skipped (the input's own)."""
        q, dim = floats(query)
        out = ffi.new("aotx_memory_row[]", max(limit, 1))
        score = ffi.new("float[]", max(limit, 1))
        n = ffi.new("uint32_t *")
        skip = ffi.NULL if exclude is None else hex16(exclude, "exclude")
        check(lib.aotx_device_memory_recall(self._handle, hex16(actor, "actor"),
                                            hex16(space, "space"), q, dim, skip,
                                            u32(limit, "limit"), out, score, n))
        return [(memory_row_of(out[i]), float(score[i])) for i in range(n[0])]

    # -- recovery --
    def recover(self, reader: JournalReader) -> None:
        """Replay every transfer of a journal reader (see aotx_device_recover).

        Takes the :class:`JournalReader` itself, never its bare handle: the reader
        owns the file image the native reader points into, so holding it here
        keeps that memory alive for the whole replay."""
        if not isinstance(reader, JournalReader):
            raise TypeError("Device.recover takes an aotx_trio.native.journal.JournalReader")
        bad = ffi.new("uint64_t *")
        rc = lib.aotx_device_recover(self._handle, reader.handle, bad)
        if rc != 0:
            raise error_for(int(rc), f"record {int(bad[0])}", record=int(bad[0]))

    # -- checkpoints (docs/formats/checkpoint.md) --
    def checkpoint(self, anchor: Anchor) -> bytes:
        """The state tables as a checkpoint section tied to ``anchor`` (every table
        row must lie inside its records; ``device_out_of_order`` otherwise)."""
        a = anchor.native()
        size = ffi.new("size_t *")
        check(lib.aotx_device_checkpoint_encode(self._handle, a, ffi.NULL, 0, size))
        buf = ffi.new("uint8_t[]", int(size[0]))
        check(lib.aotx_device_checkpoint_encode(self._handle, a, buf, int(size[0]), size))
        return bytes(ffi.buffer(buf, int(size[0])))

    def load_checkpoint(self, section: bytes) -> Anchor:
        """Fill a fresh device from a checkpoint section; returns its journal position
        (seek the reader there, then :meth:`recover` replays only the suffix)."""
        a = ffi.new("aotx_journal_anchor *")
        bad = ffi.new("uint64_t *")
        rc = lib.aotx_device_checkpoint_load(self._handle, section, len(section), a, bad)
        if rc != 0:
            raise error_for(int(rc), f"checkpoint byte {int(bad[0])}", offset=int(bad[0]))
        return Anchor.of(a)

    def recover_offline(self) -> None:
        """The next :meth:`recover` enqueues no ``interrupted`` completions (an offline
        checkpoint holds exactly the journal's state)."""
        lib.aotx_device_recover_offline(self._handle)
