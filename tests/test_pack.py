"""``aotx pack``: new files, --shared in place, component updates, determinism."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import mmap
import os
import tempfile
from pathlib import Path

import gguf
import pytest
import synth_gguf as sg

from aotx_trio import cli
from aotx_trio.errors import FormatError, InvalidInput, UnsupportedProfile
from aotx_trio.runtime import ccir
from aotx_trio.runtime.ccir import RuntimeFile
from aotx_trio.runtime.pack import pack

TINY = sg.Spec(d_model=64, n_layers=1, d_ff=128, n_heads=2, n_kv_heads=1, head_dim=32,
               window=8, n_vocab=300, types=(sg.Q.F32,), embd_type=sg.Q.F32)


def _tiny(spec: sg.Spec) -> bytes:
    """The bytes of a small real GGUF (pack refuses what the engine cannot run)."""
    with tempfile.TemporaryDirectory() as d:
        return sg.write_model(Path(d) / "m.gguf", spec).read_bytes()


GGUF_A = _tiny(TINY)
GGUF_B = _tiny(dataclasses.replace(TINY, seed=1))
LINEAGE = "00112233445566778899aabbccddeeff"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    src = tmp_path / "src"
    (src / "emb" / "1_Pooling").mkdir(parents=True)
    (src / "a.gguf").write_bytes(GGUF_A)
    (src / "b.gguf").write_bytes(GGUF_B)
    emb = src / "emb"
    (emb / "config.json").write_text('{"hidden_size": 384}')
    (emb / "tokenizer.json").write_text('{"model": {"type": "WordPiece"}}')
    (emb / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (emb / "1_Pooling" / "config.json").write_text('{"pooling_mode_mean_tokens": true}')
    (emb / "modules.json").write_text("[]")
    return {"a": src / "a.gguf", "b": src / "b.gguf", "emb": emb, "out": tmp_path / "out"}


def _names(rf: RuntimeFile) -> list[str]:
    return [c.name for c in rf.components]


def test_new_file_holds_models_and_embedding_in_canonical_order(inputs: dict[str, Path]) -> None:
    inputs["out"].mkdir()
    rf = pack(inputs["out"] / "r.aotxccir", models=[inputs["b"], inputs["a"]],
              embedding=inputs["emb"], progress=False)
    assert _names(rf) == ["a.gguf", "b.gguf", "1_Pooling/config.json", "config.json",
                          "model.safetensors", "modules.json", "tokenizer.json"]
    assert [c.kind_name for c in rf.components][:2] == ["text_model_gguf"] * 2
    assert rf.read_component("a.gguf") == GGUF_A
    assert rf.read_component("1_Pooling/config.json") == b'{"pooling_mode_mean_tokens": true}'
    assert not rf.shared
    rf.verify(progress=False)


def test_packing_twice_gives_identical_bytes(inputs: dict[str, Path], tmp_path: Path) -> None:
    one = pack(tmp_path / "1.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
               progress=False)
    two = pack(tmp_path / "2.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
               progress=False)
    assert one.path.read_bytes() == two.path.read_bytes()
    s1 = pack(tmp_path / "s1.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
              shared=True, lineage=LINEAGE, progress=False)
    s2 = pack(tmp_path / "s2.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
              shared=True, lineage=LINEAGE, progress=False)
    assert s1.path.read_bytes() == s2.path.read_bytes()
    assert s1.lineage == LINEAGE


def test_shared_lineage_is_random_unless_pinned(inputs: dict[str, Path], tmp_path: Path) -> None:
    r1 = pack(tmp_path / "1.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
              shared=True, progress=False)
    r2 = pack(tmp_path / "2.aotxccir", models=[inputs["a"]], embedding=inputs["emb"],
              shared=True, progress=False)
    assert r1.shared and r2.shared
    assert r1.lineage != r2.lineage and r1.lineage != "0" * 32
    assert len(r1.lineage) == 32


def test_shared_on_existing_file_reuses_extents(inputs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "r.aotxccir"
    before = pack(path, models=[inputs["a"]], embedding=inputs["emb"], progress=False)
    raw_before = path.read_bytes()
    ino = path.stat().st_ino
    after = pack(path, shared=True, progress=False)
    raw_after = path.read_bytes()
    assert path.stat().st_ino == ino  # rewritten in place, not replaced
    assert after.shared and after.lineage != "0" * 32
    assert [(c.name, c.offset, c.length, c.sha256) for c in after.components] == \
        [(c.name, c.offset, c.length, c.sha256) for c in before.components]
    assert len(raw_after) == len(raw_before)
    assert raw_after[ccir.HEADER_SIZE:] == raw_before[ccir.HEADER_SIZE:]
    assert raw_after[:ccir.HEADER_SIZE] != raw_before[:ccir.HEADER_SIZE]
    # Repeating --shared changes nothing at all.
    digest, mtime = _sha(path), path.stat().st_mtime_ns
    again = pack(path, shared=True, progress=False)
    assert _sha(path) == digest and path.stat().st_mtime_ns == mtime
    assert again.lineage == after.lineage
    # Pinning the same lineage is a no-op too; a different one is refused.
    pack(path, shared=True, lineage=after.lineage, progress=False)
    with pytest.raises(InvalidInput) as info:
        pack(path, shared=True, lineage=LINEAGE, progress=False)
    assert info.value.code == "lineage_conflict"
    assert _sha(path) == digest


def test_shared_via_cli_is_byte_identical_on_repeat(inputs: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "identity.aotxccir"
    assert cli.main(["pack", "--runtime", str(path), "--model", str(inputs["a"]),
                     "--embedding", str(inputs["emb"])]) == 0
    assert cli.main(["pack", "--runtime", str(path), "--shared"]) == 0
    digest = _sha(path)
    assert cli.main(["pack", "--runtime", str(path), "--shared"]) == 0
    assert _sha(path) == digest
    out = capsys.readouterr().out
    assert "profile: shared_state" in out and "a.gguf" in out


def test_model_update_keeps_profile_and_other_components(inputs: dict[str, Path],
                                                         tmp_path: Path) -> None:
    path = tmp_path / "r.aotxccir"
    first = pack(path, models=[inputs["a"]], embedding=inputs["emb"], shared=True,
                 lineage=LINEAGE, progress=False)
    emb_before = {c.name: c.sha256 for c in first.embedding_files}
    second = pack(path, models=[inputs["b"]], progress=False)
    assert _names(second)[:2] == ["a.gguf", "b.gguf"]
    assert second.lineage == LINEAGE and second.shared
    assert {c.name: c.sha256 for c in second.embedding_files} == emb_before
    second.verify(progress=False)
    # Replacing a.gguf by a file with the same name and other bytes.
    newer = tmp_path / "a.gguf"
    newer.write_bytes(GGUF_B)
    third = pack(path, models=[newer], progress=False)
    assert third.read_component("a.gguf") == GGUF_B
    assert _names(third)[:2] == ["a.gguf", "b.gguf"]
    # The same result as packing those inputs fresh.
    fresh = pack(tmp_path / "fresh.aotxccir", models=[newer, inputs["b"]],
                 embedding=inputs["emb"], shared=True, lineage=LINEAGE, progress=False)
    assert fresh.path.read_bytes() == path.read_bytes()


def test_embedding_update_replaces_the_whole_set(inputs: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "r.aotxccir"
    pack(path, models=[inputs["a"]], embedding=inputs["emb"], progress=False)
    emb2 = tmp_path / "emb2"
    emb2.mkdir()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        (emb2 / name).write_bytes((inputs["emb"] / name).read_bytes())
    rf = pack(path, embedding=emb2, progress=False)
    assert _names(rf) == ["a.gguf", "config.json", "model.safetensors", "tokenizer.json"]


def test_hidden_files_are_skipped_and_tokens_never_enter_the_file(
        inputs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = "aotx-secret-token-6f1c2b"
    token_hash = hashlib.sha256(token.encode()).hexdigest()
    monkeypatch.setenv("AOTX_TOKEN", token)
    (inputs["emb"] / ".env").write_text(f"TOKEN={token}\n")
    (inputs["emb"] / ".cache").mkdir()
    (inputs["emb"] / ".cache" / "t").write_text(token)
    deep = tmp_path / f"dir-{token}"
    deep.mkdir()
    model = deep / "m.gguf"
    model.write_bytes(GGUF_A)
    (tmp_path / "gateway.json").write_text(json.dumps({"principals": [
        {"name": "alice", "token_sha256": token_hash, "actions": ["shared_read"]}]}))
    rf = pack(tmp_path / "r.aotxccir", models=[model], embedding=inputs["emb"], shared=True,
              progress=False)
    raw = rf.path.read_bytes()
    assert ".env" not in _names(rf) and not any(n.startswith(".cache") for n in _names(rf))
    for needle in (token, token_hash, str(tmp_path), "alice"):
        assert needle.encode() not in raw, needle


def test_refusals_leave_no_file(inputs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.aotxccir"
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip, not a model")
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[not_gguf], progress=False)
    assert info.value.code == "model_invalid" and info.value.fields["field"] == "model"
    not_gguf.write_bytes(b"GGUF\x03\x00\x00\x00 and then nothing a GGUF holds")
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[not_gguf], progress=False)
    assert info.value.code == "model_invalid" and "not a readable GGUF" in info.value.message
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[tmp_path / "missing.gguf"], progress=False)
    assert info.value.code == "model_missing"
    with pytest.raises(InvalidInput) as info:
        pack(out, progress=False)
    assert info.value.code == "runtime_empty"
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[inputs["a"]], shared=True, progress=False)
    assert info.value.code == "embedding_missing"
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[inputs["a"]], lineage=LINEAGE, progress=False)
    assert info.value.code == "lineage_invalid"
    with pytest.raises(InvalidInput):
        pack(out, models=[inputs["a"]], embedding=inputs["emb"], shared=True, lineage="0" * 32,
             progress=False)
    bad_emb = tmp_path / "bad_emb"
    bad_emb.mkdir()
    (bad_emb / "config.json").write_text("{}")
    with pytest.raises(InvalidInput) as info:
        pack(out, embedding=bad_emb, progress=False)
    assert "tokenizer.json" in info.value.message and "safetensors" in info.value.message
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_shared_on_a_file_without_embedding_is_refused(inputs: dict[str, Path],
                                                       tmp_path: Path) -> None:
    path = tmp_path / "r.aotxccir"
    pack(path, models=[inputs["a"]], progress=False)
    digest = _sha(path)
    with pytest.raises(InvalidInput) as info:
        pack(path, shared=True, progress=False)
    assert "--embedding" in info.value.message
    assert _sha(path) == digest


def test_foreign_or_damaged_target_is_never_overwritten(inputs: dict[str, Path],
                                                        tmp_path: Path) -> None:
    foreign = tmp_path / "r.aotxccir"
    foreign.write_bytes(GGUF_A)
    with pytest.raises(FormatError):
        pack(foreign, models=[inputs["a"]], progress=False)
    assert foreign.read_bytes() == GGUF_A
    path = tmp_path / "d.aotxccir"
    rf = pack(path, models=[inputs["a"]], embedding=inputs["emb"], progress=False)
    raw = bytearray(path.read_bytes())
    raw[rf.component("a.gguf").offset + 100] ^= 0xFF
    path.write_bytes(raw)
    with pytest.raises(FormatError) as info:
        pack(path, shared=True, progress=False)
    assert info.value.code == "ccir_digest_mismatch"
    with pytest.raises(FormatError):
        pack(path, models=[inputs["b"]], progress=False)
    assert path.read_bytes() == raw


@pytest.mark.slow
def test_real_default_models_pack_and_share(tmp_path: Path) -> None:
    from aotx_trio.default_models import default_embedding_model, default_text_model

    gguf = default_text_model()
    emb = default_embedding_model()
    path = tmp_path / "identity.aotxccir"
    rf = pack(path, models=[gguf], embedding=emb, progress=False)
    assert rf.text_models[0].name == "gemma-3-270m-q4_k_m.gguf"
    assert rf.text_models[0].sha256_hex == \
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert "1_Pooling/config.json" in _names(rf) and "model.safetensors" in _names(rf)
    table_before = path.read_bytes()[ccir.HEADER_SIZE:rf.header.table_end]
    shared = pack(path, shared=True, progress=False)
    assert path.read_bytes()[ccir.HEADER_SIZE:rf.header.table_end] == table_before
    assert [c.offset for c in shared.components] == [c.offset for c in rf.components]
    p, off, _length = shared.component_view(shared.text_models[0].name)
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[off:off + 4] == b"GGUF" and off % mmap.PAGESIZE == 0
    out = shared.extract_embedding(tmp_path / "emb")
    assert _sha(out / "model.safetensors") == _sha(emb / "model.safetensors")
    assert os.path.getsize(path) == shared.header.file_length


def test_unknown_optional_bits_survive_header_updates_only(inputs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    import struct

    path = tmp_path / "r.aotxccir"
    pack(path, models=[inputs["a"]], embedding=inputs["emb"], progress=False)
    raw = bytearray(path.read_bytes())
    struct.pack_into("<Q", raw, 24, 1 << 5)
    struct.pack_into("<I", raw, 124, ccir.crc32c(bytes(raw[:124])))
    path.write_bytes(raw)
    shared = pack(path, shared=True, progress=False)
    assert shared.profile.optional == 1 << 5 and shared.shared
    updated = pack(path, models=[inputs["b"]], progress=False)
    assert updated.profile.optional == 0 and updated.lineage == shared.lineage


def test_auto_memory_flag_is_set_and_cleared_by_rewriting_the_table(
        inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--auto-memory MODEL`` / ``--no-auto-memory MODEL``: the text model's flag,
    through the rewrite path (same extents, same lineage); a replaced model keeps it."""
    path = tmp_path / "auto.aotxccir"
    rf = pack(path, models=[inputs["a"], inputs["b"]], embedding=inputs["emb"], shared=True,
              lineage=LINEAGE, progress=False, auto_memory=["a.gguf"])
    assert {c.name: c.automatic_memory for c in rf.text_models} == \
        {"a.gguf": True, "b.gguf": False}
    plain = pack(tmp_path / "plain.aotxccir", models=[inputs["a"], inputs["b"]],
                 embedding=inputs["emb"], shared=True, lineage=LINEAGE, progress=False)
    assert [c.sha256 for c in rf.components] == [c.sha256 for c in plain.components]
    assert cli.main(["pack", "--runtime", str(path), "--no-auto-memory", "a.gguf",
                     "--auto-memory", "b.gguf"]) == 0
    assert "b.gguf [automatic_memory]" in capsys.readouterr().out
    rf = RuntimeFile.open(path)
    assert {c.name: c.automatic_memory for c in rf.text_models} == \
        {"a.gguf": False, "b.gguf": True}
    assert rf.lineage == LINEAGE and rf.read_component("b.gguf") == GGUF_B
    digest = _sha(path)
    pack(path, auto_memory=["b.gguf"], progress=False)        # no change: nothing written
    assert _sha(path) == digest
    rf = pack(path, models=[inputs["b"]], progress=False)      # replaced: keeps its flag
    assert next(c for c in rf.text_models if c.name == "b.gguf").automatic_memory
    rf = pack(path, no_auto_memory=["b.gguf"], progress=False)
    assert not any(c.automatic_memory for c in rf.text_models)
    assert _sha(path) == _sha(tmp_path / "plain.aotxccir")     # no flags: the plain bytes
    for kwargs in ({"auto_memory": ["nope.gguf"]}, {"auto_memory": ["config.json"]},
                   {"auto_memory": ["a.gguf"], "no_auto_memory": ["a.gguf"]}):
        with pytest.raises(InvalidInput) as info:
            pack(path, progress=False, **kwargs)  # type: ignore[arg-type]
        assert info.value.code == "auto_memory_invalid"
    assert _sha(path) == _sha(tmp_path / "plain.aotxccir")


def test_kv_f16_flag_is_the_default_for_added_models_and_chosen_per_model(
        inputs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A text model new to the file gets the f16 KV flag; ``--kv-f32 MODEL`` /
    ``--kv-f16 MODEL`` clear / set it (a table rewrite, extents unchanged); a replaced
    model keeps its flag; an entry written without it (a file packed before the flag)
    keeps float32 KV until ``--kv-f16`` names it; bad names are ``kv_type_invalid``."""
    path = tmp_path / "kv.aotxccir"
    rf = pack(path, models=[inputs["a"], inputs["b"]], embedding=inputs["emb"], shared=True,
              lineage=LINEAGE, progress=False)
    assert {c.name: c.flags for c in rf.text_models} == \
        {"a.gguf": ccir.FLAG_KV_F16, "b.gguf": ccir.FLAG_KV_F16}
    assert all(c.flags == 0 for c in rf.embedding_files)
    f16_bytes = _sha(path)
    rf = pack(tmp_path / "opt-out.aotxccir", models=[inputs["a"], inputs["b"]],
              embedding=inputs["emb"], shared=True, lineage=LINEAGE, progress=False,
              kv_f32=["b.gguf"])
    assert {c.name: c.kv_f16 for c in rf.text_models} == {"a.gguf": True, "b.gguf": False}

    assert cli.main(["pack", "--runtime", str(path), "--kv-f32", "a.gguf",
                     "--auto-memory", "b.gguf"]) == 0
    out = capsys.readouterr().out
    assert "b.gguf [automatic_memory] [kv_f16]" in out and "a.gguf\n" in out
    rf = RuntimeFile.open(path)
    assert {c.name: (c.automatic_memory, c.kv_f16) for c in rf.text_models} == \
        {"a.gguf": (False, False), "b.gguf": (True, True)}
    assert rf.lineage == LINEAGE and rf.read_component("a.gguf") == GGUF_A
    digest = _sha(path)
    pack(path, kv_f32=["a.gguf"], progress=False)              # no change: nothing written
    assert _sha(path) == digest
    rf = pack(path, models=[inputs["a"]], progress=False)      # replaced: keeps f32
    assert not next(c for c in rf.text_models if c.name == "a.gguf").kv_f16
    rf = pack(path, kv_f16=["a.gguf"], no_auto_memory=["b.gguf"], progress=False)
    assert all(c.flags == ccir.FLAG_KV_F16 for c in rf.text_models)
    assert _sha(path) == f16_bytes

    # A file packed before the flag existed: entries with flags 0 stay f32 KV, even
    # when another model is added (which gets f16) or the old one is replaced.
    old = tmp_path / "old.aotxccir"
    pack(old, models=[inputs["a"]], embedding=inputs["emb"], progress=False,
         kv_f32=["a.gguf"])
    assert RuntimeFile.open(old).component("a.gguf").flags == 0
    rf = pack(old, models=[inputs["b"]], progress=False)
    assert {c.name: c.kv_f16 for c in rf.text_models} == {"a.gguf": False, "b.gguf": True}
    rf = pack(old, models=[inputs["a"]], progress=False)
    assert {c.name: c.kv_f16 for c in rf.text_models} == {"a.gguf": False, "b.gguf": True}

    digest = _sha(path)
    for kwargs in ({"kv_f16": ["nope.gguf"]}, {"kv_f32": ["config.json"]},
                   {"kv_f16": ["a.gguf"], "kv_f32": ["a.gguf"]}):
        with pytest.raises(InvalidInput) as info:
            pack(path, progress=False, **kwargs)  # type: ignore[arg-type]
        assert info.value.code == "kv_type_invalid"
        assert info.value.fields["field"] == "kv_type"
    assert _sha(path) == digest
    with pytest.raises(InvalidInput) as info:
        pack(tmp_path / "new.aotxccir", models=[inputs["a"]], progress=False,
             kv_f32=["b.gguf"])
    assert info.value.code == "kv_type_invalid" and "--kv-f32 b.gguf" in str(info.value)
    assert not (tmp_path / "new.aotxccir").exists()


def _header_only(path: Path, arch: str, **strings: str) -> Path:
    """A GGUF with metadata only (no tensors): ``strings`` are tokenizer keys."""
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in strings.items():
        w.add_string(key.replace("_", "."), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_what_the_engine_cannot_run_is_refused_naming_it(tmp_path: Path) -> None:
    out = tmp_path / "r.aotxccir"
    cases = [
        (_header_only(tmp_path / "falcon.gguf", "falcon"), "architecture_unsupported",
         "falcon.gguf: general.architecture 'falcon' is not supported (supported: gemma3, "
         "llama, mistral, qwen2)"),
        (_header_only(tmp_path / "t5.gguf", "llama", tokenizer_ggml_model="t5"),
         "tokenizer_unsupported",
         "t5.gguf: tokenizer.ggml.model 't5' is not supported (supported: llama, gpt2)"),
        (_header_only(tmp_path / "pre.gguf", "llama", tokenizer_ggml_model="gpt2",
                      tokenizer_ggml_pre="mystery"), "tokenizer_pre_unsupported",
         "pre.gguf: tokenizer.ggml.pre 'mystery' is not supported (supported: default, gpt2, "
         "llama-bpe, llama3, qwen2, smollm)"),
    ]
    for path, code, message in cases:
        with pytest.raises(UnsupportedProfile) as info:
            pack(out, models=[path], progress=False)
        assert (info.value.code, info.value.message) == (code, message)
    q81 = tmp_path / "q81.gguf"
    q81.write_bytes(_tiny(dataclasses.replace(TINY, types=(sg.Q.Q8_1,))))
    with pytest.raises(UnsupportedProfile) as info:
        pack(out, models=[q81], progress=False)
    assert info.value.code == "tensor_type_unsupported"
    assert info.value.fields["tensor_type"] == "Q8_1"
    assert info.value.message.startswith(
        "q81.gguf: tensor blk.0.attn_q.weight has type Q8_1, which the kernels do not run "
        "as a matrix (supported: F32, F16, Q4_0, ")
    assert "Q4_K" in info.value.message and "BF16" in info.value.message
    bad = tmp_path / "tpl.gguf"
    bad.write_bytes(_tiny(dataclasses.replace(TINY, chat_template="{% for m in messages %}")))
    with pytest.raises(InvalidInput) as info:
        pack(out, models=[bad], progress=False)
    assert info.value.code == "chat_template_error"
    assert info.value.message.startswith("tpl.gguf: the chat template does not compile")
    assert not out.exists()
    # through the CLI: the message on stderr, nothing written
    code = cli.main(["pack", "--runtime", str(out), "--model", str(q81)])
    assert code != 0 and not out.exists()
