"""aotx_trio/native/_bert_config.py: config.json, sentence_bert_config.json, modules.json and
1_Pooling of a sentence-transformers folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference_bert import tiny_config, write_tiny_model

from aotx_trio import errors
from aotx_trio.native._bert_config import (
    BertConfig,
    max_seq_length,
    pooling_and_normalize,
    read_json,
)


def test_config_fields(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    raw = tiny_config()
    path.write_text(json.dumps(raw))
    cfg = BertConfig.from_json(path)
    assert (cfg.hidden, cfg.n_layers, cfg.n_heads) == (raw["hidden_size"],
                                                       raw["num_hidden_layers"],
                                                       raw["num_attention_heads"])
    assert cfg.layer_norm_eps == raw["layer_norm_eps"]


@pytest.mark.parametrize(("key", "value"), [("vocab_size", True), ("intermediate_size", -3),
                                            ("position_embedding_type", "relative_key")])
def test_bad_values_name_their_key(tmp_path: Path, key: str, value: object) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(tiny_config(), **{key: value})))
    with pytest.raises(errors.ConfigError) as info:
        BertConfig.from_json(path)
    assert info.value.fields["key"] == key and info.value.code == "embed_config_invalid"


def test_read_json_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError) as info:
        read_json(tmp_path / "absent.json")
    assert info.value.code == "embed_file_missing" and info.value.fields["key"] == "absent.json"
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(errors.ConfigError) as info:
        read_json(tmp_path / "bad.json")
    assert info.value.fields["key"] == "bad.json"


def test_max_seq_length_is_capped_by_positions(tmp_path: Path) -> None:
    root = write_tiny_model(tmp_path / "m", max_seq_length=40)
    cfg = BertConfig.from_json(root / "config.json")
    assert max_seq_length(root, cfg) == min(40, cfg.max_positions)
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 10 ** 6}))
    assert max_seq_length(root, cfg) == cfg.max_positions
    (root / "sentence_bert_config.json").unlink()
    assert max_seq_length(root, cfg) == cfg.max_positions
    (root / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 2}))
    with pytest.raises(errors.ConfigError) as info:
        max_seq_length(root, cfg)
    assert info.value.fields["key"] == "max_seq_length"


def test_normalize_follows_modules_json(tmp_path: Path) -> None:
    root = write_tiny_model(tmp_path / "m", normalize=True)
    assert pooling_and_normalize(root) is True
    root = write_tiny_model(tmp_path / "n", normalize=False)
    assert pooling_and_normalize(root) is False
    (root / "modules.json").unlink()
    assert pooling_and_normalize(root) is True          # absent file: normalise
    (root / "modules.json").write_text("{}")
    with pytest.raises(errors.ConfigError):
        pooling_and_normalize(root)
