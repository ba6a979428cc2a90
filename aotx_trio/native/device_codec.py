"""The device's marshalling: the values its calls take and return, to and from C.

Every 16-byte value (principal keys, operation keys, lineage, space /
conversation / operation ids) goes in and comes out as 32 lowercase hex digits
(:func:`hex16`, :func:`hex_of`); :func:`resource_id` / :func:`parse_resource_id`
turn them into the ``spc-{lineage}-{id}`` forms of the spec.  Here: the
:class:`Request` and its packing into ``aotx_request`` (:func:`fill_request`, one
``pack_into`` laid out from cffi's own offsets) and canonical bytes
(:func:`encode_canonical` / :func:`decode_canonical`); the views the device fills
(:class:`Receipt` read in one ``unpack``, :func:`receipt_of`; :class:`Participant`,
:class:`Space`, :class:`Member`, :class:`Conversation`, :class:`Usage`,
:class:`MemoryRow`); and the lease transfer's rows (:class:`LeaseRow`,
:func:`encode_lease` / :func:`decode_lease`).  The calls themselves are
:class:`~aotx_trio.native.device.Device`'s (native/device.py).
"""

from __future__ import annotations

import math
import operator
import struct
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from aotx_trio import errors
from aotx_trio.native.journal import SaveId, SaveState
from aotx_trio.native.lib import check, ffi, lib
from aotx_trio.vocab import (
    MAX_MEDIA,
    MAX_MODEL_NAME,
    MAX_TEXT_BYTES,
    MEDIA_TYPES,
    MEMORY_KINDS,
    SCOPES,
    STATUSES,
    Kind,
    finish_of,
    format_id,
    parse_id,
)
from aotx_trio.vocab import PERMISSIONS as RIGHT_NAMES

_T = TypeVar("_T")

# ---- ids ----------------------------------------------------------------


_HEX16: dict[str, bytes] = {}   # ids seen lately (lineage, actors, spaces): their bytes
_HEX16_MAX = 8192


def hex16(value: str, name: str) -> bytes:
    """A 32-digit lowercase hex id as its 16 bytes (422 ``{name}_invalid`` otherwise);
    the ids a device call names again and again are looked up, not parsed again."""
    found = _HEX16.get(value)
    if found is not None:
        return found
    if len(value) != 32 or value.lower() != value:
        raise errors.InvalidInput(f"{name} must be 32 lowercase hex digits", code=f"{name}_invalid",
                                  field=name)
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        raise errors.InvalidInput(f"{name} must be 32 lowercase hex digits",
                                  code=f"{name}_invalid", field=name) from None
    if len(_HEX16) >= _HEX16_MAX:
        _HEX16.clear()
    _HEX16[value] = raw
    return raw


def hex_of(buf: Any, n: int = 16) -> str:
    return bytes(ffi.buffer(buf, n)).hex()


resource_id = format_id
"""``{prefix}-{lineage}-{id}`` (par, spc, con, op): :func:`aotx_trio.vocab.format_id`."""


def parse_resource_id(prefix: str, lineage: str, text: str) -> str | None:
    """The 32-hex id inside ``{prefix}-{lineage}-{id}``, or None when it is not one of
    this lineage (callers answer not_found)."""
    return parse_id(prefix, lineage, text)


def rights_mask(permissions: tuple[str, ...] | list[str]) -> int:
    mask = 0
    for p in permissions:
        if p not in RIGHT_NAMES:
            raise errors.InvalidInput(f"unknown permission {p!r}", code="rights_invalid",
                                      field="permissions")
        mask |= 1 << RIGHT_NAMES.index(p)
    return mask


def rights_names(mask: int) -> tuple[str, ...]:
    return tuple(n for i, n in enumerate(RIGHT_NAMES) if mask & (1 << i))


# ---- requests -----------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """One sequenced mutation; defaults are the spec's (256 tokens, temperature 0,
    top_p 1, pages 0 = current grant, scope private, id = operation key)."""

    kind: Kind
    lineage: str
    operation_key: str
    sequence: int
    id: str | None = None
    scope: str = "private"
    space: str | None = None
    participant: str | None = None
    permissions: tuple[str, ...] = ()
    conversation: str | None = None
    text: str | bytes = ""
    model: str = ""
    max_output_tokens: int = 256
    pages: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    media: tuple[tuple[str, str], ...] = ()  # (type, sha256 hex)
    target_sequence: int = 0
    retry_floor: int = 0
    object: str | None = None       # PUBLISH: the memory object (destination: ``space``)
    source_version: int = 0


_REQUEST_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Request)}


def new_request(kind: Kind, lineage: str, operation_key: str, sequence: int,
                **values: Any) -> Request:
    """``Request(kind, lineage, operation_key, sequence, **values)`` without the frozen
    dataclass's ``__init__`` (see :func:`_built`; the mutation path builds one per
    request); a name that is not a field raises ``TypeError`` as the constructor does."""
    merged = {**_REQUEST_DEFAULTS, "kind": kind, "lineage": lineage,
              "operation_key": operation_key, "sequence": sequence, **values}
    if len(merged) != len(_REQUEST_DEFAULTS):
        raise TypeError(f"unknown Request fields {sorted(set(merged) - set(_REQUEST_DEFAULTS))}")
    return _built(Request, merged)


def u64(value: int, name: str) -> int:
    if not 0 <= value < 1 << 64:
        raise errors.InvalidInput(f"{name} out of range", code=f"{name}_invalid", field=name)
    return value


def u32(value: int, name: str) -> int:
    if not 0 <= value < 1 << 32:
        raise errors.InvalidInput(f"{name} out of range", code=f"{name}_invalid", field=name)
    return value


def fill_request(req: Request) -> Any:
    """The native ``aotx_request`` for req (type-level checks only; C checks the rest),
    written in one ``pack_into`` (:data:`_REQUEST_PACK`, laid out from cffi's offsets)."""
    kind = int(req.kind)
    lineage = hex16(req.lineage, "lineage")
    operation_key = hex16(req.operation_key, "operation_key")
    sequence = u64(req.sequence, "sequence")
    ident = _ZERO16 if req.id is None else hex16(req.id, "id")
    if req.scope not in SCOPES:
        raise errors.InvalidInput(f"unknown scope {req.scope!r}", code="scope_invalid",
                                  field="scope")
    space = _ZERO16 if req.space is None else hex16(req.space, "space")
    participant = _ZERO16 if req.participant is None else hex16(req.participant,
                                                                 "participant")
    rights = rights_mask(req.permissions)
    conversation = _ZERO16 if req.conversation is None else hex16(req.conversation,
                                                                   "conversation")
    text = req.text.encode() if isinstance(req.text, str) else req.text
    if len(text) > MAX_TEXT_BYTES:
        raise errors.InvalidInput("text over 2048 bytes", code="text_invalid", field="text")
    model = req.model.encode()
    if len(model) > MAX_MODEL_NAME:
        raise errors.InvalidInput("model name over 128 bytes", code="model_invalid",
                                  field="model")
    max_output_tokens = u32(req.max_output_tokens, "max_output_tokens")
    pages = u32(req.pages, "pages")
    if not (math.isfinite(req.temperature) and math.isfinite(req.top_p)):
        raise errors.InvalidInput("temperature and top_p must be finite",
                                  code="sampling_invalid", field="temperature")
    if len(req.media) > MAX_MEDIA:
        raise errors.InvalidInput("at most 8 media rows", code="media_invalid", field="media")
    media: list[tuple[int, bytes]] = []
    for i, (mtype, sha) in enumerate(req.media):
        if mtype not in MEDIA_TYPES or len(sha) != 64:
            raise errors.InvalidInput(f"media[{i}] invalid", code="media_invalid", field="media")
        try:
            media.append((MEDIA_TYPES[mtype], bytes.fromhex(sha)))
        except ValueError:
            raise errors.InvalidInput(f"media[{i}].sha256 invalid", code="media_invalid",
                                      field="media") from None
    target_sequence = u64(req.target_sequence, "target_sequence")
    retry_floor = u64(req.retry_floor, "retry_floor")
    obj = _ZERO16 if req.object is None else hex16(req.object, "object")
    source_version = u64(req.source_version, "source_version")
    c = ffi.new("aotx_request *")
    _REQUEST_PACK.pack_into(
        ffi.buffer(c), 0, kind, lineage, operation_key, sequence, req.id is not None, ident,
        SCOPES.index(req.scope), space, participant, rights, conversation, len(text), text,
        len(model), model, max_output_tokens, pages, float(req.temperature),
        float(req.top_p), len(media), b"", target_sequence, retry_floor, obj, source_version)
    for i, (mtype_code, digest) in enumerate(media):
        c.media[i].type = mtype_code
        ffi.memmove(c.media[i].sha256, digest, 32)
    return c


_ZERO16 = bytes(16)


def encode_canonical(req: Request) -> bytes:
    """The canonical operation bytes of req (docs/formats/device.md)."""
    c = fill_request(req)
    n = ffi.new("uint32_t *")
    rc = int(lib.aotx_canonical_encode(c, ffi.NULL, 0, n))
    if rc != lib.AOTX_E_BUFFER_TOO_SMALL:
        check(rc)
    buf = ffi.new("uint8_t[]", n[0])
    check(lib.aotx_canonical_encode(c, buf, n[0], n))
    return bytes(ffi.buffer(buf, n[0]))


def decode_canonical(data: bytes) -> Request:
    c = ffi.new("aotx_request *")
    check(lib.aotx_canonical_decode(data, len(data), c))
    kind = Kind(c.kind)
    fields: dict[str, Any] = {}
    if kind in (Kind.SPACE_CREATE, Kind.CONVERSATION_CREATE):
        fields["id"] = hex_of(c.id)
    if kind == Kind.SPACE_CREATE:
        fields["scope"] = SCOPES[c.scope]
    if kind in (Kind.MEMBER_SET, Kind.CONVERSATION_CREATE, Kind.PUBLISH):
        fields["space"] = hex_of(c.space)
    if kind == Kind.PUBLISH:
        fields["object"] = hex_of(c.object)
        fields["source_version"] = int(c.source_version)
    if kind == Kind.MEMBER_SET:
        fields["participant"] = hex_of(c.participant)
        fields["permissions"] = rights_names(c.rights)
    if kind == Kind.INPUT:
        fields.update(
            conversation=hex_of(c.conversation),
            text=bytes(ffi.buffer(c.text, c.text_len)).decode(),
            model=bytes(ffi.buffer(c.model, c.model_len)).decode(),
            max_output_tokens=c.max_output_tokens, pages=c.pages,
            temperature=c.temperature, top_p=c.top_p,
            media=tuple((("", "image", "audio")[c.media[i].type], hex_of(c.media[i].sha256, 32))
                        for i in range(c.n_media)))
    if kind == Kind.CANCEL:
        fields["target_sequence"] = c.target_sequence
    if kind == Kind.RETIRE:
        fields["retry_floor"] = c.retry_floor
    return Request(kind=kind, lineage=hex_of(c.lineage), operation_key=hex_of(c.operation_key),
                   sequence=c.sequence, **fields)


# ---- views --------------------------------------------------------------


@dataclass(frozen=True)
class Receipt:
    op_id: str
    kind: Kind
    status: str
    participant: str
    sequence: int | None            # None for another participant's receipt
    operation_key: str | None       # None for another participant's receipt
    retry: bool
    device_committed: bool
    admission_saved: bool
    terminal_saved: bool
    cancel_requested: bool
    admission_number: int
    admission_record: int
    terminal_record: int | None
    resource_id: str
    result_len: int
    input_tokens: int
    output_tokens: int
    save: SaveState                 # the journal's state when read
    saved_by: SaveId | None = None  # the save that acknowledged the admission (None: unsaved)
    input_index: int = 0            # INPUT: 1-based place in its conversation's input order
    finish: str | None = None       # null until terminal (vocab.finish_of)
    leased: bool = False            # INPUT: an execution lease names it
    lease_revision: int = 0         # that lease's revision (docs/formats/device.md)
    lease_mode: int = 0             # its row's retention mode

    @property
    def terminal(self) -> bool:
        return self.status not in ("admitted", "running")


@dataclass(frozen=True)
class Participant:
    key: str
    registered: bool
    next_sequence: int | None       # None (JSON null) for a foreign participant
    retry_floor: int | None


@dataclass(frozen=True)
class Space:
    id: str
    owner: str
    scope: str
    rights: tuple[str, ...]         # the caller's effective rights
    admission_number: int
    conversations: int


@dataclass(frozen=True)
class Member:
    participant: str
    rights: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    id: str
    space: str
    creator: str
    admission_number: int
    inputs: int


@dataclass(frozen=True)
class Usage:
    participants: int
    spaces: int
    conversations: int
    members: int
    receipts: int
    admissions: int
    memory: int = 0


@dataclass(frozen=True)
class MemoryRow:
    """One 128-byte memory row (docs/formats/device.md, "Memory rows"); ids are 32 hex."""

    object: str
    version: int
    kind: str                       # text | embedding | interpretation (mode 2)
    scope: str                      # the owning space's scope
    mode: int                       # retention mode
    origin: str                     # retained (from an input) | published (a copy)
    byte_length: int
    owner: str                      # the memory owner: the owning space's id
    room: str | None                # the room space id (room scope), else None
    source: str                     # text: the input's operation id; embedding: the text object
    actor: str                      # principal key of the input's participant
    conversation: str
    admission_number: int
    dim: int                        # embedding: float32 count; text: 0


def floats(values: Any) -> tuple[Any, int]:
    """A cffi float[] of ``values`` and its length."""
    vec = [float(x) for x in values]
    buf = ffi.new("float[]", max(len(vec), 1))
    for i, x in enumerate(vec):
        buf[i] = x
    return buf, len(vec)


def memory_row_of(v: Any) -> MemoryRow:
    room = hex_of(v.room)
    return MemoryRow(object=hex_of(v.object), version=int(v.version),
                     kind=MEMORY_KINDS[v.kind] if v.kind < len(MEMORY_KINDS) else str(v.kind),
                     scope=SCOPES[v.scope], mode=int(v.mode),
                     origin={1: "retained", 2: "published"}.get(int(v.origin), str(v.origin)),
                     byte_length=int(v.byte_length),
                     owner=hex_of(v.owner), room=None if room == "0" * 32 else room,
                     source=hex_of(v.source), actor=hex_of(v.actor),
                     conversation=hex_of(v.conversation),
                     admission_number=int(v.admission_number), dim=int(v.dim))


_STRUCT_CODES = {"uint8_t": "B", "int8_t": "b", "uint16_t": "H", "int16_t": "h",
                 "uint32_t": "I", "int32_t": "i", "uint64_t": "Q", "int64_t": "q",
                 "float": "f", "double": "d"}


def _layout(ctype: Any, prefix: str = "") -> tuple[str, list[str]]:
    """A native struct as a :mod:`struct` format (native byte order, explicit padding)
    and the names of its values in order (a nested struct's as ``outer.inner``), from
    cffi's own field offsets: the whole view is read in one ``unpack``."""
    fmt, names, at = "", [], 0
    for name, f in ctype.fields:
        if f.offset > at:
            fmt += f"{f.offset - at}x"
        t = f.type
        if t.kind == "struct":
            inner, inner_names = _layout(t, f"{prefix}{name}.")
            fmt += inner
            names += inner_names
        elif t.kind == "array":   # bytes (an array of structs too: raw, zeros)
            fmt += f"{ffi.sizeof(t)}s"
            names.append(prefix + name)
        else:
            fmt += _STRUCT_CODES[t.cname]
            names.append(prefix + name)
        at = f.offset + ffi.sizeof(t)
    if ffi.sizeof(ctype) > at:
        fmt += f"{ffi.sizeof(ctype) - at}x"
    return fmt, names


def _unpacker(cname: str) -> tuple[struct.Struct, tuple[str, ...]]:
    fmt, names = _layout(ffi.typeof(cname))
    packed = struct.Struct("=" + fmt)
    if packed.size != ffi.sizeof(cname):   # pragma: no cover - a layout cffi disagrees on
        raise ImportError(f"{cname}: struct layout {packed.size} != {ffi.sizeof(cname)}")
    return packed, tuple(names)


_RECEIPT_VIEW, _RECEIPT_FIELDS = _unpacker("aotx_receipt_view")
_REQUEST_PACK, _REQUEST_FIELDS = _unpacker("aotx_request")
if _REQUEST_FIELDS != (   # the order fill_request packs in (a field added to the C request fails)
        "kind", "lineage", "operation_key", "sequence", "has_id", "id", "scope", "space",
        "participant", "rights", "conversation", "text_len", "text", "model_len", "model",
        "max_output_tokens", "pages", "temperature", "top_p", "n_media", "media",
        "target_sequence", "retry_floor", "object", "source_version"):   # pragma: no cover
    raise ImportError(f"aotx_request fields changed: {_REQUEST_FIELDS}")
_KIND_OF = {int(k): k for k in Kind}
_NO_RECORD = 2**64 - 1


#: the view's values receipt_of reads, in this order (a name the view lacks fails import)
_RECEIPT_PICK = operator.itemgetter(*(_RECEIPT_FIELDS.index(name) for name in (
    "op_id", "kind", "status", "foreign", "retry", "device_committed", "admission_saved",
    "terminal_saved", "cancel_requested", "participant", "operation_key", "sequence",
    "admission_number", "admission_record", "terminal_record", "resource_id", "result_len",
    "input_tokens", "output_tokens", "saved_records", "pending_bytes", "file_incarnation",
    "generation", "boot", "commit_digest", "disk_error", "hold", "admission_save_known",
    "finish", "leased", "lease_revision", "lease_mode", "admission_save.file_incarnation",
    "admission_save.generation", "admission_save.boot", "admission_save.commit_records",
    "admission_save.commit_digest", "input_index")))


def _built(cls: type[_T], values: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` holding ``values`` (every field, in
    field order), made without its generated ``__init__``, which sets each field through
    ``object.__setattr__`` (a receipt's 25: 3 us, twice per mutation).  The same object
    as ``cls(**values)``: tests/test_device.py checks :func:`receipt_of` against the
    constructors."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    return obj


def receipt_of(v: Any) -> Receipt:
    """The native ``aotx_receipt_view`` ``v`` as a :class:`Receipt` (one ``unpack``)."""
    (op_id, kind, status, foreign, retry, device_committed, admission_saved, terminal_saved,
     cancel_requested, participant, operation_key, sequence, admission_number,
     admission_record, terminal_record, resource_id, result_len, input_tokens,
     output_tokens, saved_records, pending_bytes, file_incarnation, generation, boot,
     commit_digest, disk_error, hold, save_known, finish, leased, lease_revision, lease_mode,
     save_incarnation, save_generation, save_boot, save_records, save_digest,
     input_index) = _RECEIPT_PICK(_RECEIPT_VIEW.unpack(ffi.buffer(v)))
    status_name = STATUSES[status]
    return _built(Receipt, {
        "op_id": op_id.hex(), "kind": _KIND_OF.get(kind) or Kind(kind), "status": status_name,
        "participant": participant.hex(), "sequence": None if foreign else sequence,
        "operation_key": None if foreign else operation_key.hex(), "retry": retry != 0,
        "device_committed": device_committed != 0, "admission_saved": admission_saved != 0,
        "terminal_saved": terminal_saved != 0, "cancel_requested": cancel_requested != 0,
        "admission_number": admission_number, "admission_record": admission_record,
        "terminal_record": None if terminal_record == _NO_RECORD else terminal_record,
        "resource_id": resource_id.hex(), "result_len": result_len,
        "input_tokens": input_tokens, "output_tokens": output_tokens,
        "save": _built(SaveState, {
            "saved_records": saved_records, "pending_bytes": pending_bytes,
            "file_incarnation": file_incarnation, "generation": generation, "boot": boot,
            "commit_digest": commit_digest, "disk_error": disk_error, "hold": hold}),
        "saved_by": _built(SaveId, {
            "file_incarnation": save_incarnation, "generation": save_generation,
            "boot": save_boot, "commit_records": save_records,
            "commit_digest": save_digest}) if save_known else None,
        "input_index": input_index, "finish": finish_of(status_name, finish),
        "leased": leased != 0, "lease_revision": lease_revision, "lease_mode": lease_mode})


def participant_of(v: Any) -> Participant:
    """The native ``aotx_participant_view`` ``v`` (a foreign one: counters null)."""
    visible = bool(v.counters_visible)
    return Participant(key=hex_of(v.key), registered=bool(v.registered),
                       next_sequence=int(v.next_sequence) if visible else None,
                       retry_floor=int(v.retry_floor) if visible else None)


def member_of(v: Any) -> Member:
    return Member(participant=hex_of(v.participant), rights=rights_names(v.rights))


def usage_of(u: Any) -> Usage:
    return Usage(participants=u.participants, spaces=u.spaces,
                 conversations=u.conversations, members=u.members, receipts=u.receipts,
                 admissions=int(u.admissions), memory=int(u.memory))


def space_of(v: Any) -> Space:
    return Space(id=hex_of(v.id), owner=hex_of(v.owner), scope=SCOPES[v.scope],
                 rights=rights_names(v.rights), admission_number=int(v.admission_number),
                 conversations=int(v.conversations))


def conversation_of(v: Any) -> Conversation:
    return Conversation(id=hex_of(v.id), space=hex_of(v.space), creator=hex_of(v.creator),
                        admission_number=int(v.admission_number), inputs=int(v.inputs))


LEASE_HEADER = 8
LEASE_ROW = 40          # revisions 2..5
LEASE_ROW_V1 = 32       # revisions 0 and 1 (read on recovery only)
LEASE_MAX_ROWS = 256
OUTPUT_HEADER = 32      # version 1 (read on recovery only)
OUTPUT_HEADER_V2 = 40   # version 2: + the input's token counts so far


@dataclass(frozen=True)
class LeaseRow:
    """One execution lease row (docs/formats/device.md, "Lease transfer")."""

    request_index: int
    slot: int
    sequence: int
    actor: str              # 32 hex digits
    mode: int               # the input's retention mode (0: nothing retained)
    reserved: int = 0


def encode_lease(revision: int, rows: list[LeaseRow]) -> bytes:
    """A lease transfer's bytes (revisions 0 and 1: 32-byte rows without mode)."""
    out = bytearray(struct.pack("<II", len(rows), revision))
    for r in rows:
        out += struct.pack("<IIQ", r.request_index, r.slot, r.sequence) + bytes.fromhex(r.actor)
        if revision >= 2:
            out += struct.pack("<II", r.mode, r.reserved)
    return bytes(out)


def decode_lease(data: bytes) -> tuple[int, list[LeaseRow]]:
    """(revision, rows) of a lease transfer; ValueError when the length does not fit
    the row count."""
    n, revision = struct.unpack_from("<II", data, 0)
    size = LEASE_ROW if revision >= 2 else LEASE_ROW_V1
    if len(data) != LEASE_HEADER + n * size:
        raise ValueError(f"lease of {n} rows cannot be {len(data)} bytes")
    rows = []
    for i in range(n):
        at = LEASE_HEADER + i * size
        index, slot, seq = struct.unpack_from("<IIQ", data, at)
        mode, reserved = struct.unpack_from("<II", data, at + 32) if revision >= 2 \
            else (revision, 0)
        rows.append(LeaseRow(index, slot, seq, data[at + 16:at + 32].hex(), mode, reserved))
    return revision, rows


def lease_row_of(v: Any) -> LeaseRow:
    """The native ``aotx_lease_row`` ``v``."""
    return LeaseRow(int(v.request_index), int(v.slot), int(v.sequence), hex_of(v.actor),
                    int(v.mode), int(v.reserved))


def fill_lease_rows(rows: list[LeaseRow]) -> Any:
    """The native ``aotx_lease_row[]`` of ``rows`` (each value range-checked)."""
    c = ffi.new("aotx_lease_row[]", max(1, len(rows)))
    for i, r in enumerate(rows):
        c[i].request_index = u32(r.request_index, "request_index")
        c[i].slot = u32(r.slot, "slot")
        c[i].sequence = u64(r.sequence, "sequence")
        ffi.memmove(c[i].actor, hex16(r.actor, "actor"), 16)
        c[i].mode = u32(r.mode, "mode")
        c[i].reserved = u32(r.reserved, "reserved")
    return c
