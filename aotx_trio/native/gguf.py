"""A GGUF file's metadata and tensor table, read by the native reader
(csrc/engine/aotx_gguf.h: bounds-checked, mapped, nothing copied but what is asked).

Used where a model's file is looked at without loading it: ``aotx pack`` checks that
the engine can run it (:func:`check_supported`), and the engine reads the
``tokenizer.chat_template`` string (runtime/prompt.py renders it)::

    with GGUFFile.open(path) as g:
        g.string("general.architecture")      # "llama"
        [(t.name, t.type_name) for t in g.tensors()]
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aotx_trio import errors
from aotx_trio.native.lib import check, ffi, lib
from aotx_trio.native.tokenizer import PRE_NAMES

_ERR_CAP = 512

#: ggml's tensor type numbers and names (the public GGUF numbering); the kernels run
#: only some of them (:func:`supported_types`).
TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
    17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
    23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
    30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}
#: general.architecture values the engine runs (mistral is the llama graph)
ARCHITECTURES = ("gemma3", "llama", "mistral", "qwen2")
#: tokenizer.ggml.model values the tokenizer builds
TOKENIZER_MODELS = ("llama", "gpt2")


def type_name(t: int) -> str:
    return TYPE_NAMES.get(t, f"type {t}")


def supported_types(matrix: bool) -> list[int]:
    """The tensor types the kernels run: as a weight matrix (a matmul and its prepared
    activations) or, ``matrix`` False, as a vector (dequantized once at load)."""
    out = []
    for t in TYPE_NAMES:
        elems = int(lib.aotx_type_block_elems(t))
        if elems <= 0:
            continue
        if not matrix or int(lib.aotx_act_bytes(t, elems, 1)) > 0:
            out.append(t)
    return out


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type: int
    dims: tuple[int, ...]

    @property
    def type_name(self) -> str:
        return type_name(self.type)


class GGUFFile:
    """An open GGUF (the whole file or an extent of it); close it (or use ``with``)."""

    def __init__(self, handle: Any, name: str) -> None:
        self._g: Any = handle
        self.name = name

    @classmethod
    def open(cls, path: str | os.PathLike[str], offset: int = 0, length: int = 0) -> GGUFFile:
        """Map bytes [offset, offset + length) of ``path`` (length 0: to the end)."""
        out = ffi.new("aotx_gguf **")
        err = ffi.new("char[]", _ERR_CAP)
        rc = lib.aotx_gguf_open_range(os.fsencode(path), offset, length, out, err, _ERR_CAP)
        check(rc, f"{os.fspath(path)}: {ffi.string(err).decode(errors='replace')}")
        return cls(out[0], os.path.basename(os.fspath(path)))

    def close(self) -> None:
        if self._g is not None:
            lib.aotx_gguf_close(self._g)
            self._g = None

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def string(self, key: str) -> str | None:
        """A string value (None when the key is absent or not a string)."""
        i = lib.aotx_gguf_find_key(self._g, key.encode())
        if i < 0 or lib.aotx_gguf_kv_type(self._g, i) != lib.AOTX_GGUF_STRING:
            return None
        ptr = ffi.new("const char **")
        n = ffi.new("uint64_t *")
        check(lib.aotx_gguf_get_str(self._g, i, ptr, n), key)
        return bytes(ffi.buffer(ptr[0], n[0])).decode("utf-8", errors="replace")

    def tensors(self) -> Iterator[TensorInfo]:
        info = ffi.new("aotx_gguf_tensor_info *")
        for i in range(int(lib.aotx_gguf_n_tensors(self._g))):
            check(lib.aotx_gguf_tensor(self._g, i, info))
            dims = tuple(int(info.dims[d]) for d in range(int(info.n_dims)))
            yield TensorInfo(ffi.string(info.name).decode(errors="replace"), int(info.type),
                             dims)


def _names(types: list[int]) -> str:
    return ", ".join(type_name(t) for t in types)


def check_supported(g: GGUFFile) -> None:
    """Refuse (``UnsupportedProfile``, naming what is wrong and what is supported) a
    model the engine cannot run: its architecture, its tokenizer (model and byte-level
    pre-tokenizer) or a tensor's type."""
    arch = g.string("general.architecture")
    if arch not in ARCHITECTURES:
        raise errors.UnsupportedProfile(
            f"{g.name}: general.architecture {arch!r} is not supported (supported: "
            f"{', '.join(ARCHITECTURES)})", code="architecture_unsupported",
            field="general.architecture")
    kind = g.string("tokenizer.ggml.model")
    if kind is not None and kind not in TOKENIZER_MODELS:
        raise errors.UnsupportedProfile(
            f"{g.name}: tokenizer.ggml.model {kind!r} is not supported (supported: "
            f"{', '.join(TOKENIZER_MODELS)})", code="tokenizer_unsupported",
            field="tokenizer.ggml.model")
    pre = g.string("tokenizer.ggml.pre")
    if kind == "gpt2" and pre is not None and pre not in PRE_NAMES:
        raise errors.UnsupportedProfile(
            f"{g.name}: tokenizer.ggml.pre {pre!r} is not supported (supported: "
            f"{', '.join(PRE_NAMES)})", code="tokenizer_pre_unsupported",
            field="tokenizer.ggml.pre")
    matrix, vector = supported_types(True), supported_types(False)
    for t in g.tensors():
        ok = matrix if len(t.dims) >= 2 else vector
        if t.type not in ok:
            shape = "matrix" if len(t.dims) >= 2 else "vector"
            raise errors.UnsupportedProfile(
                f"{g.name}: tensor {t.name} has type {t.type_name}, which the kernels do not "
                f"run as a {shape} (supported: {_names(ok)})",
                code="tensor_type_unsupported", field="tensor_type", tensor=t.name,
                tensor_type=t.type_name)
