"""The deployment grant file: written from gateway.json, no credentials, strict loading."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from aotx_trio import cli
from aotx_trio.config import parse_gateway_config, token_sha256
from aotx_trio.errors import ConfigError
from aotx_trio.grants import load_grants, principal_key, write_grants

TOKENS = {"alice": "tok-alice-3f9a7c", "bob": "tok-bob-81d2e0", "carol": "tok-carol-55aa01"}


def _config_doc() -> dict[str, Any]:
    return {"principals": [
        {"name": "carol", "token_sha256": token_sha256(TOKENS["carol"]), "actions": []},
        {"name": "alice", "token_sha256": token_sha256(TOKENS["alice"]),
         "actions": ["models_read", "shared_write", "shared_read"]},
        {"name": "bob", "token_sha256": token_sha256(TOKENS["bob"]),
         "actions": ["shared_read", "shared_manage"]},
    ]}


def test_principal_key_is_sha256_of_the_name_truncated() -> None:
    assert principal_key("alice") == hashlib.sha256(b"alice").digest()[:16].hex()
    assert principal_key("alice") == "2bd806c97f0e00af1a1fc3328fa763a9"  # docs/formats/grants.md


def test_written_file_has_principals_and_actions_only(tmp_path: Path) -> None:
    path = write_grants(parse_gateway_config(_config_doc()), tmp_path / "grants")
    assert path == tmp_path / "grants" / "grants.json"
    raw = path.read_text()
    assert json.loads(raw) == {"schema": "aotx.grants.v1", "principals": [
        {"name": "alice", "principal_key": principal_key("alice"),
         "actions": ["shared_read", "shared_write", "models_read"]},
        {"name": "bob", "principal_key": principal_key("bob"),
         "actions": ["shared_read", "shared_manage"]},
        {"name": "carol", "principal_key": principal_key("carol"), "actions": []},
    ], "quotas": {"receipts": 120, "spaces": 120, "conversations": 480, "members": 480,
                  "media_bytes": 256 * 1024 * 1024, "memory_rows": 480}}
    for token in TOKENS.values():
        assert token not in raw
        assert token_sha256(token) not in raw
        assert token_sha256(token)[:32] not in raw
    assert "token" not in raw
    assert sorted(p.name for p in path.parent.iterdir()) == ["grants.json"]


def test_rewriting_is_byte_identical(tmp_path: Path) -> None:
    cfg = parse_gateway_config(_config_doc())
    one = write_grants(cfg, tmp_path).read_bytes()
    assert write_grants(cfg, tmp_path).read_bytes() == one


def test_load_round_trip_and_lookup(tmp_path: Path) -> None:
    write_grants(parse_gateway_config(_config_doc()), tmp_path)
    grants = load_grants(tmp_path)
    assert [p.name for p in grants.principals] == ["alice", "bob", "carol"]
    assert grants.actions_for(principal_key("bob")) == {"shared_read", "shared_manage"}
    key_bytes = hashlib.sha256(b"alice").digest()[:16]
    assert grants.actions_for(key_bytes) == {"shared_read", "shared_write", "models_read"}
    assert grants.actions_for("0" * 32) == frozenset()
    carol = grants.by_key(principal_key("carol"))
    assert carol is not None and carol.name == "carol" and carol.actions == ()
    assert grants.by_key("0" * 32) is None


def _tamper(tmp_path: Path, edit: Any) -> ConfigError:
    path = write_grants(parse_gateway_config(_config_doc()), tmp_path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as info:
        load_grants(tmp_path)
    assert info.value.code == "grants_invalid"
    return info.value


def test_unknown_fields_are_refused(tmp_path: Path) -> None:
    err = _tamper(tmp_path, lambda d: d["principals"][0].update(token_sha256="ab" * 32))
    assert err.fields["key"] == "principals.0.token_sha256" and "unknown key" in err.message
    err = _tamper(tmp_path, lambda d: d.update(generated_at="now"))
    assert err.fields["key"] == "generated_at"


def test_tampered_grants_are_refused(tmp_path: Path) -> None:
    err = _tamper(tmp_path, lambda d: d["principals"][0].update(principal_key="0" * 32))
    assert "principal_key" in err.message
    err = _tamper(tmp_path, lambda d: d.update(schema="aotx.grants.v2"))
    assert err.fields["key"] == "schema"
    err = _tamper(tmp_path, lambda d: d["principals"][1]["actions"].append("root"))
    assert err.fields["key"].startswith("principals.1.actions")
    err = _tamper(tmp_path, lambda d: d["principals"].reverse())
    assert "sorted" in err.message


def test_missing_or_broken_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_grants(tmp_path)
    assert info.value.code == "grants_missing"
    (tmp_path / "grants.json").write_text("{not json")
    with pytest.raises(ConfigError) as info:
        load_grants(tmp_path)
    assert info.value.code == "grants_invalid"


def test_cli_write_grants(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "gateway.json"
    config.write_text(json.dumps(_config_doc()))
    assert cli.main(["gateway", "write-grants", "--config", str(config),
                     "--out", str(tmp_path / "g")]) == 0
    assert "3 principals" in capsys.readouterr().out
    assert load_grants(tmp_path / "g").principals[0].name == "alice"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_config_doc(), "principal": []}))
    assert cli.main(["gateway", "write-grants", "--config", str(bad),
                     "--out", str(tmp_path / "h")]) == 1
    assert "principal: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()
