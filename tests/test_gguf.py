"""csrc/engine/model/gguf.c: the GGUF v3 reader against gguf-py's writer and reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from _real import real_gguf
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT

from aotx_trio import errors
from aotx_trio.native.lib import check, ffi, lib

REAL = real_gguf()


class Reader:
    def __init__(self, path: Path) -> None:
        out = ffi.new("aotx_gguf **")
        err = ffi.new("char[256]")
        rc = lib.aotx_gguf_open(str(path).encode(), out, err, 256)
        self.message = ffi.string(err).decode()
        check(rc, self.message)
        self.g = out[0]

    def close(self) -> None:
        lib.aotx_gguf_close(self.g)

    def value(self, i: int) -> Any:
        t = lib.aotx_gguf_kv_type(self.g, i)
        if t == lib.AOTX_GGUF_STRING:
            p, n = ffi.new("const char **"), ffi.new("uint64_t *")
            check(lib.aotx_gguf_get_str(self.g, i, p, n))
            return bytes(ffi.buffer(p[0], n[0])).decode()
        if t == lib.AOTX_GGUF_ARRAY:
            et, cnt = ffi.new("int32_t *"), ffi.new("uint64_t *")
            check(lib.aotx_gguf_arr_info(self.g, i, et, cnt))
            out: list[Any] = []
            for j in range(cnt[0]):
                if et[0] == lib.AOTX_GGUF_STRING:
                    p, n = ffi.new("const char **"), ffi.new("uint64_t *")
                    check(lib.aotx_gguf_arr_str(self.g, i, j, p, n))
                    out.append(bytes(ffi.buffer(p[0], n[0])).decode())
                elif et[0] in (lib.AOTX_GGUF_F32, lib.AOTX_GGUF_F64):
                    f = ffi.new("double *")
                    check(lib.aotx_gguf_arr_float(self.g, i, j, f))
                    out.append(f[0])
                else:
                    v = ffi.new("int64_t *")
                    check(lib.aotx_gguf_arr_int(self.g, i, j, v))
                    out.append(v[0])
            return out
        if t in (lib.AOTX_GGUF_F32, lib.AOTX_GGUF_F64):
            f = ffi.new("double *")
            check(lib.aotx_gguf_get_float(self.g, i, f))
            return f[0]
        v = ffi.new("int64_t *")
        check(lib.aotx_gguf_get_int(self.g, i, v))
        return v[0]

    def tensors(self) -> dict[str, Any]:
        out = {}
        for i in range(lib.aotx_gguf_n_tensors(self.g)):
            ti = ffi.new("aotx_gguf_tensor_info *")
            check(lib.aotx_gguf_tensor(self.g, i, ti))
            dims = [int(ti.dims[d]) for d in range(ti.n_dims)]
            out[ffi.string(ti.name).decode()] = (int(ti.type), dims, int(ti.offset),
                                                 bytes(ffi.buffer(ti.data, ti.nbytes)))
        return out


def write_sample(path: Path, alignment: int | None = None) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁world")
    w.add_uint64("t.u64", 2**63 - 1)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", -2.25)
    w.add_array("t.arr_i", [1, -2, 3])
    w.add_array("t.arr_f", [0.5, -1.25])
    w.add_array("t.arr_s", ["a", "", "ccc"])
    w.add_array("t.arr_b", [True, False])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal(7).astype(np.float16))
    x = rng.standard_normal((2, 64)).astype(np.float32)
    w.add_tensor("q8", gguf.quants.quantize(x, Q.Q8_0), raw_dtype=Q.Q8_0)
    w.add_tensor("q5", gguf.quants.quantize(x, Q.Q5_0), raw_dtype=Q.Q5_0)
    w.add_tensor("q4k", rng.integers(0, 256, (2, 144), dtype=np.uint8), raw_dtype=Q.Q4_K)
    w.add_tensor("q6k", rng.integers(0, 256, (1, 210), dtype=np.uint8), raw_dtype=Q.Q6_K)
    # the common quant types (issue 26), IQ4_NL / IQ4_XS among them
    w.add_tensor("q4_1", gguf.quants.quantize(x, Q.Q4_1), raw_dtype=Q.Q4_1)
    w.add_tensor("q5_1", gguf.quants.quantize(x, Q.Q5_1), raw_dtype=Q.Q5_1)
    for name, t in (("q2k", Q.Q2_K), ("q3k", Q.Q3_K), ("iq4nl", Q.IQ4_NL), ("iq4xs", Q.IQ4_XS)):
        w.add_tensor(name, rng.integers(0, 256, (2, gguf.GGML_QUANT_SIZES[t][1]), dtype=np.uint8),
                     raw_dtype=t)
    # last: its data ends at the file's end (no alignment padding after it)
    w.add_tensor("bf16", gguf.quants.quantize(x, Q.BF16), raw_dtype=Q.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def py_value(f: Any) -> Any:
    return f.contents()


@pytest.mark.parametrize("alignment", [None, 64])
def test_matches_gguf_py(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "s.gguf"
    write_sample(path, alignment)
    ref = gguf.GGUFReader(str(path))
    r = Reader(path)
    try:
        assert lib.aotx_gguf_version(r.g) == 3
        assert lib.aotx_gguf_alignment(r.g) == (alignment or 32)
        assert lib.aotx_gguf_data_offset(r.g) == ref.data_offset
        assert lib.aotx_gguf_data_offset(r.g) % (alignment or 32) == 0
        keys = [k for k in ref.fields if not k.startswith("GGUF.")]
        assert lib.aotx_gguf_n_kv(r.g) == len(keys)
        for k in keys:
            i = lib.aotx_gguf_find_key(r.g, k.encode())
            assert i >= 0, k
            f = ref.fields[k]
            assert lib.aotx_gguf_kv_type(r.g, i) == int(f.types[0]), k
            want = py_value(f)
            got = r.value(i)
            if f.types[0] in (VT.FLOAT32, VT.FLOAT64) or (
                    f.types[0] == VT.ARRAY and f.types[-1] in (VT.FLOAT32, VT.FLOAT64)):
                assert np.allclose(got, want), k
            elif f.types[0] == VT.BOOL or (f.types[0] == VT.ARRAY and f.types[-1] == VT.BOOL):
                assert got == ([int(x) for x in want] if isinstance(want, list) else int(want))
            else:
                assert got == want, k
        assert lib.aotx_gguf_find_key(r.g, b"no.such.key") == -1
        tensors = r.tensors()
        assert set(tensors) == {t.name for t in ref.tensors}
        for t in ref.tensors:
            typ, dims, off, data = tensors[t.name]
            assert typ == int(t.tensor_type)
            assert dims == [int(x) for x in t.shape]
            assert off == t.data_offset - ref.data_offset
            assert data == bytes(np.asarray(t.data).tobytes())
    finally:
        r.close()


def open_code(path: Path) -> tuple[int, str]:
    out = ffi.new("aotx_gguf **")
    err = ffi.new("char[256]")
    rc = lib.aotx_gguf_open(str(path).encode(), out, err, 256)
    if rc == 0:
        lib.aotx_gguf_close(out[0])
    return rc, ffi.string(err).decode()


def test_bad_magic_and_version(tmp_path: Path) -> None:
    good = tmp_path / "s.gguf"
    write_sample(good)
    data = bytearray(good.read_bytes())
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUX" + data[4:])
    rc, msg = open_code(bad)
    assert rc == lib.AOTX_E_GGUF_MAGIC and "bytes 0..4" in msg
    data[4] = 9
    bad.write_bytes(bytes(data))
    rc, msg = open_code(bad)
    assert rc == lib.AOTX_E_GGUF_VERSION and "byte 4" in msg
    bad.write_bytes(b"GGUX" + data[4:])
    with pytest.raises(errors.FormatError, match=r"bytes 0\.\.4"):
        Reader(bad)
    with pytest.raises(errors.NativeError):
        Reader(tmp_path / "missing.gguf")


def test_every_truncation_is_refused_with_an_offset(tmp_path: Path) -> None:
    good = tmp_path / "s.gguf"
    write_sample(good)
    data = good.read_bytes()
    ref = gguf.GGUFReader(str(good))
    cut_points = sorted(set(range(0, ref.data_offset, 7)) | {ref.data_offset - 1, len(data) - 1})
    bad = tmp_path / "cut.gguf"
    for cut in cut_points:
        bad.write_bytes(data[:cut])
        rc, msg = open_code(bad)
        assert rc < 0, cut
        assert "byte" in msg or "bytes" in msg, (cut, msg)


def test_corrupt_fields_are_refused(tmp_path: Path) -> None:
    good = tmp_path / "s.gguf"
    write_sample(good)
    data = bytearray(good.read_bytes())
    bad = tmp_path / "bad.gguf"
    # kv_count absurdly large
    d = bytearray(data)
    d[16:24] = (2**40).to_bytes(8, "little")
    bad.write_bytes(bytes(d))
    assert open_code(bad)[0] == lib.AOTX_E_GGUF_LIMIT
    # first metadata value type (after the first key) set to 99
    klen = int.from_bytes(data[24:32], "little")
    at = 32 + klen
    d = bytearray(data)
    d[at:at + 4] = (99).to_bytes(4, "little")
    bad.write_bytes(bytes(d))
    rc, msg = open_code(bad)
    assert rc == lib.AOTX_E_GGUF_VALUE_TYPE and f"byte {at}" in msg


def test_tensor_past_end_is_refused(tmp_path: Path) -> None:
    good = tmp_path / "s.gguf"
    write_sample(good)
    data = good.read_bytes()
    bad = tmp_path / "short.gguf"
    bad.write_bytes(data[:-40])
    rc, msg = open_code(bad)
    assert rc == lib.AOTX_E_GGUF_TENSOR and "past the end" in msg and "'" in msg


def test_real_model_table() -> None:
    r = Reader(REAL)
    try:
        assert lib.aotx_gguf_n_tensors(r.g) == 236
        i = lib.aotx_gguf_find_key(r.g, b"gemma3.attention.sliding_window")
        assert r.value(i) == 512
        i = lib.aotx_gguf_find_key(r.g, b"tokenizer.ggml.tokens")
        et, n = ffi.new("int32_t *"), ffi.new("uint64_t *")
        check(lib.aotx_gguf_arr_info(r.g, i, et, n))
        assert et[0] == lib.AOTX_GGUF_STRING and n[0] == 262144
        t = lib.aotx_gguf_find_tensor(r.g, b"token_embd.weight")
        ti = ffi.new("aotx_gguf_tensor_info *")
        check(lib.aotx_gguf_tensor(r.g, t, ti))
        assert ti.type == 8 and ti.dims[0] == 640 and ti.dims[1] == 262144
        assert ti.nbytes == 262144 * 640 // 32 * 34
    finally:
        r.close()
