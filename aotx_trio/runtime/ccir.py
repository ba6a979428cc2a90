"""The complete runtime file (``.aotxccir``): reader and writer (docs/formats/ccir.md).

A fixed 128-byte header, a table of 256-byte component entries right after it,
then the component extents, each starting on a 4096-byte boundary so the engine
can mmap a GGUF component in place.  Everything is little-endian; the header and
the table are each covered by a CRC-32C, every extent by a SHA-256 in its entry.

The file holds no timestamps, no absolute paths and no credentials: the same
components and profile always give the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import struct
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aotx_trio._fs import atomic_file
from aotx_trio.errors import FormatError, InvalidInput, NotFound, UnsupportedProfile

MAGIC = b"AOTXCCIR"
FORMAT_VERSION = 1
HEADER_SIZE = 128
ENTRY_SIZE = 256
ALIGN = 4096
NAME_MAX = 200
MAX_COMPONENTS = 4096

KIND_TEXT_MODEL_GGUF = 1
KIND_EMBEDDING_FILE = 2
KIND_NAMES = {KIND_TEXT_MODEL_GGUF: "text_model_gguf", KIND_EMBEDDING_FILE: "embedding_file"}

#: Required profile bits this reader understands.
PROFILE_SHARED = 1 << 0
#: The file may hold a state checkpoint after its extents (docs/formats/checkpoint.md).
PROFILE_CHECKPOINT = 1 << 1
KNOWN_REQUIRED = PROFILE_SHARED | PROFILE_CHECKPOINT
#: Optional profile bits this reader understands (none defined yet).
KNOWN_OPTIONAL = 0
PROFILE_NAMES = {0: "shared_state", 1: "checkpoint"}

#: Component flags (the entry's u32 at offset 4): a text model with the automatic-memory
#: capability (shared memory retention mode 2, runtime/memory.py).
FLAG_AUTOMATIC_MEMORY = 1 << 0
#: A text model whose KV pages hold IEEE binary16 K/V (``Engine.load(kv_f16=True)``); an
#: entry without it keeps float32 KV.  ``aotx pack`` sets it on the text models it adds.
FLAG_KV_F16 = 1 << 1
#: The flag bits each kind may carry; any other bit is refused at the entry's offset 4.
KNOWN_FLAGS = {KIND_TEXT_MODEL_GGUF: FLAG_AUTOMATIC_MEMORY | FLAG_KV_F16,
               KIND_EMBEDDING_FILE: 0}
FLAG_NAMES = {FLAG_AUTOMATIC_MEMORY: "automatic_memory", FLAG_KV_F16: "kv_f16"}

# magic, version, header_length, required, optional, lineage, count, entry_size,
# table_offset, file_length, table_crc, alignment, checkpoint_offset, checkpoint_length,
# reserved[28]   (header CRC follows)
_HEADER = struct.Struct("<8sIIQQ16sIIQQIIQQ28s")
# kind, name_length, flags, offset, length, sha256, name[200]
_ENTRY = struct.Struct("<HHIQQ32s200s")
assert _HEADER.size == HEADER_SIZE - 4
assert _ENTRY.size == ENTRY_SIZE

_CHUNK = 1 << 20


# ---------------------------------------------------------------------------
# CRC-32C (Castagnoli, reflected, init/final xor 0xFFFFFFFF): header and table only.

def _crc_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of ``data`` (``crc32c(b"123456789") == 0xE3069283``)."""
    c = crc ^ 0xFFFFFFFF
    t = _CRC_TABLE
    for b in data:
        c = t[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def align_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


# ---------------------------------------------------------------------------
# Data

@dataclass(frozen=True)
class Profile:
    required: int
    optional: int

    @property
    def shared(self) -> bool:
        return bool(self.required & PROFILE_SHARED)

    @property
    def unknown_optional(self) -> int:
        return self.optional & ~KNOWN_OPTIONAL


@dataclass(frozen=True)
class Component:
    kind: int
    name: str
    offset: int
    length: int
    sha256: bytes
    flags: int = 0                # FLAG_* bits (KNOWN_FLAGS of its kind)

    @property
    def automatic_memory(self) -> bool:
        return bool(self.flags & FLAG_AUTOMATIC_MEMORY)

    @property
    def kv_f16(self) -> bool:
        return bool(self.flags & FLAG_KV_F16)

    @property
    def kind_name(self) -> str:
        return KIND_NAMES[self.kind]

    @property
    def sha256_hex(self) -> str:
        return self.sha256.hex()


@dataclass(frozen=True)
class Header:
    format_version: int
    profile: Profile
    lineage: bytes
    component_count: int
    table_offset: int
    file_length: int
    table_crc32c: int
    checkpoint_offset: int = 0   # 0: no checkpoint (docs/formats/checkpoint.md)
    checkpoint_length: int = 0

    @property
    def table_end(self) -> int:
        return self.table_offset + self.component_count * ENTRY_SIZE


def sort_key(kind: int, name: str) -> tuple[int, bytes]:
    return (kind, name.encode("utf-8"))


def validate_name(name: str, field: str = "name") -> bytes:
    """The UTF-8 bytes of a component name, or InvalidInput naming the rule broken."""
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= NAME_MAX:
        raise InvalidInput(f"component name {name!r} must be 1..{NAME_MAX} UTF-8 bytes",
                           code="component_name_invalid", field=field)
    parts = name.split("/")
    if "\x00" in name or "\\" in name or any(p in ("", ".", "..") for p in parts):
        raise InvalidInput(f"component name {name!r} must be a relative POSIX path "
                           "without empty, '.' or '..' parts, NUL or backslash",
                           code="component_name_invalid", field=field)
    return raw


def layout(entries: Sequence[tuple[int, str, int]]) -> tuple[list[int], int]:
    """Offsets for (kind, name, length) entries already in table order, and the file length."""
    cursor = HEADER_SIZE + len(entries) * ENTRY_SIZE
    offsets = []
    for _kind, _name, length in entries:
        cursor = align_up(cursor)
        offsets.append(cursor)
        cursor += length
    return offsets, cursor


def encode_header(*, required: int, optional: int, lineage: bytes, count: int,
                  file_length: int, table_crc: int, checkpoint_offset: int = 0,
                  checkpoint_length: int = 0) -> bytes:
    if len(lineage) != 16:
        raise ValueError("lineage is 16 bytes")
    body = _HEADER.pack(MAGIC, FORMAT_VERSION, HEADER_SIZE, required, optional, lineage,
                        count, ENTRY_SIZE, HEADER_SIZE, file_length, table_crc, ALIGN,
                        checkpoint_offset, checkpoint_length, bytes(28))
    return body + struct.pack("<I", crc32c(body))


def encode_table(components: Sequence[Component]) -> bytes:
    out = bytearray()
    for c in components:
        raw = validate_name(c.name)
        if c.flags & ~KNOWN_FLAGS[c.kind]:
            raise ValueError(f"component {c.name!r}: flags {c.flags:#x} not allowed")
        out += _ENTRY.pack(c.kind, len(raw), c.flags, c.offset, c.length, c.sha256,
                           raw.ljust(NAME_MAX, b"\0"))
    return bytes(out)


# ---------------------------------------------------------------------------
# Reader

def _fail(message: str, offset: int, code: str = "ccir_corrupt",
          component: str | None = None) -> FormatError:
    text = f"{message} (at byte offset {offset})"
    if component is None:
        return FormatError(text, code=code, offset=offset)
    return FormatError(text, code=code, offset=offset, component=component)


def _parse_header(raw: bytes, size: int) -> Header:
    if raw[:8] != MAGIC:
        raise _fail("not a complete runtime file: bad magic", 0, "ccir_foreign")
    (_magic, version, header_length, required, optional, lineage, count, entry_size,
     table_offset, file_length, table_crc, alignment, ck_offset, ck_length,
     reserved) = _HEADER.unpack_from(raw)
    if version != FORMAT_VERSION:
        raise _fail(f"format version {version} is not supported (this reader knows "
                    f"{FORMAT_VERSION})", 8, "ccir_version")
    if header_length != HEADER_SIZE:
        raise _fail(f"header length {header_length} is not {HEADER_SIZE}", 12)
    (stored_crc,) = struct.unpack_from("<I", raw, HEADER_SIZE - 4)
    if crc32c(raw[:HEADER_SIZE - 4]) != stored_crc:
        raise _fail("header CRC-32C mismatch", HEADER_SIZE - 4)
    unknown = required & ~KNOWN_REQUIRED
    if unknown:
        bit = (unknown & -unknown).bit_length() - 1
        raise UnsupportedProfile(
            f"the file requires profile bit {bit}, which this reader does not support "
            f"(at byte offset 16)", offset=16, bit=bit)
    shared = bool(required & PROFILE_SHARED)
    if shared != any(lineage):
        what = "a shared profile with a zero lineage" if shared else \
            "a lineage without the shared profile"
        raise _fail(f"header holds {what}", 32)
    ckpt = bool(required & PROFILE_CHECKPOINT)
    checks = [
        (ckpt or not (ck_offset or ck_length), 80,
         "reserved header bytes are not zero"),
        (bool(ck_offset) == bool(ck_length) and ck_offset % ALIGN == 0
         and (not ck_length or ck_offset + ck_length == file_length), 80,
         f"checkpoint at {ck_offset} of {ck_length} bytes does not end the file "
         f"({file_length} bytes)"),
        (count <= MAX_COMPONENTS, 48, f"component count {count} over {MAX_COMPONENTS}"),
        (entry_size == ENTRY_SIZE, 52, f"table entry size {entry_size} is not {ENTRY_SIZE}"),
        (table_offset == HEADER_SIZE, 56, f"table offset {table_offset} is not {HEADER_SIZE}"),
        (alignment == ALIGN, 76, f"extent alignment {alignment} is not {ALIGN}"),
        (table_offset + count * ENTRY_SIZE <= file_length, 64,
         f"file length {file_length} ends inside the component table"),
        (not any(reserved), 80, "reserved header bytes are not zero"),
    ]
    for ok, off, message in checks:
        if not ok:
            raise _fail(message, off)
    # With the checkpoint profile, bytes past file_length are an unfinished (or
    # superseded) checkpoint write: ignored, cut by the next checkpoint write.
    if file_length != size and not (ckpt and size > file_length):
        off = min(size, file_length)
        raise _fail(f"file is {size} bytes but its header says {file_length}", off,
                    "ccir_truncated" if size < file_length else "ccir_corrupt")
    return Header(version, Profile(required, optional), lineage, count, table_offset,
                  file_length, table_crc, ck_offset, ck_length)


def _parse_table(table: bytes, header: Header) -> list[Component]:
    if crc32c(table) != header.table_crc32c:
        raise _fail("component table CRC-32C mismatch", header.table_offset)
    components: list[Component] = []
    cursor = header.table_end
    seen: set[str] = set()
    prev_key: tuple[int, bytes] | None = None
    for i in range(header.component_count):
        base = header.table_offset + i * ENTRY_SIZE
        kind, name_len, flags, offset, length, digest, name_raw = \
            _ENTRY.unpack_from(table, i * ENTRY_SIZE)
        if kind not in KIND_NAMES:
            raise _fail(f"component {i} has unknown kind {kind}", base)
        if flags & ~KNOWN_FLAGS[kind]:
            raise _fail(f"component {i} has flags {flags:#x} this reader does not know",
                        base + 4)
        if any(name_raw[name_len:]) or not 1 <= name_len <= NAME_MAX:
            raise _fail(f"component {i} has a bad name length or nonzero padding", base + 2)
        try:
            name = name_raw[:name_len].decode("utf-8")
            validate_name(name)
        except (UnicodeDecodeError, InvalidInput) as exc:
            raise _fail(f"component {i} has an invalid name", base + 56) from exc
        key = sort_key(kind, name)
        if name in seen or (prev_key is not None and key <= prev_key):
            raise _fail(f"component {i} ({name!r}) is duplicated or out of order", base + 56)
        seen.add(name)
        prev_key = key
        expected = align_up(cursor)
        if offset != expected:
            raise _fail(f"component {i} ({name!r}) offset {offset} is not {expected}", base + 8)
        if offset + length > header.file_length:
            raise _fail(f"component {i} ({name!r}) runs past the end of the file", base + 16)
        cursor = offset + length
        components.append(Component(kind, name, offset, length, digest, flags))
    if header.checkpoint_length:
        if header.checkpoint_offset < align_up(cursor):
            raise _fail(f"checkpoint offset {header.checkpoint_offset} is inside the "
                        f"extents (they end at {cursor})", 80)
    elif cursor != header.file_length:
        raise _fail(f"file length {header.file_length} is not the end of the last extent "
                    f"({cursor})", 64)
    return components


def _progress(total: int, desc: str, enabled: bool | None) -> contextlib.AbstractContextManager[
        Callable[[int], object]]:
    """A tqdm byte counter on a TTY (or when asked), else a no-op callback."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return contextlib.nullcontext(lambda _n: None)
    from tqdm import tqdm

    @contextlib.contextmanager
    def bar() -> Iterator[Callable[[int], object]]:
        with tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                  file=sys.stderr, leave=False) as t:
            yield t.update

    return bar()


def hash_range(f: BinaryIO, offset: int, length: int,
               update: Callable[[int], object] = lambda _n: None,
               sink: Callable[[bytes], object] | None = None) -> bytes:
    """SHA-256 of ``length`` bytes at ``offset``; each block also goes to ``sink``."""
    f.seek(offset)
    h = hashlib.sha256()
    left = length
    while left:
        block = f.read(min(_CHUNK, left))
        if not block:
            raise _fail(f"file ends inside an extent ({left} bytes missing)", f.tell(),
                        "ccir_truncated")
        h.update(block)
        if sink is not None:
            sink(block)
        left -= len(block)
        update(len(block))
    return h.digest()


class RuntimeFile:
    """A validated complete runtime file (header and table; extents on demand)."""

    def __init__(self, path: Path, header: Header, components: list[Component]) -> None:
        self.path = path
        self.header = header
        self.components = components

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> RuntimeFile:
        p = Path(path)
        with p.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            raw = f.read(HEADER_SIZE)
            if len(raw) < HEADER_SIZE:
                if raw[:8] != MAGIC[:len(raw[:8])] or not raw:
                    raise _fail("not a complete runtime file: bad magic", 0, "ccir_foreign")
                raise _fail(f"file is {size} bytes; the header needs {HEADER_SIZE}", size,
                            "ccir_truncated")
            header = _parse_header(raw, size)
            table = f.read(header.component_count * ENTRY_SIZE)
        components = _parse_table(table, header)
        return cls(p, header, components)

    # -- properties -------------------------------------------------------
    @property
    def profile(self) -> Profile:
        return self.header.profile

    @property
    def shared(self) -> bool:
        return self.header.profile.shared

    @property
    def lineage(self) -> str:
        """32 lowercase hex digits (all zero without the shared profile)."""
        return self.header.lineage.hex()

    @property
    def components_end(self) -> int:
        """Where the last extent (or the table) ends: a checkpoint starts at or after
        ``align_up`` of it."""
        ends = [c.offset + c.length for c in self.components]
        return max([self.header.table_end, *ends])

    @property
    def text_models(self) -> list[Component]:
        return [c for c in self.components if c.kind == KIND_TEXT_MODEL_GGUF]

    @property
    def embedding_files(self) -> list[Component]:
        return [c for c in self.components if c.kind == KIND_EMBEDDING_FILE]

    def component(self, name: str) -> Component:
        for c in self.components:
            if c.name == name:
                return c
        raise NotFound(f"the runtime file has no component {name!r}",
                       code="component_not_found", name=name)

    # -- extents ----------------------------------------------------------
    def component_view(self, name: str) -> tuple[Path, int, int]:
        """(path, offset, length) of a component, for mmap or a native loader."""
        c = self.component(name)
        return self.path, c.offset, c.length

    def read_component(self, name: str) -> bytes:
        """The verified bytes of one (small) component."""
        c = self.component(name)
        parts: list[bytes] = []
        with self.path.open("rb") as f:
            digest = hash_range(f, c.offset, c.length, sink=parts.append)
        if digest != c.sha256:
            raise _fail(f"component {name!r} does not match its SHA-256", c.offset,
                        "ccir_digest_mismatch", component=name)
        return b"".join(parts)

    def verify(self, progress: bool | None = None) -> None:
        """Re-hash every extent and check the zero padding between them."""
        total = sum(c.length for c in self.components)
        with self.path.open("rb") as f, _progress(total, "verify", progress) as update:
            cursor = self.header.table_end
            for c in self.components:
                f.seek(cursor)
                pad = f.read(c.offset - cursor)
                if any(pad):
                    bad = cursor + next(i for i, b in enumerate(pad) if b)
                    raise _fail("nonzero padding before an extent", bad)
                if hash_range(f, c.offset, c.length, update) != c.sha256:
                    raise _fail(f"component {c.name!r} does not match its SHA-256", c.offset,
                                "ccir_digest_mismatch", component=c.name)
                cursor = c.offset + c.length

    def extract_embedding(self, dest_dir: str | os.PathLike[str]) -> Path:
        """Write the embedding files (verified) under ``dest_dir``; returns it."""
        files = self.embedding_files
        if not files:
            raise NotFound("the runtime file has no embedding model",
                           code="component_not_found", name="embedding")
        dest = Path(dest_dir)
        dest.mkdir(parents=True, exist_ok=True)
        with self.path.open("rb") as f:
            for c in files:
                target = dest.joinpath(*c.name.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(target) as out:
                    digest = hash_range(f, c.offset, c.length, sink=out.write)
                    if digest != c.sha256:
                        raise _fail(f"component {c.name!r} does not match its SHA-256",
                                    c.offset, "ccir_digest_mismatch", component=c.name)
        return dest


# ---------------------------------------------------------------------------
# Writer

@dataclass(frozen=True)
class Source:
    """Where a component's bytes come from: a whole file, or an extent of a runtime file."""

    kind: int
    name: str
    path: Path
    offset: int
    length: int
    sha256: bytes | None = None   # known digest (extent of an existing runtime file)
    flags: int = 0                # the entry's FLAG_* bits


def write_runtime(path: str | os.PathLike[str], sources: Sequence[Source], *,
                  required: int, optional: int, lineage: bytes,
                  progress: bool | None = None) -> RuntimeFile:
    """Write a complete runtime file atomically (temp file, fsync, rename).

    ``sources`` may come in any order; they are sorted by (kind, name).  A source
    that carries a known digest is checked while it is copied.  Nothing is left
    behind if anything fails.
    """
    target = Path(path)
    srcs = sorted(sources, key=lambda s: sort_key(s.kind, s.name))
    names = [s.name for s in srcs]
    for s in srcs:
        validate_name(s.name)
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise InvalidInput(f"two components are named {dup!r}", code="component_name_invalid",
                           field="name", name=dup)
    if len(srcs) > MAX_COMPONENTS:
        raise InvalidInput(f"{len(srcs)} components is over {MAX_COMPONENTS}",
                           code="component_count_invalid", field="components")
    if required & ~KNOWN_REQUIRED or bool(required & PROFILE_SHARED) != any(lineage):
        raise ValueError("profile and lineage disagree")
    offsets, file_length = layout([(s.kind, s.name, s.length) for s in srcs])
    target.parent.mkdir(parents=True, exist_ok=True)
    total = sum(s.length for s in srcs)
    with atomic_file(target) as out, _progress(total, "pack", progress) as update:
        components: list[Component] = []
        for s, off in zip(srcs, offsets, strict=True):
            out.seek(off)
            with s.path.open("rb") as f:
                digest = hash_range(f, s.offset, s.length, update, sink=out.write)
            if s.sha256 is not None and digest != s.sha256:
                raise _fail(f"component {s.name!r} does not match its SHA-256", s.offset,
                            "ccir_digest_mismatch", component=s.name)
            if out.tell() != off + s.length:
                raise InvalidInput(f"{s.name!r} changed size while it was packed",
                                   code="component_changed", field="name", name=s.name)
            components.append(Component(s.kind, s.name, off, s.length, digest, s.flags))
        out.truncate(file_length)
        table = encode_table(components)
        out.seek(HEADER_SIZE)
        out.write(table)
        out.seek(0)
        out.write(encode_header(required=required, optional=optional, lineage=lineage,
                                count=len(components), file_length=file_length,
                                table_crc=crc32c(table)))
    return RuntimeFile.open(target)


def rewrite_header(rf: RuntimeFile, *, required: int, optional: int,
                   lineage: bytes) -> RuntimeFile:
    """Save a new profile/lineage in place: extents and table stay byte-identical.

    The 128-byte header lies inside the first sector and carries its own CRC, so
    the single write is either whole or refused by the next reader.
    """
    h = rf.header
    raw = encode_header(required=required, optional=optional, lineage=lineage,
                        count=h.component_count, file_length=h.file_length,
                        table_crc=h.table_crc32c, checkpoint_offset=h.checkpoint_offset,
                        checkpoint_length=h.checkpoint_length)
    fd = os.open(rf.path, os.O_WRONLY)
    try:
        if os.pwrite(fd, raw, 0) != HEADER_SIZE:
            raise OSError(f"short header write to {rf.path}")
        os.fsync(fd)
    finally:
        os.close(fd)
    return RuntimeFile.open(rf.path)
