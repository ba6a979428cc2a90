"""gateway.json: validation, unknown keys named, defaults, path resolution, writing."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from aotx_trio.config import (
    UNIMPLEMENTED,
    GatewayConfig,
    load_gateway_config,
    parse_gateway_config,
    token_sha256,
    write_gateway_config,
)
from aotx_trio.errors import ConfigError

ALICE = token_sha256("alice-token")
BOB = token_sha256("bob-token")


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "bind": "127.0.0.1:8080",
        "service_socket": "/srv/aotx/journal/service.sock",
        "principals": [{"name": "alice", "token_sha256": ALICE, "actions": [
            "shared_read", "shared_write", "shared_manage", "models_read", "models_invoke",
            "webhooks_manage"]}],
        "limits": {"max_body_bytes": 2 * 1024 * 1024},
    }
    doc.update(over)
    return doc


def _key(data: Any) -> str:
    with pytest.raises(ConfigError) as info:
        parse_gateway_config(data)
    key = info.value.fields["key"]
    assert isinstance(key, str) and key in info.value.message
    return key


def test_the_shared_api_example_without_unimplemented_keys_loads() -> None:
    cfg = parse_gateway_config(_doc())
    assert cfg.bind == "127.0.0.1:8080"
    assert cfg.service_socket == Path("/srv/aotx/journal/service.sock")
    assert cfg.principals[0].name == "alice" and len(cfg.principals[0].actions) == 6
    assert cfg.limits.max_body_bytes == 2 * 1024 * 1024


def test_defaults() -> None:
    cfg = parse_gateway_config({})
    assert cfg.bind == "127.0.0.1:8080" and cfg.service_socket is None
    assert cfg.principals == []
    assert cfg.limits.max_body_bytes == 1024 * 1024
    assert cfg.limits.list_limit_default <= cfg.limits.list_limit_max
    assert cfg.limits.retry_after_s == 1
    assert cfg.limits.journal_max_bytes == 64 << 30
    assert cfg.limits.journal_min_free_bytes == 64 << 20
    small = parse_gateway_config({"limits": {"journal_max_bytes": 4096,
                                             "journal_min_free_bytes": 0}})
    assert (small.limits.journal_max_bytes, small.limits.journal_min_free_bytes) == (4096, 0)


@pytest.mark.parametrize(("data", "key"), [
    ({"bindd": "x"}, "bindd"),
    ({"principals": [{"name": "a", "token_sha256": ALICE, "tokn": "x"}]}, "principals.0.tokn"),
    ({"principals": [{"name": "a", "token_sha256": ALICE, "token": "x"}]}, "principals.0.token"),
    ({"limits": {"max_body": 1}}, "limits.max_body"),
])
def test_unknown_keys_are_named(data: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_gateway_config(data)
    assert info.value.fields["key"] == key
    assert f"{key}: unknown key" in info.value.message


@pytest.mark.parametrize(("data", "key"), [
    ({"principals": [{"name": "a", "token_sha256": ALICE.upper()}]}, "principals.0.token_sha256"),
    ({"principals": [{"name": "a", "token_sha256": ALICE[:-1]}]}, "principals.0.token_sha256"),
    ({"principals": [{"name": "a", "token_sha256": ALICE, "actions": ["admin"]}]},
     "principals.0.actions.0"),
    ({"principals": [{"name": "a", "token_sha256": ALICE,
                      "actions": ["shared_read", "shared_read"]}]}, "principals.0.actions"),
    ({"principals": [{"name": "", "token_sha256": ALICE}]}, "principals.0.name"),
    ({"principals": [{"name": "a b", "token_sha256": ALICE}]}, "principals.0.name"),
    ({"limits": {"max_body_bytes": 10}}, "limits.max_body_bytes"),
    ({"limits": {"max_body_bytes": "big"}}, "limits.max_body_bytes"),
    ({"limits": {"journal_max_bytes": -1}}, "limits.journal_max_bytes"),
    ({"limits": {"journal_min_free_bytes": "lots"}}, "limits.journal_min_free_bytes"),
    ({"bind": "localhost"}, "bind"),
    ({"bind": "localhost:70000"}, "bind"),
])
def test_bad_values_are_named(data: dict[str, Any], key: str) -> None:
    assert _key(data) == key


def test_duplicate_principals_are_refused() -> None:
    one = {"name": "a", "token_sha256": ALICE}
    with pytest.raises(ConfigError) as info:
        parse_gateway_config({"principals": [one, {**one, "token_sha256": BOB}]})
    assert "'a'" in info.value.message
    with pytest.raises(ConfigError) as info:
        parse_gateway_config({"principals": [one, {**one, "name": "b"}]})
    assert "token_sha256" in info.value.message


def test_binds() -> None:
    for bind in ("0.0.0.0:0", "[::1]:8443", "example.internal:80", "unix:/run/aotx.sock"):
        assert parse_gateway_config({"bind": bind}).bind == bind


@pytest.mark.parametrize("key", sorted(UNIMPLEMENTED))
def test_unimplemented_keys_are_refused_by_name(key: str) -> None:
    """A key of the contract that nothing implements yet is never silently accepted:
    even its documented default value is refused, naming the key."""
    value: dict[str, Any] = {"limits.max_media_bytes": 16 << 20,
                             "limits.max_connections": 1024,
                             "limits.scratch_lease_s": 900.0}.get(key, {})
    head, _, tail = key.partition(".")
    doc: dict[str, Any] = {head: {tail: value}} if tail else {head: value}
    with pytest.raises(ConfigError) as info:
        parse_gateway_config(doc)
    assert info.value.code == "config_unsupported"
    assert info.value.fields["key"] == key
    assert f"{key}: not implemented yet" in info.value.message


def test_unimplemented_keys_are_refused_from_a_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_gateway_config(_write(tmp_path, _doc(limits={"scratch_lease_s": 900.0})))
    assert info.value.fields["key"] == "limits.scratch_lease_s"
    assert "g.json" in info.value.message


def test_load_resolves_relative_paths(tmp_path: Path) -> None:
    p = tmp_path / "gateway.json"
    p.write_text(json.dumps(_doc(service_socket="journal/service.sock")))
    cfg = load_gateway_config(p)
    assert cfg.service_socket == tmp_path / "journal" / "service.sock"
    absolute = load_gateway_config(_write(tmp_path, _doc()))
    assert absolute.service_socket == Path("/srv/aotx/journal/service.sock")


def _write(tmp: Path, doc: Any, name: str = "g.json") -> Path:
    p = tmp / name
    p.write_text(json.dumps(doc))
    return p


def test_load_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_gateway_config(tmp_path / "missing.json")
    assert "no such file" in info.value.message
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "bind": "127.0.0.1:1",\n  oops\n}')
    with pytest.raises(ConfigError) as info:
        load_gateway_config(bad)
    assert "line 3" in info.value.message
    with pytest.raises(ConfigError) as info:
        load_gateway_config(_write(tmp_path, _doc(extra=1)))
    assert info.value.fields["key"] == "extra" and "g.json" in info.value.message


def test_write_round_trip_is_private(tmp_path: Path) -> None:
    cfg = parse_gateway_config(_doc())
    path = tmp_path / "gateway.json"
    write_gateway_config(path, cfg)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_gateway_config(path) == cfg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway.json"]
    assert GatewayConfig.model_validate(json.loads(path.read_text())) == cfg
