"""The safetensors reader of the embedding loader (docs/embeddings.md, "Safetensors").

Bytes 0..8: u64 little-endian header length N; bytes 8..8+N: a JSON object
``name -> {"dtype", "shape", "data_offsets"}``; data after it.  The file is
mapped read-only and tensors are handed out as numpy views of the map.
"""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from aotx_trio import errors

F32Array = npt.NDArray[np.float32]


def is_uint(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


class SafeTensors:
    """A safetensors file mapped read-only: u64 LE header length, JSON header, data."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        size = len(self._map)
        if size < 8:
            raise errors.FormatError(f"{path}: {size} bytes, shorter than the 8-byte header length",
                                     code="safetensors_truncated", offset=0)
        (n,) = struct.unpack_from("<Q", self._map, 0)
        if n > size - 8:
            raise errors.FormatError(f"{path}: header length {n} runs past the end ({size} bytes)",
                                     code="safetensors_truncated", offset=0)
        try:
            header = json.loads(bytes(self._map[8:8 + n]))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise errors.FormatError(f"{path}: header JSON is malformed: {exc}",
                                     code="safetensors_corrupt", offset=8) from exc
        if not isinstance(header, dict):
            raise errors.FormatError(f"{path}: header is not a JSON object",
                                     code="safetensors_corrupt", offset=8)
        header.pop("__metadata__", None)
        self.data_start = 8 + n
        self.header: dict[str, Any] = header

    def names(self) -> list[str]:
        return list(self.header)

    def tensor(self, name: str, shape: tuple[int, ...]) -> F32Array:
        """The F32 tensor ``name`` (shape checked) as a read-only view of the map."""
        entry = self.header.get(name)
        if not isinstance(entry, dict):
            raise errors.FormatError(f"{self.path}: tensor {name!r} is missing",
                                     code="embed_tensor_missing", tensor=name)
        dtype = entry.get("dtype")
        if dtype != "F32":
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has dtype {dtype!r}; only F32 is supported",
                code="embed_dtype_unsupported", tensor=name)
        raw_shape = entry.get("shape")
        if not (isinstance(raw_shape, list) and all(is_uint(d) for d in raw_shape)):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has shape {raw_shape!r}, not a list of "
                "non-negative integers", code="safetensors_corrupt", tensor=name)
        got = tuple(raw_shape)
        if got != shape:
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} has shape {list(got)}, config needs {list(shape)}",
                code="embed_shape_invalid", tensor=name)
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(is_uint, offsets))):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} data_offsets {offsets!r} are not two "
                "non-negative integers", code="safetensors_corrupt", tensor=name)
        begin, end = offsets
        count = int(np.prod(shape))
        start = self.data_start + int(begin)
        if int(end) - int(begin) != 4 * count or start + 4 * count > len(self._map):
            raise errors.FormatError(
                f"{self.path}: tensor {name!r} data_offsets {[begin, end]} do not hold "
                f"{count} floats inside the file", code="safetensors_corrupt",
                tensor=name, offset=start)
        arr = np.frombuffer(self._map, dtype="<f4", count=count, offset=start).reshape(shape)
        if start % 4:  # unaligned floats: C wants aligned pointers
            arr = arr.copy()
        return arr
