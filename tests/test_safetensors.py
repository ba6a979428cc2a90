"""aotx_trio/native/_safetensors.py: the mapped safetensors reader (header, shapes, offsets)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from reference_bert import write_safetensors

from aotx_trio import errors
from aotx_trio.native._safetensors import SafeTensors


def raw_file(path: Path, header: object, data: bytes = b"") -> Path:
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data)
    return path


def test_tensors_are_views_of_the_file(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.linspace(-1, 1, 5, dtype=np.float32)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"a": a, "b": b})
    st = SafeTensors(path)
    assert st.names() == ["a", "b"]                   # __metadata__ is not a tensor
    np.testing.assert_array_equal(st.tensor("a", (3, 4)), a)
    np.testing.assert_array_equal(st.tensor("b", (5,)), b)
    assert not st.tensor("a", (3, 4)).flags.writeable


def test_an_unaligned_tensor_is_copied(tmp_path: Path) -> None:
    x = np.array([1.5, -2.25, 3.0], dtype=np.float32)
    header = {"x": {"dtype": "F32", "shape": [3], "data_offsets": [1, 13]}}
    head = json.dumps(header).encode()
    head += b" " * ((-len(head)) % 8)                  # data starts 8-aligned, x at +1
    path = tmp_path / "u.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"\0" + x.tobytes())
    got = SafeTensors(path).tensor("x", (3,))
    np.testing.assert_array_equal(got, x)
    assert got.ctypes.data % 4 == 0


@pytest.mark.parametrize(("entry", "data", "code"), [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, b"\0" * 4, "safetensors_corrupt"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, -8]}, b"\0" * 8, "safetensors_corrupt"),
    ({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}, b"\0" * 8, "safetensors_corrupt"),
    ({"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}, b"\0" * 4,
     "embed_dtype_unsupported"),
    ({"dtype": "F32", "shape": [3], "data_offsets": [0, 12]}, b"\0" * 12, "embed_shape_invalid"),
])
def test_malformed_entries_are_named(tmp_path: Path, entry: object, data: bytes,
                                     code: str) -> None:
    st = SafeTensors(raw_file(tmp_path / "t.safetensors", {"x": entry}, data))
    with pytest.raises(errors.FormatError) as info:
        st.tensor("x", (2,))
    assert info.value.code == code and info.value.fields["tensor"] == "x"


def test_a_header_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.FormatError) as info:
        SafeTensors(raw_file(tmp_path / "h.safetensors", [1, 2]))
    assert info.value.code == "safetensors_corrupt" and info.value.fields["offset"] == 8


def test_short_files_and_missing_tensors(tmp_path: Path) -> None:
    short = tmp_path / "s.safetensors"
    short.write_bytes(b"\1\2\3")
    with pytest.raises(errors.FormatError) as info:
        SafeTensors(short)
    assert info.value.code == "safetensors_truncated"
    long_header = tmp_path / "l.safetensors"
    long_header.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(errors.FormatError) as info:
        SafeTensors(long_header)
    assert info.value.code == "safetensors_truncated"
    st = SafeTensors(raw_file(tmp_path / "e.safetensors", {}))
    with pytest.raises(errors.FormatError) as info:
        st.tensor("nope", (1,))
    assert info.value.code == "embed_tensor_missing"
