"""The JSON configuration of a sentence-transformers BERT folder (docs/embeddings.md):
``config.json`` (:class:`BertConfig`), ``sentence_bert_config.json`` (``max_seq_length``),
``modules.json`` and ``1_Pooling/config.json`` (mean pooling, optional Normalize).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotx_trio import errors


@dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    intermediate: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float

    @classmethod
    def from_json(cls, path: Path) -> BertConfig:
        raw = read_json(path)
        act = raw.get("hidden_act", "gelu")
        if act != "gelu":
            raise errors.ConfigError(f"{path}: hidden_act {act!r}; only 'gelu' (erf) is supported",
                                     code="embed_config_invalid", key="hidden_act")
        pos_type = raw.get("position_embedding_type", "absolute")
        if pos_type != "absolute":
            raise errors.ConfigError(f"{path}: position_embedding_type {pos_type!r} unsupported",
                                     code="embed_config_invalid", key="position_embedding_type")

        def num(key: str, kind: type[int] | type[float] = int) -> Any:
            value = raw.get(key)
            ok = isinstance(value, int | float) if kind is float else isinstance(value, int)
            if isinstance(value, bool) or not ok or not isinstance(value, int | float) \
                    or value <= 0:
                raise errors.ConfigError(f"{path}: {key} must be a positive number, got {value!r}",
                                         code="embed_config_invalid", key=key)
            return kind(value)

        cfg = cls(num("vocab_size"), num("hidden_size"), num("num_hidden_layers"),
                  num("num_attention_heads"), num("intermediate_size"),
                  num("max_position_embeddings"), num("type_vocab_size"),
                  num("layer_norm_eps", float))
        if cfg.hidden % cfg.n_heads:
            raise errors.ConfigError(
                f"{path}: hidden_size {cfg.hidden} is not a multiple of num_attention_heads "
                f"{cfg.n_heads}", code="embed_config_invalid", key="num_attention_heads")
        return cfg


def read_json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise errors.ConfigError(f"{path} is missing", code="embed_file_missing",
                                 key=path.name) from exc
    except json.JSONDecodeError as exc:
        raise errors.ConfigError(f"{path}: malformed JSON: {exc}", code="embed_config_invalid",
                                 key=path.name) from exc
    if not isinstance(raw, dict):
        raise errors.ConfigError(f"{path}: not a JSON object", code="embed_config_invalid",
                                 key=path.name)
    return raw


def pooling_and_normalize(model_dir: Path) -> bool:
    """Checks the pipeline is mean pooling; returns whether a Normalize module follows."""
    modules_path = model_dir / "modules.json"
    normalize = True
    if modules_path.exists():
        try:
            modules = json.loads(modules_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise errors.ConfigError(f"{modules_path}: malformed JSON: {exc}",
                                     code="embed_config_invalid", key="modules.json") from exc
        if not isinstance(modules, list):
            raise errors.ConfigError(f"{modules_path}: not a JSON list",
                                     code="embed_config_invalid", key="modules.json")
        types = [str(m.get("type", "")) for m in modules if isinstance(m, dict)]
        normalize = any(t.endswith("Normalize") for t in types)
    pool_path = model_dir / "1_Pooling" / "config.json"
    if pool_path.exists():
        pool = read_json(pool_path)
        modes = sorted(k for k, v in pool.items() if k.startswith("pooling_mode") and v is True)
        if modes != ["pooling_mode_mean_tokens"]:
            raise errors.ConfigError(
                f"{pool_path}: pooling modes {modes}; only pooling_mode_mean_tokens is supported",
                code="embed_config_invalid", key="pooling_mode_mean_tokens")
    return normalize


def max_seq_length(model_dir: Path, config: BertConfig) -> int:
    """Word pieces per sentence including [CLS]/[SEP]: sentence_bert_config.json's
    max_seq_length (when present) capped at max_position_embeddings."""
    max_len = config.max_positions
    sb_path = model_dir / "sentence_bert_config.json"
    if sb_path.exists():
        value = read_json(sb_path).get("max_seq_length", max_len)
        if not isinstance(value, int) or value < 3:
            raise errors.ConfigError(f"{sb_path}: max_seq_length must be an integer >= 3",
                                     code="embed_config_invalid", key="max_seq_length")
        max_len = min(value, config.max_positions)
    return max_len
