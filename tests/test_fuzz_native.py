"""Property-based fuzzing of every input parser (run it under the ASan build too).

Each property feeds hostile but well-framed input to one parser and asserts the
only two allowed outcomes: it loads, or it refuses with an AotxError (code and
offset/field where the format has them).  A crash, a hang or a memory error
(under AddressSanitizer) fails the run.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import synth_gguf as sg
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from aotx_trio import errors
from aotx_trio.native import device as D
from aotx_trio.native import journal as J
from aotx_trio.native import lib as native
from aotx_trio.native.embed import SafeTensors, WordPiece
from aotx_trio.native.engine import Engine
from aotx_trio.native.lib import ffi, lib
from aotx_trio.native.tokenizer import CONTROL, NORMAL, Tokenizer
from aotx_trio.runtime import ccir
from aotx_trio.service import wire

# AOTX_FUZZ_SCALE=k runs k times the examples with fresh randomness (a longer hunt);
# the default is a fixed, reproducible run.
SCALE = int(os.environ.get("AOTX_FUZZ_SCALE", "1"))


def fuzz(n: int) -> settings:
    return settings(max_examples=n * SCALE, deadline=None, derandomize=SCALE == 1,
                    database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


L = "0123456789abcdef0123456789abcdef"
A, B, C = "a1" * 16, "b2" * 16, "c3" * 16
ALL = D.ALL_GRANTS


def mutate(data: bytes, draw: Any, region: int | None = None) -> bytes:
    """Byte flips, inserted/deleted runs and huge little-endian integers, within region."""
    out = bytearray(data)
    end = len(out) if region is None else min(region, len(out))
    for _ in range(draw(st.integers(1, 4))):
        if end == 0:
            break
        at = draw(st.integers(0, end - 1))
        op = draw(st.sampled_from(("flip", "insert", "delete", "u64", "u32", "byte")))
        if op == "flip":
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del out[at:at + draw(st.integers(1, 9))]
        elif op == "byte":
            out[at] = draw(st.integers(0, 255))
        else:
            width = 8 if op == "u64" else 4
            v = draw(st.sampled_from((0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**63,
                                      2**64 - 1)))
            out[at:at + width] = (v % (1 << (8 * width))).to_bytes(width, "little")
        end = min(end, len(out))
    return bytes(out)


# ---- 1. device recovery from CRC-valid hostile journals ------------------------------


def _lineage_journal() -> J.Journal:
    return J.Journal(J.JournalParams(lineage=bytes.fromhex(L), file_incarnation=0x99))


def _save(j: J.Journal, file: bytearray) -> None:
    while (got := j.drain()) is not None:
        first, data = got
        off = J.record_offset(first)
        if len(file) < off:
            file.extend(bytes(off - len(file)))
        file[off:off + len(data)] = data
        j.ack()


def _real_transfers() -> list[tuple[int, bytes]]:
    """Every transfer a real device session writes (admissions of each kind, memory,
    completions)."""
    j = _lineage_journal()
    dev = D.Device(j, L)
    n = 0

    def do(actor: str, kind: D.Kind, **kw: Any) -> D.Receipt:
        nonlocal n
        n += 1
        seq = dev.participant(ALL, actor).next_sequence or 1
        return dev.submit(ALL, actor, D.Request(kind, L, f"{n:032x}", seq, **kw))

    do(A, D.Kind.REGISTER)
    do(B, D.Kind.REGISTER)
    space = do(A, D.Kind.SPACE_CREATE, scope="room").resource_id
    conv = do(A, D.Kind.CONVERSATION_CREATE, space=space).resource_id
    do(A, D.Kind.MEMBER_SET, space=space, participant=B, permissions=("read", "write"))
    done = do(A, D.Kind.INPUT, conversation=conv, model="m", text="hello \u00e9")
    file = bytearray(j.header())
    _save(j, file)
    text_row, _ = dev.memory_retain(done.op_id, [0.5, -1.0, 2.0])
    dev.complete(done.op_id, "succeeded", b"answer bytes", 3, 4)
    _save(j, file)
    do(A, D.Kind.PUBLISH, space=space, object=text_row.object, source_version=1)
    do(B, D.Kind.INPUT, conversation=conv, model="m", text="x" * 300,
       media=(("image", "ab" * 32),))
    do(B, D.Kind.CANCEL, target_sequence=2)
    _save(j, file)
    do(A, D.Kind.RETIRE, retry_floor=2)
    _save(j, file)
    transfers = [(t.kind, t.data) for t in J.JournalReader(bytes(file))]
    dev.close()
    assert {k for k, _ in transfers} >= {J.XFER_ADMISSION, J.XFER_COMPLETION, J.XFER_MEMORY}
    return transfers


REAL_TRANSFERS = _real_transfers()
KINDS = st.sampled_from((J.XFER_ADMISSION, J.XFER_COMPLETION, J.XFER_LEASE, J.XFER_OUTPUT,
                         J.XFER_RETIREMENT, J.XFER_MEMORY, 0, 8, 200, 255))


@st.composite
def transfer(draw: Any) -> tuple[int, bytes]:
    how = draw(st.sampled_from(("real", "mutated", "truncated", "raw")))
    kind, data = draw(st.sampled_from(REAL_TRANSFERS))
    if how == "real":
        return kind, data
    if how == "truncated":
        return kind, data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if how == "mutated":
        if draw(st.booleans()):
            kind = draw(KINDS)
        return kind, mutate(data, draw)
    return draw(KINDS), draw(st.binary(max_size=400))


def _recover(image: bytes) -> D.Device:
    dev = D.Device(_lineage_journal(), L)
    reader = J.JournalReader(image)
    try:
        dev.recover(reader)
    except BaseException:
        dev.close()
        raise
    return dev


def _visible(dev: D.Device) -> tuple[Any, ...]:
    return (dev.usage(), dev.participant(ALL, A), dev.participant(ALL, B))


@fuzz(500)
@given(st.lists(transfer(), min_size=1, max_size=8))
def test_recovery_of_hostile_journals(transfers: list[tuple[int, bytes]]) -> None:
    j = _lineage_journal()
    admissions = 0   # admission transfers that reached the file
    for kind, data in transfers:
        try:
            j.enqueue(kind, data)
        except errors.AotxError:
            continue   # the encoder refuses it: nothing written
        admissions += kind == J.XFER_ADMISSION
    file = bytearray(j.header())
    _save(j, file)
    fresh = D.Device(_lineage_journal(), L)
    empty = _visible(fresh)
    fresh.close()
    try:
        dev = _recover(bytes(file))
    except errors.AotxError as exc:
        # every record is CRC-valid, so a refusal is the device's: a transfer contradicts the
        # replayed state, named by the index of its first record
        assert exc.code == "recovery_damage", exc
        assert J.record_offset(exc.fields["record"]) < len(file), (exc, len(file))
        event(f"refused: {exc.code}")
        return
    event("recovered")
    try:   # a recovered device replayed every admission, answers reads, takes new admissions
        usage = dev.usage()
        assert usage.admissions == admissions, (usage, admissions)
        assert usage.receipts <= usage.admissions
        if usage == empty[0]:
            assert _visible(dev) == empty
        assert not dev.participant(ALL, C).registered
        seq = dev.participant(ALL, C).next_sequence or 1
        got = dev.submit(ALL, C, D.Request(D.Kind.REGISTER, L, "c4" * 16, seq))
        assert dev.receipt(ALL, C, got.op_id) == got
        assert dev.participant(ALL, C).registered
        after = dev.usage()
        assert (after.admissions, after.participants) == (admissions + 1, usage.participants + 1)
    finally:
        dev.close()


@fuzz(200)
@given(st.lists(transfer(), min_size=1, max_size=6))
def test_refused_recovery_leaves_nothing_visible(transfers: list[tuple[int, bytes]]) -> None:
    """Real admissions first, then hostile ones: a refusal must not expose the prefix."""
    j = _lineage_journal()
    for kind, data in REAL_TRANSFERS[:3] + transfers:
        try:
            j.enqueue(kind, data)
        except errors.AotxError:
            continue
    file = bytearray(j.header())
    _save(j, file)
    dev = D.Device(_lineage_journal(), L)
    empty = _visible(dev)
    try:
        reader = J.JournalReader(bytes(file))   # keeps the image alive during replay
        dev.recover(reader)
    except errors.AotxError:
        assert _visible(dev) == empty
        with pytest.raises(errors.AotxError):
            dev.submit(ALL, A, D.Request(D.Kind.REGISTER, L, "77" * 16, 1))
    finally:
        dev.close()


# ---- 2. the GGUF reader and Engine.load ----------------------------------------------


def _sample_gguf(path: Path) -> bytes:
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_uint32("u32", 7)
    w.add_int64("i64", -5)
    w.add_float64("f64", 2.5)
    w.add_bool("flag", True)
    w.add_string("name", "fuzz \u00e9")
    w.add_array("ints", [1, 2, 3])
    w.add_array("strs", ["a", "bc", ""])
    w.add_tensor("t.f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("t.q8", sg.encode(np.random.default_rng(0),
                                   np.ones((2, 32), dtype=np.float32), sg.Q.Q8_0),
                 raw_dtype=sg.Q.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def _walk_gguf(g: Any) -> None:
    """Touch every key, value, array element and tensor the reader exposes."""
    iv, fv = ffi.new("int64_t *"), ffi.new("double *")
    p, n = ffi.new("const char **"), ffi.new("uint64_t *")
    et, cnt = ffi.new("int32_t *"), ffi.new("uint64_t *")
    for i in range(lib.aotx_gguf_n_kv(g)):
        assert lib.aotx_gguf_key(g, i) != ffi.NULL
        ffi.string(lib.aotx_gguf_key(g, i))
        t = lib.aotx_gguf_kv_type(g, i)
        if t == lib.AOTX_GGUF_STRING:
            assert lib.aotx_gguf_get_str(g, i, p, n) == 0
            bytes(ffi.buffer(p[0], n[0]))
        elif t == lib.AOTX_GGUF_ARRAY:
            assert lib.aotx_gguf_arr_info(g, i, et, cnt) == 0
            for k in range(min(cnt[0], 64)):
                if et[0] == lib.AOTX_GGUF_STRING:
                    if lib.aotx_gguf_arr_str(g, i, k, p, n) == 0:
                        bytes(ffi.buffer(p[0], n[0]))
                else:
                    lib.aotx_gguf_arr_int(g, i, k, iv)
                    lib.aotx_gguf_arr_float(g, i, k, fv)
            assert lib.aotx_gguf_arr_int(g, i, cnt[0], iv) != 0   # one past the end
        else:
            lib.aotx_gguf_get_int(g, i, iv)
            lib.aotx_gguf_get_float(g, i, fv)
    info = ffi.new("aotx_gguf_tensor_info *")
    size = lib.aotx_gguf_file_size(g)
    for i in range(lib.aotx_gguf_n_tensors(g)):
        assert lib.aotx_gguf_tensor(g, i, info) == 0
        ffi.string(info.name)
        assert lib.aotx_gguf_data_offset(g) + info.offset + info.nbytes <= size
        if info.nbytes:
            data = bytes(ffi.buffer(info.data, info.nbytes))
            assert len(data) == info.nbytes


@pytest.fixture(scope="module")
def sample_gguf(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _sample_gguf(tmp_path_factory.mktemp("g") / "s.gguf")


# What the GGUF reader may answer for a file that exists and can be mapped: every
# AOTX_E_GGUF_* code of aotx_gguf.h but "cannot be opened".
GGUF_REFUSALS = {native.code_name(getattr(lib, n)) for n in dir(lib)
                 if n.startswith("AOTX_E_GGUF_") and n != "AOTX_E_GGUF_OPEN"}
# ... and Engine.load on top of it: the model and tokenizer codes (aotx_model.h,
# aotx_tokenizer.h).
LOAD_REFUSALS = GGUF_REFUSALS | {native.code_name(getattr(lib, n)) for n in dir(lib)
                                 if n.startswith(("AOTX_E_MODEL_", "AOTX_E_TOKENIZER_"))}


@fuzz(800)
@given(data=st.data())
def test_gguf_reader_on_mutations(sample_gguf: bytes, tmp_path: Path, data: Any) -> None:
    bad = mutate(sample_gguf, data.draw, region=data.draw(st.sampled_from((None, 600))))
    path = tmp_path / "m.gguf"
    path.write_bytes(bad)
    out = ffi.new("aotx_gguf **")
    err = ffi.new("char[256]")
    rc = lib.aotx_gguf_open(str(path).encode(), out, err, 256)
    if rc != 0:
        msg = ffi.string(err).decode()
        assert out[0] == ffi.NULL
        assert native.code_name(rc) in GGUF_REFUSALS, (rc, msg)
        assert "byte" in msg or "past the end" in msg, msg
        event(f"refused: {native.code_name(rc)}")
        return
    event("loaded")
    try:
        _walk_gguf(out[0])
    finally:
        lib.aotx_gguf_close(out[0])


TINY = sg.Spec(d_model=64, n_layers=1, d_ff=128, n_heads=2, n_kv_heads=1, head_dim=32,
               n_vocab=320, types=(sg.Q.Q8_0,),
               embd_type=sg.Q.Q8_0)
LIES = (0, 1, 2, 3, 4, 8, 16, 31, 32, 33, 64, 65, 128, 256, 319, 320, 321, 2**16, 2**31 - 1,
        2**31, 2**32 - 1)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[int], list[int],
                                                                  int]:
    """(bytes, offsets of every u32 metadata value, of every tensor dim/type/offset, data
    offset)."""
    path = sg.write_model(tmp_path_factory.mktemp("e") / "t.gguf", TINY)
    raw = path.read_bytes()
    ref = gguf.GGUFReader(str(path))
    spots: list[int] = []
    dims: list[int] = []
    for f in ref.fields.values():
        if f.types and f.types[0] in (gguf.GGUFValueType.UINT32, gguf.GGUFValueType.INT32):
            spots.append(int(f.parts[-1].ctypes.data - ref.data.ctypes.data))
    for t in ref.tensors:
        for part in t.field.parts[2:]:
            dims.append(int(part.ctypes.data - ref.data.ctypes.data))
    return raw, spots, dims, int(ref.data_offset)


def _exercise(eng: Engine) -> None:
    ids = eng.tokenize(b"the capital \xff")
    eng.detokenize(ids)
    list(eng.generate(ids[:4], max_tokens=2))


@fuzz(200)
@given(data=st.data())
def test_engine_load_on_lying_models(tiny_model: tuple[bytes, list[int], list[int], int],
                                     tmp_path: Path, data: Any) -> None:
    raw, spots, dims, data_offset = tiny_model
    if data.draw(st.integers(0, 3)):   # a field lies about its value
        out = bytearray(raw)
        for _ in range(data.draw(st.integers(1, 2))):
            at = data.draw(st.sampled_from(spots if data.draw(st.integers(0, 2)) else dims))
            v = data.draw(st.sampled_from(LIES))
            out[at:at + 4] = v.to_bytes(4, "little")
        bad = bytes(out)
    else:
        bad = mutate(raw, data.draw, region=data_offset)
    path = tmp_path / "lie.gguf"
    path.write_bytes(bad)
    try:
        eng = Engine.load(path, threads=1, max_seqs=2, max_tokens=64, max_batch_tokens=16)
    except errors.AotxError as exc:
        assert exc.code in LOAD_REFUSALS and exc.rc is not None and exc.rc < 0, exc
        assert str(exc).startswith(native.strerror(exc.rc)), exc
        event(f"refused: {exc.code}")
        return
    event("loaded")
    with eng:
        try:
            _exercise(eng)
        except errors.AotxError:
            pass


# ---- 3. tokenizers on arbitrary bytes --------------------------------------------------


def _byte_level() -> list[str]:
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


@pytest.fixture(scope="module")
def tokenizers() -> tuple[Tokenizer, Tokenizer]:
    toks, scores, types = sg.vocab(400)
    spm = Tokenizer.from_vocab(toks, scores, types, bos_id=2, eos_id=1, unk_id=3)
    bl = _byte_level()
    pieces = [*bl, "<|end|>"]
    merges = []
    for word in ("the", "hello", "\u00e9t\u00e9".encode().decode("latin-1"), "  "):
        b = "".join(bl[c] for c in word.encode("latin-1"))
        for i in range(1, len(b)):
            if b[:i + 1] not in pieces:
                pieces.append(b[:i + 1])
            merges.append(f"{b[:i]} {b[i]}")
    types_b = [NORMAL] * len(pieces)
    types_b[256] = CONTROL
    bpe = Tokenizer.from_bpe(pieces, list(dict.fromkeys(merges)), types_b, pre="default")
    return spm, bpe


@fuzz(500)
@given(st.one_of(st.binary(max_size=80),
                 st.text(max_size=40).map(str.encode),
                 st.lists(st.sampled_from((b"\xe2\x96\x81", b"<|end|>", b"<eos>", b"\xf0\x9f",
                                           b"\xc3", b" ", b"the", b"\x00", b"\xed\xa0\x80")),
                          max_size=12).map(b"".join)))
def test_tokenizers_on_any_bytes(tokenizers: tuple[Tokenizer, Tokenizer], data: bytes) -> None:
    spm, bpe = tokenizers
    for tok, bos in ((spm, True), (bpe, False)):
        for special in (False, True):
            ids = tok.encode(data, add_bos=bos, parse_special=special)
            assert all(0 <= i < 512 for i in ids)
            tok.decode(ids)
            det = tok.detokenizer()
            streamed = b"".join(det.push(i) for i in ids) + det.flush()
            assert streamed == tok.decode(ids)
    # round trips: BPE always; SPM unless the input holds the space marker U+2581
    assert bpe.decode(bpe.encode(data, add_bos=False)) == data
    if b"\xe2\x96\x81" not in data:
        assert spm.decode(spm.encode(data, add_bos=False)) == data


IDS = st.one_of(st.integers(-2**31, 2**31 - 1), st.integers(-2, 520))


@fuzz(120)
@given(st.lists(IDS, max_size=8))
def test_decode_of_hostile_ids(tokenizers: tuple[Tokenizer, Tokenizer], ids: list[int]) -> None:
    """Ids outside the vocabulary are refused as token_id_invalid; a refused push leaves the
    detokenizer as it was, so the stream equals the decoding of the valid ids alone."""
    for tok in tokenizers:
        valid = [i for i in ids if 0 <= i < tok.n_vocab]
        if valid == ids:
            tok.decode(ids)
        else:
            with pytest.raises(errors.AotxError) as info:
                tok.decode(ids)
            assert info.value.code == "token_id_invalid", info.value
        det = tok.detokenizer()
        parts = []
        for i in ids:
            try:
                parts.append(det.push(i))
            except errors.AotxError as exc:
                assert i not in valid and exc.code == "token_id_invalid", (i, exc)
                assert exc.fields.get("field") == "token_id", exc
        parts.append(det.flush())
        assert b"".join(parts) == tok.decode(valid)


# ---- 4. embeddings: safetensors headers and tokenizer.json -----------------------------


def _safetensors(header: dict[str, Any], payload: bytes) -> bytes:
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + payload


JSONISH = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70)
                       | st.floats(allow_nan=True) | st.text(max_size=6),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4),
                                                                             c, max_size=3),
                       max_leaves=8)


@fuzz(500)
@given(data=st.data())
def test_safetensors_headers(tmp_path: Path, data: Any) -> None:
    header: dict[str, Any] = {
        "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "F32", "shape": [3], "data_offsets": [24, 36]},
        "__metadata__": {"format": "pt"}}
    how = data.draw(st.sampled_from(("field", "bytes")))
    if how == "field":
        name = data.draw(st.sampled_from(("w", "b")))
        key = data.draw(st.sampled_from(("dtype", "shape", "data_offsets")))
        header[name][key] = data.draw(JSONISH)
        raw = _safetensors(header, bytes(36))
    else:
        raw = mutate(_safetensors(header, bytes(36)), data.draw)
    path = tmp_path / "m.safetensors"
    path.write_bytes(raw)
    try:
        st_ = SafeTensors(path)
    except errors.FormatError as exc:
        assert exc.code.startswith("safetensors_")
        event(f"refused: {exc.code}")
        return
    for name, shape in (("w", (2, 3)), ("b", (3,))):
        try:
            arr = st_.tensor(name, shape)
        except errors.FormatError as exc:
            assert repr(name) in str(exc) and exc.fields.get("tensor") == name, exc
            event(f"tensor refused: {exc.code}")
            continue
        assert arr.shape == shape and arr.dtype == np.float32


@fuzz(250)
@given(data=st.data())
def test_wordpiece_tokenizer_json(tmp_path: Path, data: Any) -> None:
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "##s": 5}
    raw: dict[str, Any] = {
        "model": {"type": "WordPiece", "vocab": vocab, "unk_token": "[UNK]",
                  "continuing_subword_prefix": "##", "max_input_chars_per_word": 100},
        "normalizer": {"lowercase": True},
        "added_tokens": [{"content": "[CLS]", "id": 2, "normalized": False}]}
    where = data.draw(st.sampled_from(("model", "vocab", "normalizer", "added_tokens", "top")))
    value = data.draw(JSONISH)
    if where == "model":
        raw["model"][data.draw(st.sampled_from(sorted(raw["model"])))] = value
    elif where == "vocab":
        vocab[data.draw(st.sampled_from(sorted(vocab)))] = value
    elif where == "top":
        raw = value
    else:
        raw[where] = value
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(raw))
    try:
        wp = WordPiece(path, 16)
    except errors.AotxError as exc:
        assert exc.code == "embed_config_invalid" and exc.fields.get("key"), exc
        event(f"refused: {exc.code}")
        return
    assert all(isinstance(i, int) for i in wp.encode("hellos [CLS] world"))


# ---- 5. the runtime file reader and the socket framing ----------------------------------


@pytest.fixture(scope="module")
def runtime_file(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    tmp = tmp_path_factory.mktemp("c")
    (tmp / "a.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp / "config.json").write_bytes(b'{"hidden_size": 4}')
    rf = ccir.write_runtime(tmp / "r.aotxccir", [
        ccir.Source(ccir.KIND_TEXT_MODEL_GGUF, "a.gguf", tmp / "a.gguf", 0, 8),
        ccir.Source(ccir.KIND_EMBEDDING_FILE, "config.json", tmp / "config.json", 0, 18)],
        required=ccir.PROFILE_SHARED, optional=0, lineage=bytes.fromhex(L), progress=False)
    return rf.path.read_bytes()


@st.composite
def runtime_images(draw: Any, good: bytes) -> bytes:
    if not draw(st.integers(0, 4)):
        return bytes(draw(st.binary(max_size=300)))
    raw = bytearray(mutate(good, draw))
    if draw(st.booleans()) and len(raw) >= 128:   # forge valid CRCs to reach deep checks
        count = struct.unpack_from("<I", raw, 48)[0]
        table = bytes(raw[128:128 + min(count, 64) * 128])
        struct.pack_into("<I", raw, 72, ccir.crc32c(table))
        struct.pack_into("<I", raw, 124, ccir.crc32c(bytes(raw[:124])))
    return bytes(raw)


CCIR_OPEN_REFUSALS = ("ccir_foreign", "ccir_version", "ccir_truncated", "ccir_corrupt",
                      "unsupported_profile")


@fuzz(500)
@given(data=st.data())
def test_runtime_file_reader(runtime_file: bytes, tmp_path: Path, data: Any) -> None:
    raw = data.draw(runtime_images(runtime_file))
    path = tmp_path / "r.aotxccir"
    path.write_bytes(bytes(raw))
    try:
        rf = ccir.RuntimeFile.open(path)
    except errors.AotxError as exc:
        assert exc.code in CCIR_OPEN_REFUSALS and "offset" in exc.fields, exc
        event(f"refused: {exc.code}")
        return
    event("opened")
    try:
        rf.verify(progress=False)
        verified = True
    except errors.AotxError as exc:   # damaged padding or extent: named, with its offset
        assert exc.code in ("ccir_corrupt", "ccir_digest_mismatch") and "offset" in exc.fields
        event(f"verify refused: {exc.code}")
        verified = False
    for c in rf.components:   # after a clean verify every component reads back whole
        try:
            data = rf.read_component(c.name)
        except errors.AotxError as exc:
            assert not verified and exc.code == "ccir_digest_mismatch", exc
            assert exc.fields.get("component") == c.name, exc
            continue
        assert len(data) == c.length


@fuzz(500)
@given(st.binary(max_size=64))
def test_wire_decode_body(body: bytes) -> None:
    try:
        obj = wire.decode_body(body)
    except wire.FrameError as exc:
        assert exc.code == "frame_invalid" and "offset" in exc.fields
        return
    assert isinstance(obj, dict)
    if isinstance(obj.get("error"), dict) or "kind" in obj:
        try:
            err = wire.error_from_frame(obj)
        except TypeError:
            pytest.fail(f"error_from_frame crashed on {obj!r}")
        assert isinstance(err, errors.AotxError)


@fuzz(200)
@given(st.dictionaries(st.text(max_size=8), JSONISH, max_size=4), st.text(max_size=20),
       st.sampled_from(("AotxError", "FormatError", "NotFound", "FrameError", "", "int")))
def test_wire_error_from_frame(fields: dict[str, Any], message: str, kind: str) -> None:
    body = dict(fields)
    body["message"] = message
    err = wire.error_from_frame({"ok": False, "error": body, "kind": kind})
    assert isinstance(err, errors.AotxError) and message in str(err)


@fuzz(300)
@given(st.binary(max_size=120), st.integers(1, 7))
def test_wire_frame_reader(stream_bytes: bytes, chunk: int) -> None:
    async def run() -> None:
        send, recv = trio.testing.memory_stream_one_way_pair()
        reader = wire.FrameReader(recv, max_frame=64)
        for i in range(0, len(stream_bytes), chunk):
            await send.send_all(stream_bytes[i:i + chunk])
        await send.aclose()
        while True:
            try:
                frame = await reader.read()
            except wire.FrameError as exc:
                assert "offset" in exc.fields
                return
            if frame is None:
                return
            assert isinstance(frame, dict)

    trio.run(run)


# ---- 6. the sanitizer run is live ------------------------------------------------------

# ./scripts/test runs this file a second time on the AOTX_DEBUG=1 build (AddressSanitizer
# and UBSan, preloaded) with AOTX_SANITIZE_CHECK=1; this test proves that run can fail.
CANARY = """
from aotx_trio.native.lib import ffi, lib
err = ffi.new("char[4]")   # the library is told it holds 256 bytes
lib.aotx_gguf_open(b"/nonexistent/canary.gguf", ffi.new("aotx_gguf **"), err, 256)
print("no finding")
"""


@pytest.mark.skipif(os.environ.get("AOTX_SANITIZE_CHECK") != "1",
                    reason="only in ./scripts/test's AddressSanitizer + UBSan run")
def test_the_sanitizers_are_live() -> None:
    """The library under test is the instrumented build, and an overflow ends the process."""
    so = Path(sys.modules["aotx_trio._native"].__file__ or "")
    assert so.parent.resolve() == Path(os.environ["AOTX_NATIVE_DIR"]).resolve(), so
    image = so.read_bytes()
    assert b"__asan_report_" in image and b"__ubsan_handle_" in image, so
    proc = subprocess.run([sys.executable, "-c", CANARY], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode != 0 and "no finding" not in proc.stdout, proc.stdout
    assert "AddressSanitizer: heap-buffer-overflow" in proc.stderr, proc.stderr[-2000:]
    assert "aotx_gguf_open" in proc.stderr, proc.stderr[-2000:]
