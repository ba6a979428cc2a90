"""The models a runtime serves: loaded from its runtime file at boot.

Every text model (a GGUF component of the runtime file) is mapped in place by
the engine (:meth:`aotx_trio.engine.Engine.load` with the component's extent:
no copy of the weights) before the runtime accepts mutations.  The embedding
model is listed but not loaded yet: memory and embeddings come with the
memory issue (``ready: false``, ``not_ready: "embedding_not_loaded"``).

:meth:`ModelSet.describe` is the ``models`` list of ``/capabilities``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aotx_trio import errors
from aotx_trio.engine import Engine
from aotx_trio.runtime.ccir import Component, RuntimeFile
from aotx_trio.runtime.validate import shown

log = logging.getLogger("aotx.models")

MAX_SEQS = 16          # KV sequence slots per text model (concurrent generations)


@dataclass
class TextModel:
    name: str
    digest: str          # sha256 of the GGUF bytes, 64 hex
    engine: Engine

    @property
    def context(self) -> int:
        """Positions per sequence: prompt + output must fit."""
        return self.engine.info.max_tokens

    def describe(self) -> dict[str, Any]:
        kv = self.engine.kv_stats()
        info = self.engine.info
        return {"name": self.name, "kind": "text", "digest": self.digest, "ready": True,
                "not_ready": None, "arch": info.arch, "context_length": info.max_tokens,
                "kv_page_tokens": kv.page_tokens, "kv_pages": kv.n_pages,
                "kv_free_pages": kv.free_pages, "max_sequences": info.max_seqs}


class ModelSet:
    """The loaded text models by name, and the embedding files of the runtime file."""

    def __init__(self, text: dict[str, TextModel], embedding: list[Component]) -> None:
        self.text = text
        self.embedding = embedding

    @classmethod
    def load(cls, rf: RuntimeFile, *, threads: int = 0, max_seqs: int = MAX_SEQS) -> ModelSet:
        """Load every text model of ``rf`` (blocking: run it in a worker thread)."""
        text: dict[str, TextModel] = {}
        try:
            for c in rf.text_models:
                path, offset, length = rf.component_view(c.name)
                eng = Engine.load(path, threads=threads, max_seqs=max_seqs, offset=offset,
                                  length=length)
                text[c.name] = TextModel(c.name, c.sha256_hex, eng)
                log.info("model %s: %s, context %d, %d KV pages", c.name, eng.info.arch,
                         eng.info.max_tokens, eng.kv_stats().n_pages)
        except BaseException:
            for m in text.values():
                m.engine.close()
            raise
        return cls(text, [c for c in rf.embedding_files if c.name.endswith(".safetensors")])

    def __iter__(self) -> Iterator[TextModel]:
        return iter(self.text.values())

    def get(self, name: str) -> TextModel:
        """The text model called ``name``; 422 ``unknown_model`` naming it otherwise."""
        model = self.text.get(name)
        if model is None:
            raise errors.InvalidInput(f"unknown model {shown(name)} (this runtime serves "
                                      f"{sorted(self.text)})", code="unknown_model",
                                      field="model", model=name[:128])
        return model

    def describe(self) -> list[dict[str, Any]]:
        out = [m.describe() for m in self.text.values()]
        out += [{"name": c.name, "kind": "embedding", "digest": c.sha256_hex, "ready": False,
                 "not_ready": "embedding_not_loaded"} for c in self.embedding]
        return out

    def close(self) -> None:
        for m in self.text.values():
            m.engine.close()
