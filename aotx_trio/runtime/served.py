"""The models a runtime serves: loaded from its runtime file at boot.

Every text model (a GGUF component of the runtime file) is mapped in place by
the engine (:meth:`aotx_trio.native.engine.Engine.load` with the component's extent:
no copy of the weights) before the runtime accepts mutations, with f16 KV pages when
its component has the ``kv_f16`` flag (``aotx pack`` sets it on the models it adds;
an entry without it keeps float32 KV).  The embedding
model (its files extracted once, verified, into a folder beside the journal,
then mapped by :class:`aotx_trio.native.embed.Embedder`) serves the ``embed`` call; a
folder that does not load is listed ``ready: false`` with ``not_ready:
"embedding_load_failed"``.

Each model's *artifact* (``artifact_sha256``: the GGUF's sha256, or the tree
listing sha256 of the embedding folder) and *descriptor* (the engine settings
it was loaded with) are what the runtime reports as its identity
(:meth:`ModelSet.identity`, the ``identity`` call of docs/formats/socket.md).

:meth:`ModelSet.describe` is the ``models`` list of ``/capabilities``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aotx_trio import errors
from aotx_trio.identity import DEFAULT_KV_TYPE, KV_TYPES, descriptor_sha256, tree_sha256
from aotx_trio.native.embed import Embedder
from aotx_trio.native.engine import PAGE_TOKENS, Engine
from aotx_trio.runtime.ccir import Component, RuntimeFile
from aotx_trio.runtime.validate import shown

log = logging.getLogger("aotx.models")

MAX_SEQS = 16          # KV sequence slots per text model (concurrent generations)


def _kv_type(elem_bytes: int) -> str:
    return "f16" if elem_bytes == 2 else "f32"


@dataclass
class TextModel:
    name: str
    digest: str          # sha256 of the GGUF bytes, 64 hex
    engine: Engine

    threads: int = 0
    automatic_memory: bool = False   # the component's flag: shared memory retention mode 2
    # the descriptor's kv_type as the router asked for it (None: unset, the default):
    # part of the reported descriptor only when set, so that its digest stays the
    # release's; the KV type actually served is :attr:`kv_type`
    descriptor_kv_type: str | None = None
    #: when this runtime process loaded it (unix seconds): ``/v1/models``' ``created``
    loaded_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def context(self) -> int:
        """Positions per sequence: prompt + output must fit."""
        return self.engine.info.max_tokens

    @property
    def descriptor(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": "cpu", "threads": self.threads,
                               "kv_page_tokens": self.engine.kv_stats().page_tokens,
                               "context": self.context}
        if self.descriptor_kv_type is not None:
            out["kv_type"] = self.descriptor_kv_type
        return out

    @property
    def kv_type(self) -> str:
        """``"f16"`` (binary16 K/V pages) or ``"f32"``, as the engine reports it."""
        return _kv_type(self.engine.kv_stats().elem_bytes)

    def describe(self) -> dict[str, Any]:
        kv = self.engine.kv_stats()
        info = self.engine.info
        return {"name": self.name, "kind": "text", "digest": self.digest, "ready": True,
                "not_ready": None, "arch": info.arch, "context_length": info.max_tokens,
                "kv_page_tokens": kv.page_tokens, "kv_pages": kv.n_pages,
                "kv_free_pages": kv.free_pages, "max_sequences": info.max_seqs,
                "automatic_memory": self.automatic_memory,
                "kv_type": _kv_type(kv.elem_bytes),
                "kv_page_bytes": kv.page_bytes, "loaded_at": self.loaded_at}


EMBEDDING_NAME = "embedding"
EMBEDDING_THREADS = 0


@dataclass
class EmbeddingModel:
    """The runtime file's embedding model: loaded (``embedder``) or why not."""

    name: str
    digest: str                       # the safetensors component's sha256 (capabilities)
    artifact_sha256: str              # tree listing sha256 of the whole folder
    embedder: Embedder | None = None
    not_ready: str | None = None
    threads: int = EMBEDDING_THREADS
    files: list[Component] = field(default_factory=list)
    #: when this runtime process made it (unix seconds): ``/v1/models``' ``created``
    loaded_at: int = field(default_factory=lambda: int(time.time()))

    @property
    def descriptor(self) -> dict[str, Any]:
        context = self.embedder.max_len if self.embedder is not None else 16
        return {"backend": "cpu", "threads": self.threads, "kv_page_tokens": 16,
                "context": max(16, context)}

    def get(self) -> Embedder:
        if self.embedder is None:
            raise errors.InvalidInput(f"the embedding model is not loaded ({self.not_ready})",
                                      code="unknown_model", field="model", model=self.name)
        return self.embedder


def _extract(rf: RuntimeFile, root: Path, artifact: str) -> Path:
    """The embedding folder under ``root`` (extracted and verified once; reused)."""
    dest = root / f"embedding-{artifact[:16]}"
    for old in root.glob("embedding-*"):     # another runtime file's model: not ours now
        if old != dest:
            shutil.rmtree(old, ignore_errors=True)
    if (dest / ".complete").is_file():
        return dest
    tmp = root / f".embedding-{artifact[:16]}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    rf.extract_embedding(tmp)
    (tmp / ".complete").write_text(artifact + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def load_embedding(rf: RuntimeFile, root: Path | None) -> EmbeddingModel | None:
    """The embedding model of ``rf`` (None when it has none); loaded when ``root`` (a
    folder to extract it into) is given and its files load."""
    files = rf.embedding_files
    weights = [c for c in files if c.name.endswith(".safetensors")]
    if not weights:
        return None
    artifact = tree_sha256((c.name, c.sha256_hex, c.length) for c in files)
    model = EmbeddingModel(EMBEDDING_NAME, weights[0].sha256_hex, artifact, files=files)
    if root is None:
        model.not_ready = "embedding_not_loaded"
        return model
    try:
        root.mkdir(parents=True, exist_ok=True)
        model.embedder = Embedder.load(_extract(rf, root, artifact), threads=model.threads)
        log.info("embedding model: dim %d, max %d tokens", model.embedder.dim,
                 model.embedder.max_len)
    except (errors.AotxError, OSError, ValueError, KeyError) as exc:
        log.warning("embedding model not loaded: %s", exc)
        model.not_ready = "embedding_load_failed"
    return model


class ModelSet:
    """The loaded text models by name, and the embedding model of the runtime file."""

    def __init__(self, text: dict[str, TextModel],
                 embedding: EmbeddingModel | None = None) -> None:
        self.text = text
        self.embedding = embedding or None

    @classmethod
    def load(cls, rf: RuntimeFile, *, threads: int = 0, max_seqs: int = MAX_SEQS,
             embedding_root: Path | None = None) -> ModelSet:
        """Load every text model of ``rf`` and, with ``embedding_root``, its embedding
        model (blocking: run it in a worker thread)."""
        text: dict[str, TextModel] = {}
        try:
            for c in rf.text_models:
                path, offset, length = rf.component_view(c.name)
                eng = Engine.load(path, threads=threads, max_seqs=max_seqs, offset=offset,
                                  length=length, kv_f16=c.kv_f16, name=c.name)
                text[c.name] = TextModel(c.name, c.sha256_hex, eng, threads,
                                         automatic_memory=c.automatic_memory)
                kv = eng.kv_stats()
                log.info("model %s: %s, context %d, %d KV pages of %d bytes (%s)", c.name,
                         eng.info.arch, eng.info.max_tokens, kv.n_pages, kv.page_bytes,
                         _kv_type(kv.elem_bytes))
            embedding = load_embedding(rf, embedding_root)
        except BaseException:
            for m in text.values():
                m.engine.close()
            raise
        return cls(text, embedding)

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
        e = self.embedding
        if e is not None:
            weights = next(c for c in e.files if c.name.endswith(".safetensors")).name
            row: dict[str, Any] = {"name": weights, "kind": "embedding", "digest": e.digest,
                                   "ready": e.embedder is not None, "not_ready": e.not_ready,
                                   "loaded_at": e.loaded_at}
            if e.embedder is not None:
                row.update(dim=e.embedder.dim, max_tokens=e.embedder.max_len)
            out.append(row)
        return out

    def load_gguf(self, path: Path, sha256: str, descriptor: dict[str, Any] | None,
                  name: str, *, max_seqs: int = MAX_SEQS) -> TextModel:
        """Load the GGUF file at ``path`` on demand as model ``name`` (blocking: a
        worker thread) after checking its bytes hash to ``sha256``; the descriptor's
        settings (None: the engine's defaults).  The caller adds it to :attr:`text`.
        KV pages of the descriptor's ``kv_type``: ``"f16"`` (binary16) unless it says
        ``"f32"`` (unset or a null descriptor: f16, the runtime's default, as for packed
        models).  The
        reported descriptor (:meth:`identity`) names ``kv_type`` only when the
        descriptor set it, so its ``descriptor_sha256`` is the release's; the KV type
        served is the identity row's and ``/capabilities``' ``kv_type``."""
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
        if digest.hexdigest() != sha256:
            raise errors.InvalidInput(f"{path.name} does not hash to the artifact sha256",
                                      code="artifact_mismatch", field="artifact_sha256")
        d = descriptor or {}
        if d.get("backend", "cpu") != "cpu":
            raise errors.InvalidInput("this runtime has only the cpu backend",
                                      code="backend_unavailable", field="descriptor.backend")
        kv_type = d.get("kv_type")
        if kv_type not in (None, *KV_TYPES):
            raise errors.InvalidInput(f"descriptor.kv_type must be one of {list(KV_TYPES)}",
                                      field="descriptor.kv_type")
        threads = int(d.get("threads", 0))
        eng = Engine.load(path, threads=threads, max_seqs=max_seqs,
                          max_tokens=int(d.get("context", 0)),
                          page_tokens=int(d.get("kv_page_tokens", PAGE_TOKENS)),
                          kv_f16=(kv_type or DEFAULT_KV_TYPE) == "f16")
        log.info("model %s loaded on demand: %s, context %d, %s KV", name, eng.info.arch,
                 eng.info.max_tokens, _kv_type(eng.kv_stats().elem_bytes))
        return TextModel(name, sha256, eng, threads, descriptor_kv_type=kv_type)

    def identity(self) -> list[dict[str, Any]]:
        """Every loaded artifact: name, kind, artifact_sha256, descriptor (+ sha256);
        a text model adds ``kv_type``, the element type of the KV pages it is served
        with (whether or not its descriptor names one)."""
        out: list[dict[str, Any]] = []
        for m in self.text.values():
            out.append({"name": m.name, "kind": "textgen", "artifact_sha256": m.digest,
                        "descriptor": m.descriptor,
                        "descriptor_sha256": descriptor_sha256(m.descriptor),
                        "kv_type": m.kv_type})
        e = self.embedding
        if e is not None and e.embedder is not None:
            out.append({"name": e.name, "kind": "embedding",
                        "artifact_sha256": e.artifact_sha256, "descriptor": e.descriptor,
                        "descriptor_sha256": descriptor_sha256(e.descriptor)})
        return out

    def close(self) -> None:
        for m in self.text.values():
            m.engine.close()
        if self.embedding is not None and self.embedding.embedder is not None:
            self.embedding.embedder.close()
