"""aotx_trio.native.journal / csrc/journal/journal*.c: checksums, codec, queue, holds, resume."""

from __future__ import annotations

import hashlib
import struct

import pytest

from aotx_trio import errors
from aotx_trio.native.journal import (
    FILE_HEADER,
    HOLD_DISK,
    HOLD_FILE_CAP,
    HOLD_PENDING,
    RECORD_SIZE,
    XFER_ADMISSION,
    XFER_BOOT,
    XFER_COMPLETION,
    XFER_OUTPUT,
    Journal,
    JournalParams,
    JournalReader,
    crc32c,
    read_journal,
    recover_journal,
    sha256,
)

LINEAGE = bytes(range(0xA0, 0xB0))


def make(**kw: int) -> Journal:
    return Journal(JournalParams(lineage=LINEAGE, file_incarnation=0x0102030405060708, **kw))


def flush(j: Journal, image: bytes | None = None) -> bytes:
    """Drain/ack everything, appending the records to the file image."""
    out = bytearray(j.header() if image is None else image)
    while (d := j.drain()) is not None:
        first, data = d
        assert FILE_HEADER + RECORD_SIZE * first == len(out)
        out += data
        j.ack()
    return bytes(out)


def chain(image: bytes) -> bytes:
    d = hashlib.sha256(image[:FILE_HEADER]).digest()
    for off in range(FILE_HEADER, len(image), RECORD_SIZE):
        d = hashlib.sha256(d + image[off:off + RECORD_SIZE]).digest()
    return d


# ---- checksums ----

@pytest.mark.parametrize(("data", "want"), [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),                   # RFC 3720 B.4
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0),
])
def test_crc32c_vectors(data: bytes, want: int) -> None:
    assert crc32c(data) == want


def test_crc32c_continues() -> None:
    data = bytes(range(256)) * 3
    for cut in (0, 1, 7, 8, 9, 100, len(data)):
        assert crc32c(data[cut:], crc32c(data[:cut])) == crc32c(data)


@pytest.mark.parametrize(("data", "want"), [
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopq"
     b"klmnopqrlmnopqrsmnopqrstnopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
])
def test_sha256_fips_vectors(data: bytes, want: str) -> None:
    assert sha256(data).hex() == want


def test_sha256_every_padding_length() -> None:
    for n in range(0, 200):
        data = bytes((i * 7 + n) & 0xFF for i in range(n))
        assert sha256(data) == hashlib.sha256(data).digest(), n


# ---- header and record layout ----

def test_header_layout_and_crc() -> None:
    h = make().header()
    assert len(h) == 64
    assert h[:8] == b"AOTXJRNL"
    version, size = struct.unpack_from("<II", h, 8)
    assert (version, size) == (2, 64)
    assert h[16:32] == LINEAGE
    assert struct.unpack_from("<Q", h, 32)[0] == 0x0102030405060708
    assert struct.unpack_from("<IHBB", h, 40) == (0x000100, 192, 37, ord("A"))
    assert h[48:60] == bytes(12)
    assert struct.unpack_from("<I", h, 60)[0] == crc32c(h[:60])
    r = JournalReader(h, expected_lineage=LINEAGE)
    assert list(r) == [] and r.valid_end == 64
    assert r.incarnation == 0x0102030405060708 and r.lineage == LINEAGE


def test_worked_example_of_the_format_doc() -> None:
    """docs/formats/journal.md's example, byte for byte."""
    j = make()
    j.enqueue(XFER_ADMISSION, b"hello journal")
    image = flush(j)
    assert len(image) == 64 + 2 * 192
    assert image[:64].hex() == (
        "414f54584a524e4c0200000040000000a0a1a2a3a4a5a6a7a8a9aaabacadaeaf"
        "0807060504030201000100"
        "00c00025410000000000000000000000001c783c" "88")
    assert image[64:128].hex() == (
        "2541010300000100000000000000000020000000200001000000000062217812"
        "0100000000000000000000000000000008070605040302010001000000000000")
    assert image[128:256] == bytes(128)
    assert image[256:304].hex() == (
        "254102030000010001000000000000000d0000000d00010000000000e46cc132"
        "68656c6c6f206a6f75726e616c000000")
    assert image[304:] == bytes(448 - 304)
    s = j.save_state()
    assert (s.next_record, s.saved_records, s.generation, s.boot) == (2, 2, 1, 1)
    assert s.commit_digest.hex() == (
        "f1eddefddf5f34e0e46e389bf02ebcb8270c1103a62d22517c08f300940b4fc2")
    assert s.commit_digest == chain(image)


def record_fields(rec: bytes) -> tuple[int, ...]:
    return struct.unpack_from("<BBBBHHQIH", rec, 0)


@pytest.mark.parametrize("size", [0, 1, 159, 160, 161, 1000, 8192])
def test_multipart_round_trip(size: int) -> None:
    payload = bytes((i * 31 + 7) & 0xFF for i in range(size))
    j = make()
    last = j.enqueue(XFER_OUTPUT, payload)
    image = flush(j)
    parts = max(1, -(-size // 160))
    assert last == parts  # record 0 is the boot transfer
    for p in range(parts):
        rec = image[64 + 192 * (1 + p): 64 + 192 * (2 + p)]
        t, c, kind, flags, part, count, index, xlen, dlen = record_fields(rec)
        assert (t, c, kind, part, count, index, xlen) == (37, 65, XFER_OUTPUT, p, parts, 1 + p,
                                                         size)
        assert flags == (1 if p == 0 else 0) | (2 if p == parts - 1 else 0)
        assert dlen == min(160, size - 160 * p)
        # the save generation: the tick (16 records, boot included) that wrote it
        assert rec[22:28] == ((1 + p) // 16 + 1).to_bytes(6, "little")
        assert rec[32 + dlen:] == bytes(160 - dlen)
        crc_input = rec[:28] + bytes(4) + rec[32:]
        assert struct.unpack_from("<I", rec, 28)[0] == crc32c(crc_input)
    gen = read_journal(image, LINEAGE)
    got = []
    try:
        while True:
            got.append(next(gen))
    except StopIteration as stop:
        valid_end = stop.value
    assert valid_end == len(image)
    assert [(t.kind, t.first_record) for t in got] == [(XFER_BOOT, 0), (XFER_OUTPUT, 1)]
    assert got[1].data == payload and got[1].last_record == last
    assert struct.unpack_from("<QQQ", got[0].data) == (1, 0, 0x0102030405060708)


def test_boot_is_queued_first_and_begin_boot_is_idempotent() -> None:
    j = make()
    assert j.begin_boot() == 0
    assert j.begin_boot() == 0
    assert j.enqueue(XFER_ADMISSION, b"x") == 1
    j2 = make()
    assert j2.enqueue(XFER_ADMISSION, b"x") == 1  # boot inserted in front
    assert j2.begin_boot() == 0
    assert j2.save_state().boot == 1


@pytest.mark.parametrize("kind", [0, XFER_BOOT, 8, 255])
def test_enqueue_refuses_bad_kind(kind: int) -> None:
    j = make()
    with pytest.raises(errors.InvalidInput):
        j.enqueue(kind, b"x")
    assert j.save_state().next_record == 0


# ---- holds and caps: a refusal queues nothing ----

def test_disk_hold_refuses_and_queues_nothing() -> None:
    j = make()
    j.begin_boot()
    before = j.save_state()
    j.set_hold(HOLD_DISK, True)
    with pytest.raises(errors.JournalHold) as ei:
        j.enqueue(XFER_ADMISSION, b"abc")
    assert ei.value.code == "journal_hold"
    after = j.save_state()
    assert after.next_record == before.next_record and after.pending_bytes == before.pending_bytes
    j.set_hold(HOLD_DISK, False)
    assert j.enqueue(XFER_ADMISSION, b"abc") == before.next_record


def test_floor_hold_survives_acks_and_a_failed_writes_hold_survives_the_floor() -> None:
    """The two causes of HOLD_DISK end on their own terms: the disk floor's (set_hold) only
    by set_hold(.., False), not by an ack (records admitted between an ack and the next
    floor check would be written under the floor); a failed write's (nack) by the ack of
    its rewrite, not by the floor's release."""
    j = make()
    j.begin_boot()
    j.set_hold(HOLD_DISK, True)                 # the floor
    assert j.drain() is not None
    j.ack()
    assert j.save_state().hold & HOLD_DISK     # still held: the floor has not released
    with pytest.raises(errors.JournalHold):
        j.enqueue(XFER_ADMISSION, b"a")
    j.set_hold(HOLD_DISK, False)
    j.enqueue(XFER_ADMISSION, b"a")
    assert j.drain() is not None
    j.nack(5)                                   # a failed write ...
    j.set_hold(HOLD_DISK, True)
    j.set_hold(HOLD_DISK, False)                # ... outlives the floor's release
    s = j.save_state()
    assert s.hold & HOLD_DISK and s.disk_error == 5
    assert j.drain() is not None
    j.ack()                                     # its rewrite saved: the hold ends
    assert j.save_state().hold & HOLD_DISK == 0


def test_file_cap_holds_until_raised() -> None:
    cap = 64 + 192 * 4
    j = make(file_cap_bytes=cap)
    j.enqueue(XFER_ADMISSION, b"a")          # boot + 1 record
    with pytest.raises(errors.JournalHold):
        j.enqueue(XFER_ADMISSION, bytes(400))   # 3 records: would pass the cap
    s = j.save_state()
    assert s.next_record == 2 and s.hold & HOLD_FILE_CAP
    with pytest.raises(errors.JournalHold):     # sticky: even one record that would fit
        j.enqueue(XFER_ADMISSION, b"b")
    assert j.save_state().next_record == 2
    j.set_file_cap(0)
    assert j.save_state().hold == 0
    assert j.enqueue(XFER_ADMISSION, bytes(400)) == 4


def test_pending_cap_refuses_until_ack() -> None:
    j = make(max_pending_bytes=192 * 5)
    j.enqueue(XFER_ADMISSION, bytes(320))     # boot + 2 = 3 records pending
    with pytest.raises(errors.JournalHold):
        j.enqueue(XFER_ADMISSION, bytes(480))  # 3 more: 6 > 5
    s = j.save_state()
    assert s.next_record == 3 and s.hold == HOLD_PENDING and s.pending_bytes == 3 * 192
    assert j.enqueue(XFER_ADMISSION, bytes(160)) == 3  # 1 more fits (4 <= 5)
    flush(j)
    assert j.save_state().hold == 0
    assert j.enqueue(XFER_ADMISSION, bytes(480)) == 6


def test_too_large() -> None:
    j = make(max_pending_bytes=192 * 3)
    with pytest.raises(errors.AotxError) as ei:
        j.enqueue(XFER_ADMISSION, bytes(160 * 3))  # boot + 3 > 3 records ever
    assert ei.value.code == "journal_too_large"
    with pytest.raises(errors.AotxError) as ei:
        make().enqueue(XFER_ADMISSION, bytes(65535 * 160 + 1))
    assert ei.value.code == "journal_too_large"
    assert j.save_state().next_record == 0


# ---- drain / ack / nack ----

def test_drain_ack_nack_state_machine() -> None:
    j = make()
    with pytest.raises(errors.AotxError) as ei:
        j.ack()
    assert ei.value.code == "journal_state"
    assert j.drain() is None
    j.enqueue(XFER_OUTPUT, bytes(range(256)) * 12)   # 3072 bytes: 20 parts + boot = 21
    d1 = j.drain()
    assert d1 is not None and d1[0] == 0 and len(d1[1]) == 16 * 192
    d2 = j.drain()
    assert d2 is not None and d2[0] == 16 and len(d2[1]) == 5 * 192
    assert j.drain() is None
    s = j.save_state()
    assert (s.saved_records, s.in_flight_records, s.pending_bytes) == (0, 21, 21 * 192)
    j.nack(5)  # EIO
    s = j.save_state()
    assert (s.in_flight_records, s.disk_error, s.hold) == (0, 5, HOLD_DISK)
    with pytest.raises(errors.JournalHold):
        j.enqueue(XFER_ADMISSION, b"x")
    r1 = j.drain(16)
    assert r1 == d1                                  # the same records, to be rewritten
    j.ack()
    s = j.save_state()
    assert (s.saved_records, s.in_flight_records, s.generation, s.disk_error, s.hold) == (
        16, 0, 1, 0, 0)
    assert s.commit_digest == chain(j.header() + d1[1])
    r2 = j.drain(3)
    # the same records, now stamped with the generation of the save that writes them
    assert r2 is not None and r2[0] == 16 and r2[1] != d2[1][:3 * 192]
    for i in range(3):
        assert d2[1][192 * i + 22:192 * i + 28] == (1).to_bytes(6, "little")
        assert r2[1][192 * i + 22:192 * i + 28] == (2).to_bytes(6, "little")
        assert r2[1][192 * i + 32:192 * (i + 1)] == d2[1][192 * i + 32:192 * (i + 1)]
    j.ack()
    assert j.save_state().generation == 2
    with pytest.raises(ValueError):
        j.drain(17)
    with pytest.raises(errors.InvalidInput):
        j.nack(0)


# ---- resume ----

def test_resume_continues_index_digest_boot_generation() -> None:
    j = make()
    for i in range(5):
        j.enqueue(XFER_ADMISSION, b"op%d" % i * 50)
    image = flush(j)
    s1 = j.save_state()
    assert s1.boot == 1 and s1.commit_digest == chain(image)

    r = JournalReader(image, LINEAGE)
    ts = list(r)
    assert len(ts) == 6 and r.valid_end == len(image) and r.boot == 1
    j2 = Journal(JournalParams(lineage=bytes(16)))   # header facts come from the file
    j2.resume(r)
    s2 = j2.save_state()
    assert s2.next_record == s2.saved_records == s1.next_record
    assert s2.commit_digest == s1.commit_digest
    assert s2.file_incarnation == 0x0102030405060708
    assert s2.generation >= s1.generation and s2.boot == 1
    assert j2.header() == image[:64]
    last = j2.enqueue(XFER_COMPLETION, b"done")
    assert last == s1.next_record + 1              # after boot 2
    image2 = flush(j2, image)
    s3 = j2.save_state()
    assert s3.boot == 2 and s3.generation == s2.generation + 1
    assert s3.commit_digest == chain(image2)
    rec = recover_journal(image2, LINEAGE)
    assert [t.kind for t in rec.transfers][-2:] == [XFER_BOOT, XFER_COMPLETION]
    assert struct.unpack_from("<QQ", rec.transfers[-2].data) == (2, s2.generation)
    assert rec.boot == 2 and rec.valid_end == len(image2)

    r3 = JournalReader(image2, LINEAGE)
    list(r3)
    j3 = make()
    j3.resume(r3)
    assert j3.save_state().generation > s3.generation - 1
    with pytest.raises(errors.AotxError) as ei:   # resume only once, only on a fresh journal
        j3.resume(r3)
    assert ei.value.code == "journal_state"


def test_resume_needs_a_finished_reader() -> None:
    image = flush(make())
    r = JournalReader(image + bytes(10))
    with pytest.raises(errors.AotxError) as ei:
        make().resume(r)
    assert ei.value.code == "journal_state"


def test_generation_never_repeats_across_torn_restarts() -> None:
    """Acks before a crash never get their generation reissued after recovery."""
    image = make().header()
    seen_max = 0
    for boot in range(1, 5):
        r = JournalReader(image, LINEAGE)
        list(r)
        image = image[:r.valid_end]
        j = make()
        j.resume(r)
        assert j.save_state().generation >= seen_max
        j.enqueue(XFER_OUTPUT, bytes(160 * 40))     # multi-tick transfer
        for _ in range(2):                           # two acks, then "crash" mid-transfer
            d = j.drain()
            assert d is not None
            image += d[1]
            j.ack()
        seen_max = j.save_state().generation
        if boot % 2 == 0:                            # sometimes the transfer completes
            image = flush(j, image)
            seen_max = j.save_state().generation


# ---- reader refusals ----

def test_foreign_lineage_and_magic() -> None:
    image = flush(make())
    with pytest.raises(errors.AotxError) as ei:
        list(JournalReader(image, expected_lineage=bytes(16)))
    assert ei.value.code == "journal_foreign" and ei.value.fields["offset"] == 16
    assert "offset 16" in str(ei.value)
    with pytest.raises(errors.AotxError) as ei:
        list(JournalReader(b"NOTAJRNL" + image[8:]))
    assert ei.value.code == "journal_foreign" and ei.value.fields["offset"] == 0
    with pytest.raises(errors.AotxError) as ei:
        list(JournalReader(image[:40]))
    assert ei.value.code == "journal_foreign"


def test_semantic_damage_in_an_intact_record_is_refused() -> None:
    """A record whose CRC matches but whose index is wrong is damage, even at the tail."""
    j = make()
    j.enqueue(XFER_ADMISSION, b"a")
    image = bytearray(flush(j))
    off = 64 + 192
    struct.pack_into("<Q", image, off + 8, 7)
    rec = bytes(image[off:off + 192])
    struct.pack_into("<I", image, off + 28, crc32c(rec[:28] + bytes(4) + rec[32:]))
    with pytest.raises(errors.JournalDamage) as ei:
        list(JournalReader(bytes(image)))
    assert ei.value.fields["offset"] == off + 8


# ---- save generations and save identities ----

def test_save_of_names_the_acknowledging_save_and_retention_bounds_the_ring() -> None:
    j = make(max_pending_bytes=192 * 6)
    last = j.enqueue(XFER_ADMISSION, b"a")            # boot + 1 record
    assert j.save_of(last) is None                     # not saved yet
    image = flush(j)
    sid = j.save_of(last)
    s = j.save_state()
    assert sid is not None and (sid.generation, sid.boot, sid.commit_records) == (1, 1, 2)
    assert sid.file_incarnation == 0x0102030405060708 and sid.commit_digest == s.commit_digest
    # a save that ends inside a transfer commits at the last complete one before it
    a = j.enqueue(XFER_ADMISSION, b"b")                # record 2
    j.enqueue(XFER_OUTPUT, bytes(160 * 3))             # records 3..5
    d = j.drain(2)                                     # records 2, 3: the output's first part
    assert d is not None
    j.ack()
    sid = j.save_of(a)
    assert sid is not None and (sid.generation, sid.commit_records) == (2, 3)
    assert sid.commit_digest == chain(image + d[1][:192])   # through record 2 only
    ack_all(j)
    # retained saved records count against the ring; released ones are reused
    j.retain(0)
    with pytest.raises(errors.JournalHold):
        j.enqueue(XFER_ADMISSION, b"c")
    j.retain(j.save_state().saved_records)
    c = j.enqueue(XFER_ADMISSION, b"c")
    assert c == 6
    with pytest.raises(errors.AotxError) as ei:        # record 0's slot is reused now
        for _ in range(5):
            ack_all(j)
            j.enqueue(XFER_ADMISSION, b"d")
            j.retain(j.save_state().saved_records)
        j.save_of(0)
    assert ei.value.code == "journal_state"


def ack_all(j: Journal) -> None:
    while j.drain() is not None:
        j.ack()


def test_a_generation_that_goes_down_is_damage() -> None:
    image = bytearray(make().header())
    j2 = make()
    for i in range(3):
        j2.enqueue(XFER_ADMISSION, b"x%d" % i)
        d = j2.drain()
        assert d is not None
        image += d[1]
        j2.ack()
    recs = [bytes(image[64 + 192 * i:64 + 192 * (i + 1)]) for i in range(4)]
    assert [int.from_bytes(r[22:28], "little") for r in recs] == [1, 1, 2, 3]
    bad = bytearray(recs[3])
    bad[22:28] = (1).to_bytes(6, "little")             # generation 3 -> 1, CRC made right
    struct.pack_into("<I", bad, 28, crc32c(bytes(bad[:28]) + bytes(4) + bytes(bad[32:])))
    image[64 + 192 * 3:] = bad
    with pytest.raises(errors.JournalDamage) as ei:
        list(JournalReader(bytes(image), LINEAGE))
    assert ei.value.fields["offset"] == 64 + 192 * 3 + 22
    # a restart continues after the last generation in the file
    r = JournalReader(bytes(image[:64 + 192 * 3]), LINEAGE)
    list(r)
    j3 = make()
    j3.resume(r)
    assert j3.save_state().generation == 2
