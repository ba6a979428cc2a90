"""The complete runtime file: byte layout, reader checks, writer atomicity."""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from pathlib import Path

import pytest

from aotx_trio.errors import FormatError, InvalidInput, NotFound, UnsupportedProfile
from aotx_trio.runtime import ccir
from aotx_trio.runtime.ccir import (
    KIND_EMBEDDING_FILE,
    KIND_TEXT_MODEL_GGUF,
    RuntimeFile,
    Source,
)

TINY_GGUF = bytes.fromhex("4747554603000000")
LINEAGE = bytes.fromhex("0123456789abcdef0123456789abcdef")


def _file(tmp: Path, name: str, data: bytes) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _src(kind: int, name: str, path: Path) -> Source:
    return Source(kind, name, path, 0, path.stat().st_size)


def _small(tmp: Path, *, shared: bool = False, name: str = "a.aotxccir") -> RuntimeFile:
    gguf = _file(tmp, "in/tiny.gguf", TINY_GGUF)
    cfg = _file(tmp, "in/config.json", b'{"hidden_size": 4}')
    pool = _file(tmp, "in/1_Pooling/config.json", b'{"pooling_mode_mean_tokens": true}')
    return ccir.write_runtime(tmp / name, [
        _src(KIND_EMBEDDING_FILE, "config.json", cfg),
        _src(KIND_TEXT_MODEL_GGUF, "tiny.gguf", gguf),
        _src(KIND_EMBEDDING_FILE, "1_Pooling/config.json", pool),
    ], required=ccir.PROFILE_SHARED if shared else 0, optional=0,
        lineage=LINEAGE if shared else bytes(16), progress=False)


def _reseal_header(raw: bytearray) -> None:
    """Recompute the header CRC after a test edits header fields (test-side forgery)."""
    struct.pack_into("<I", raw, 124, ccir.crc32c(bytes(raw[:124])))


def test_crc32c_check_value() -> None:
    assert ccir.crc32c(b"123456789") == 0xE3069283
    assert ccir.crc32c(b"") == 0


def test_worked_example_of_the_format_doc(tmp_path: Path) -> None:
    gguf = _file(tmp_path, "tiny.gguf", TINY_GGUF)
    rf = ccir.write_runtime(tmp_path / "w.aotxccir",
                            [_src(KIND_TEXT_MODEL_GGUF, "tiny.gguf", gguf)],
                            required=ccir.PROFILE_SHARED, optional=0, lineage=LINEAGE,
                            progress=False)
    raw = rf.path.read_bytes()
    assert len(raw) == 4104
    assert raw[:0x50] == bytes.fromhex(
        "414f545843434952010000008000000001000000000000000000000000000000"
        "0123456789abcdef0123456789abcdef01000000000100008000000000000000"
        "0810000000000000f8e29d5c00100000")
    assert raw[0x50:0x7C] == bytes(44)
    assert raw[0x7C:0x80] == bytes.fromhex("f3e6b9e8")
    assert raw[0x80:0x98] == bytes.fromhex("010009000000000000100000000000000800000000000000")
    assert raw[0x98:0xB8] == hashlib.sha256(TINY_GGUF).digest()
    assert raw[0xB8:0x180] == b"tiny.gguf".ljust(200, b"\0")
    assert raw[0x180:0x1000] == bytes(0x1000 - 0x180)
    assert raw[0x1000:] == TINY_GGUF
    # "Component flags": with automatic_memory only the flags word and the two CRCs differ
    flagged = ccir.write_runtime(
        tmp_path / "f.aotxccir", [Source(KIND_TEXT_MODEL_GGUF, "tiny.gguf", gguf, 0,
                                         len(TINY_GGUF), flags=ccir.FLAG_AUTOMATIC_MEMORY)],
        required=ccir.PROFILE_SHARED, optional=0, lineage=LINEAGE).path.read_bytes()
    assert flagged[0x84:0x88] == bytes([1, 0, 0, 0])
    assert [i for i in range(len(raw)) if raw[i] != flagged[i]] and \
        {i for i in range(len(raw)) if raw[i] != flagged[i]} <= \
        {0x84, *range(0x48, 0x4C), *range(0x7C, 0x80)}
    # ... and with kv_f16 (what `aotx pack` writes for a model it adds): 02 00 00 00,
    # table CRC 0x74d0b2d2, header CRC 0xd9d84f0d, the rest as above
    f16 = ccir.write_runtime(
        tmp_path / "h.aotxccir", [Source(KIND_TEXT_MODEL_GGUF, "tiny.gguf", gguf, 0,
                                         len(TINY_GGUF), flags=ccir.FLAG_KV_F16)],
        required=ccir.PROFILE_SHARED, optional=0, lineage=LINEAGE).path.read_bytes()
    assert f16[0x84:0x88] == bytes([2, 0, 0, 0])
    assert f16[0x48:0x4C] == bytes.fromhex("d2b2d074")
    assert f16[0x7C:0x80] == bytes.fromhex("0d4fd8d9")
    assert {i for i in range(len(raw)) if raw[i] != f16[i]} <= \
        {0x84, *range(0x48, 0x4C), *range(0x7C, 0x80)}


def test_round_trip(tmp_path: Path) -> None:
    rf = _small(tmp_path, shared=True)
    again = RuntimeFile.open(rf.path)
    assert again.shared and again.lineage == LINEAGE.hex()
    assert [(c.kind_name, c.name) for c in again.components] == [
        ("text_model_gguf", "tiny.gguf"),
        ("embedding_file", "1_Pooling/config.json"),
        ("embedding_file", "config.json"),
    ]
    for c in again.components:
        assert c.offset % 4096 == 0
    assert again.components[0].offset == 4096
    assert again.read_component("tiny.gguf") == TINY_GGUF
    assert again.component("config.json").sha256 == hashlib.sha256(b'{"hidden_size": 4}').digest()
    again.verify(progress=False)
    path, off, length = again.component_view("tiny.gguf")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[off:off + length] == TINY_GGUF
    out = again.extract_embedding(tmp_path / "emb")
    assert (out / "config.json").read_bytes() == b'{"hidden_size": 4}'
    assert (out / "1_Pooling" / "config.json").read_bytes() == \
        b'{"pooling_mode_mean_tokens": true}'
    assert sorted(p.name for p in out.rglob("*")) == ["1_Pooling", "config.json", "config.json"]
    with pytest.raises(NotFound) as info:
        again.component_view("nope.gguf")
    assert info.value.code == "component_not_found"


def test_unshared_file_has_zero_lineage(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    assert not rf.shared and rf.lineage == "0" * 32
    assert rf.path.read_bytes()[32:48] == bytes(16)


def test_every_truncation_is_refused_with_an_offset(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = rf.path.read_bytes()
    cut = tmp_path / "cut.aotxccir"
    for n in range(len(raw)):
        cut.write_bytes(raw[:n])
        with pytest.raises(FormatError) as info:
            RuntimeFile.open(cut)
        off = info.value.fields["offset"]
        assert isinstance(off, int) and 0 <= off <= n, (n, info.value.message)
        assert f"at byte offset {off}" in info.value.message
        if n >= ccir.HEADER_SIZE:
            assert info.value.code == "ccir_truncated" and off == n


def test_appended_bytes_are_refused(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    with rf.path.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert info.value.fields["offset"] == rf.header.file_length


def test_every_flipped_header_byte_is_refused(tmp_path: Path) -> None:
    rf = _small(tmp_path, shared=True)
    raw = rf.path.read_bytes()
    bad = tmp_path / "bad.aotxccir"
    for i in range(ccir.HEADER_SIZE):
        for mask in (0x01, 0x80):
            flipped = bytearray(raw)
            flipped[i] ^= mask
            bad.write_bytes(flipped)
            with pytest.raises(FormatError) as info:
                RuntimeFile.open(bad)
            off = info.value.fields["offset"]
            assert 0 <= off < ccir.HEADER_SIZE, (i, info.value.message)


def test_flipped_table_byte_is_refused_at_the_table(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = bytearray(rf.path.read_bytes())
    raw[ccir.HEADER_SIZE + 20] ^= 0x10
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert info.value.fields["offset"] == ccir.HEADER_SIZE


def test_flipped_extent_byte_fails_verify_at_its_extent(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    c = rf.component("config.json")
    raw = bytearray(rf.path.read_bytes())
    raw[c.offset + 3] ^= 0x01
    rf.path.write_bytes(raw)
    again = RuntimeFile.open(rf.path)  # header and table are intact
    with pytest.raises(FormatError) as info:
        again.verify(progress=False)
    assert info.value.code == "ccir_digest_mismatch"
    assert info.value.fields["offset"] == c.offset
    with pytest.raises(FormatError):
        again.read_component("config.json")
    with pytest.raises(FormatError):
        again.extract_embedding(tmp_path / "emb")
    assert not (tmp_path / "emb" / "config.json").exists()


def test_nonzero_padding_fails_verify(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = bytearray(rf.path.read_bytes())
    raw[4000] = 1
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path).verify(progress=False)
    assert info.value.fields["offset"] == 4000


def test_required_bit_from_the_future_is_refused(tmp_path: Path) -> None:
    rf = _small(tmp_path, shared=True)
    raw = bytearray(rf.path.read_bytes())
    (required,) = struct.unpack_from("<Q", raw, 16)
    struct.pack_into("<Q", raw, 16, required | 1 << 7)
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    with pytest.raises(UnsupportedProfile) as info:
        RuntimeFile.open(rf.path)
    assert info.value.code == "unsupported_profile"
    assert info.value.fields["bit"] == 7
    assert "bit 7" in info.value.message


def test_unknown_optional_bit_is_ignored(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = bytearray(rf.path.read_bytes())
    struct.pack_into("<Q", raw, 24, 1 << 5 | 1 << 63)
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    again = RuntimeFile.open(rf.path)
    assert again.profile.unknown_optional == 1 << 5 | 1 << 63
    again.verify(progress=False)


def test_shared_bit_needs_a_lineage_and_lineage_needs_the_bit(tmp_path: Path) -> None:
    rf = _small(tmp_path, shared=True)
    raw = bytearray(rf.path.read_bytes())
    raw[32:48] = bytes(16)
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert info.value.fields["offset"] == 32
    raw[16] = 0
    raw[40] = 9
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert info.value.fields["offset"] == 32


def test_out_of_order_table_is_refused_at_the_entry(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = bytearray(rf.path.read_bytes())
    a = ccir.HEADER_SIZE + ccir.ENTRY_SIZE
    b = a + ccir.ENTRY_SIZE
    e1, e2 = raw[a:b], raw[b:b + ccir.ENTRY_SIZE]
    raw[a:b], raw[b:b + ccir.ENTRY_SIZE] = e2, e1
    table = bytes(raw[ccir.HEADER_SIZE:ccir.HEADER_SIZE + 3 * ccir.ENTRY_SIZE])
    struct.pack_into("<I", raw, 72, ccir.crc32c(table))
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert a <= info.value.fields["offset"] < b + ccir.ENTRY_SIZE


def test_foreign_and_empty_files_are_refused(tmp_path: Path) -> None:
    gguf = _file(tmp_path, "x.gguf", TINY_GGUF + bytes(200))
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(gguf)
    assert info.value.code == "ccir_foreign" and info.value.fields["offset"] == 0
    empty = _file(tmp_path, "empty", b"")
    with pytest.raises(FormatError):
        RuntimeFile.open(empty)


def test_future_format_version_is_refused(tmp_path: Path) -> None:
    rf = _small(tmp_path)
    raw = bytearray(rf.path.read_bytes())
    struct.pack_into("<I", raw, 8, 2)
    _reseal_header(raw)
    rf.path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        RuntimeFile.open(rf.path)
    assert info.value.code == "ccir_version" and info.value.fields["offset"] == 8


@pytest.mark.parametrize("name", ["", "/abs.gguf", "a/../b", "a//b", "a\\b", "x" * 201, "./a"])
def test_bad_component_names_are_refused(tmp_path: Path, name: str) -> None:
    p = _file(tmp_path, "m.gguf", TINY_GGUF)
    with pytest.raises(InvalidInput):
        ccir.write_runtime(tmp_path / "r.aotxccir", [_src(KIND_TEXT_MODEL_GGUF, name, p)],
                           required=0, optional=0, lineage=bytes(16), progress=False)
    assert list(tmp_path.iterdir()) == [p]


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    """A source that is shorter than announced (it shrank) aborts the pack cleanly."""
    good = _small(tmp_path)
    before = good.path.read_bytes()
    short = _file(tmp_path, "in/short.gguf", TINY_GGUF)
    with pytest.raises(FormatError):
        ccir.write_runtime(good.path, [Source(KIND_TEXT_MODEL_GGUF, "short.gguf", short, 0, 64)],
                           required=0, optional=0, lineage=bytes(16), progress=False)
    assert good.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.aotxccir", "in"]


def test_zero_length_component_layout(tmp_path: Path) -> None:
    empty = _file(tmp_path, "e/empty.txt", b"")
    last = _file(tmp_path, "e/z.json", b"{}")
    rf = ccir.write_runtime(tmp_path / "z.aotxccir", [
        _src(KIND_EMBEDDING_FILE, "empty.txt", empty), _src(KIND_EMBEDDING_FILE, "z.json", last),
    ], required=0, optional=0, lineage=bytes(16), progress=False)
    assert [(c.offset, c.length) for c in rf.components] == [(4096, 0), (4096, 2)]
    assert os.path.getsize(rf.path) == 4098
    rf.verify(progress=False)


def test_component_flags_round_trip_and_unknown_bits_are_refused(tmp_path: Path) -> None:
    """docs/formats/ccir.md, "Component flags": the entry's u32 at offset 4; bit 0 on a
    text model is automatic_memory, bit 1 kv_f16; any other bit (or any bit on an
    embedding file) is refused at that offset."""
    gguf = _file(tmp_path, "m.gguf", b"GGUF" + bytes(12))
    cfg = _file(tmp_path, "config.json", b"{}")
    out = tmp_path / "flags.aotxccir"
    rf = ccir.write_runtime(out, [Source(ccir.KIND_TEXT_MODEL_GGUF, "m.gguf", gguf, 0, 16,
                                         flags=ccir.FLAG_AUTOMATIC_MEMORY | ccir.FLAG_KV_F16),
                                  _src(ccir.KIND_EMBEDDING_FILE, "config.json", cfg)],
                            required=0, optional=0, lineage=bytes(16))
    assert [(c.name, c.flags, c.automatic_memory, c.kv_f16) for c in rf.components] == \
        [("m.gguf", 3, True, True), ("config.json", 0, False, False)]
    raw = bytearray(out.read_bytes())
    assert struct.unpack_from("<I", raw, ccir.HEADER_SIZE + 4)[0] == 3
    for entry, flags in ((0, 4), (0, 1 << 31), (1, 1), (1, 2)):
        bad = bytearray(raw)
        at = ccir.HEADER_SIZE + entry * ccir.ENTRY_SIZE + 4
        struct.pack_into("<I", bad, at, flags)
        table = bytes(bad[ccir.HEADER_SIZE:ccir.HEADER_SIZE + 2 * ccir.ENTRY_SIZE])
        struct.pack_into("<I", bad, 72, ccir.crc32c(table))
        _reseal_header(bad)
        out.write_bytes(bad)
        with pytest.raises(FormatError) as info:
            RuntimeFile.open(out)
        assert info.value.fields["offset"] == at
    with pytest.raises(ValueError):
        ccir.encode_table([ccir.Component(ccir.KIND_EMBEDDING_FILE, "x", 0, 0, bytes(32), 1)])
