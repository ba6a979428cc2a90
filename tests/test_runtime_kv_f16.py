"""The runtime file's ``kv_f16`` flag reaches the engine: a text model whose entry has
it is served with binary16 KV pages (elem_bytes 2, half the page bytes), one without it
(a file packed before the flag, or ``--kv-f32``) with float32 KV; ``/capabilities``
lists the KV type per model.  A model loaded on demand (``ModelSet.load_gguf``, the
router's descriptor) gets the descriptor's ``kv_type``: f16 unless it says f32."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import synth_gguf as sg
from _gateway_env import TINY

from aotx_trio import errors
from aotx_trio.identity import descriptor_sha256
from aotx_trio.runtime import ccir
from aotx_trio.runtime.ccir import KIND_TEXT_MODEL_GGUF, RuntimeFile, Source
from aotx_trio.runtime.pack import pack
from aotx_trio.runtime.served import ModelSet


def _gguf(tmp_path: Path, name: str) -> Path:
    return sg.write_model(tmp_path / name, TINY)


def test_models_load_with_the_kv_type_of_their_flag(tmp_path: Path) -> None:
    old = _gguf(tmp_path, "old.gguf")
    new = _gguf(tmp_path, "new.gguf")
    # written as a runtime file from before the flag: flags 0 on "old.gguf"
    target = tmp_path / "r.aotxccir"
    ccir.write_runtime(target, [
        Source(KIND_TEXT_MODEL_GGUF, "new.gguf", new, 0, new.stat().st_size,
               flags=ccir.FLAG_KV_F16),
        Source(KIND_TEXT_MODEL_GGUF, "old.gguf", old, 0, old.stat().st_size),
    ], required=0, optional=0, lineage=bytes(16), progress=False)
    models = ModelSet.load(RuntimeFile.open(target), max_seqs=2)
    try:
        new_kv = models.get("new.gguf").engine.kv_stats()
        old_kv = models.get("old.gguf").engine.kv_stats()
        assert (new_kv.elem_bytes, old_kv.elem_bytes) == (2, 4)
        assert new_kv.page_bytes * 2 == old_kv.page_bytes
        # the default pool is a memory budget: half-size pages, twice as many
        assert new_kv.n_pages == 2 * old_kv.n_pages
        assert new_kv.n_pages * new_kv.page_bytes == old_kv.n_pages * old_kv.page_bytes
        rows = {m["name"]: m for m in models.describe()}
        assert (rows["new.gguf"]["kv_type"], rows["old.gguf"]["kv_type"]) == ("f16", "f32")
        assert rows["new.gguf"]["kv_page_bytes"] == new_kv.page_bytes
        assert models.get("new.gguf").kv_type == "f16"
        # both generate (greedy, a few tokens) from the same prompt
        for name in ("new.gguf", "old.gguf"):
            eng = models.get(name).engine
            b"".join(eng.generate("hello", max_tokens=4))
            assert len(eng.last.tokens) >= 1
    finally:
        models.close()


def test_a_packed_model_is_served_with_f16_kv_unless_kv_f32(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path, "tiny.gguf")
    target = tmp_path / "p.aotxccir"
    pack(target, models=[gguf], progress=False)
    models = ModelSet.load(RuntimeFile.open(target), max_seqs=2)
    try:
        assert models.get("tiny.gguf").engine.kv_stats().elem_bytes == 2
    finally:
        models.close()
    pack(target, kv_f32=["tiny.gguf"], progress=False)
    models = ModelSet.load(RuntimeFile.open(target), max_seqs=2)
    try:
        assert models.get("tiny.gguf").engine.kv_stats().elem_bytes == 4
        assert models.describe()[0]["kv_type"] == "f32"
    finally:
        models.close()


def test_a_model_loaded_on_demand_gets_the_kv_type_of_its_descriptor(tmp_path: Path) -> None:
    gguf = _gguf(tmp_path, "od.gguf")
    sha = hashlib.sha256(gguf.read_bytes()).hexdigest()
    models = ModelSet({})
    cases: list[tuple[dict[str, Any] | None, str]] = [
        (None, "f16"),                                         # the engine's defaults
        ({"backend": "cpu", "kv_page_tokens": 8, "context": 256}, "f16"),   # unset
        ({"kv_type": None, "context": 256}, "f16"),
        ({"kv_type": "f16", "context": 256}, "f16"),
        ({"kv_type": "f32", "context": 256}, "f32"),
    ]
    pages = {}
    for desc, want in cases:
        m = models.load_gguf(gguf, sha, desc, f"artifact-{sha[:16]}", max_seqs=2)
        models.text[m.name] = m
        try:
            kv = m.engine.kv_stats()
            assert kv.elem_bytes == {"f16": 2, "f32": 4}[want], desc
            pages[want] = kv.page_bytes
            assert m.kv_type == want and m.describe()["kv_type"] == want
            assert m.describe()["kv_page_bytes"] == kv.page_bytes
            [row] = models.identity()
            assert row["kv_type"] == want
            # the reported descriptor names kv_type only when the router's did, so its
            # digest is the release's
            set_kv = (desc or {}).get("kv_type")
            assert row["descriptor"].get("kv_type") == set_kv
            assert ("kv_type" in row["descriptor"]) == (set_kv is not None)
            if desc is not None:
                assert row["descriptor_sha256"] == descriptor_sha256(
                    {**desc, "threads": 0, "kv_page_tokens": 8})
            b"".join(m.engine.generate("hello", max_tokens=2))
        finally:
            models.text.pop(m.name)
            m.engine.close()
    assert pages["f16"] * 2 == pages["f32"]
    with pytest.raises(errors.InvalidInput) as got:
        models.load_gguf(gguf, sha, {"kv_type": "bf16"}, "artifact-bad")
    assert got.value.fields["field"] == "descriptor.kv_type"
    assert models.text == {}


def test_aotx_serve_packs_the_default_models_with_f16_kv_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh data folder: ``aotx serve`` packs the default models, with the kv_f16
    flag; an existing runtime file is left as it is (no repack, flag or not)."""
    from aotx_trio import default_models, serve

    gguf = _gguf(tmp_path, "gemma-stand-in.gguf")
    emb = tmp_path / "emb"
    emb.mkdir()
    (emb / "config.json").write_text("{}")
    (emb / "tokenizer.json").write_text("{}")
    (emb / "model.safetensors").write_bytes(bytes(16))
    chat = _gguf(tmp_path, "SmolLM2-stand-in.gguf")
    monkeypatch.setattr(default_models, "default_text_model", lambda: gguf)
    monkeypatch.setattr(default_models, "default_chat_model", lambda: chat)
    monkeypatch.setattr(default_models, "default_embedding_model", lambda: emb)
    data = tmp_path / "data"
    data.mkdir()
    target = serve.ensure_runtime(data)
    rf = RuntimeFile.open(target)
    # the chat model first: the runtime's first text model is default/text
    assert [(c.name, c.kv_f16) for c in rf.text_models] == [("SmolLM2-stand-in.gguf", True),
                                                            ("gemma-stand-in.gguf", True)]
    assert rf.shared
    before = target.stat().st_mtime_ns, target.read_bytes()
    assert serve.ensure_runtime(data) == target
    assert (target.stat().st_mtime_ns, target.read_bytes()) == before

    # a data folder whose file was packed before the flag keeps float32 KV
    old = tmp_path / "old-data"
    old.mkdir()
    pack(old / serve.RUNTIME_NAME, models=[gguf], embedding=emb, shared=True,
         kv_f32=["gemma-stand-in.gguf"], progress=False)
    rf = RuntimeFile.open(serve.ensure_runtime(old))
    assert [c.flags for c in rf.text_models] == [0]
