"""`aotx embed`: JSON output equals the library's embeddings; the human summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
from reference_bert import extract_real_model, reference_embed, write_tiny_model

from aotx_trio import cli
from aotx_trio.embed_cli import embed_main
from aotx_trio.native.embed import Embedder


@pytest.fixture()
def tiny_dir(tmp_path: Path) -> Path:
    return write_tiny_model(tmp_path / "tiny", seed=11)


def test_json_output_is_the_embeddings(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = ["the cat sat on the mat", "hello world!", "quick dog"]
    assert cli.main(["embed", "--model", str(tiny_dir), "--text", *texts, "--json"]) == 0
    got = np.array(json.loads(capsys.readouterr().out), dtype=np.float32)
    assert got.shape == (3, 16)
    with Embedder.load(tiny_dir) as emb:
        np.testing.assert_allclose(got, emb.embed(texts), atol=1e-6)
        seqs = [emb.tokenize(t) for t in texts]
    np.testing.assert_allclose(got, reference_embed(tiny_dir, seqs), atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_human_summary(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argparse.Namespace(model=str(tiny_dir), text=["the cat", "a b c"], json=False)
    assert embed_main(args) == 0
    out = capsys.readouterr().out
    assert "2 embedding(s), 16 dims, L2-normalised" in out
    assert "'the cat': 4 tokens, norm 1.0000" in out
    assert "'a b c': 5 tokens, norm 1.0000" in out


def test_missing_model_folder_is_an_error(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["embed", "--model", str(tmp_path / "nope"), "--text", "x"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "embed_file_missing" in err and "config.json" in err


def test_real_model_json(tmp_path_factory: pytest.TempPathFactory,
                         capsys: pytest.CaptureFixture[str]) -> None:
    model = extract_real_model(tmp_path_factory.mktemp("minilm-cli"))
    assert cli.main(["embed", "--model", str(model), "--text", "A man is eating food.",
                     "A man is eating a piece of bread.", "--json"]) == 0
    got = np.array(json.loads(capsys.readouterr().out))
    assert got.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert float(got[0] @ got[1]) > 0.6
