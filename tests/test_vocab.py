"""aotx_trio.vocab: every value equals the C header's, and the id/key helpers."""

from __future__ import annotations

import hashlib
import typing

import pytest

from aotx_trio import vocab
from aotx_trio.gateway import bodies
from aotx_trio.native.lib import lib


def test_kinds_equal_the_header() -> None:
    for kind in vocab.Kind:
        assert getattr(lib, f"AOTX_KIND_{kind.name}") == kind.value
    assert set(vocab.KIND_NAMES) == set(vocab.Kind)
    assert vocab.KINDS_BY_NAME == {n: k for k, n in vocab.KIND_NAMES.items()}


def test_scopes_rights_statuses_grants_media_equal_the_header() -> None:
    for i, scope in enumerate(vocab.SCOPES):
        assert getattr(lib, f"AOTX_SCOPE_{scope.upper()}") == i
    for i, right in enumerate(vocab.PERMISSIONS):
        assert getattr(lib, f"AOTX_RIGHT_{right.upper()}") == 1 << i
    for i, status in enumerate(vocab.STATUSES):
        assert getattr(lib, f"AOTX_STATUS_{status.upper()}") == i
    assert vocab.TERMINAL == {s for s in vocab.STATUSES if s not in ("admitted", "running")}
    for i, finish in enumerate(vocab.FINISH_CODES):
        assert getattr(lib, f"AOTX_FINISH_{finish.upper()}") == i
    assert set(vocab.FINISH_OF_STATUS) | {"succeeded"} == vocab.TERMINAL
    assert [vocab.finish_of(s, 2) for s in vocab.STATUSES] == \
           [None, None, "length", "error", "cancelled", "interrupted", "deadline_exceeded"]
    assert vocab.finish_of("succeeded", 1) == vocab.finish_of("succeeded", 0) == "stop"
    for action, bit in vocab.GRANT_BITS.items():
        assert getattr(lib, f"AOTX_GRANT_{action.removeprefix('shared_').upper()}") == bit
    assert vocab.ALL_GRANTS == lib.AOTX_GRANT_READ | lib.AOTX_GRANT_WRITE | lib.AOTX_GRANT_MANAGE
    for name, value in vocab.MEDIA_TYPES.items():
        assert getattr(lib, f"AOTX_MEDIA_{name.upper()}") == value
    assert vocab.MAX_TEXT_BYTES == lib.AOTX_MAX_TEXT_BYTES
    assert vocab.MEDIA_LINK_BYTES == lib.AOTX_MEDIA_LINK_BYTES
    assert vocab.MAX_MEDIA == lib.AOTX_MAX_MEDIA
    assert vocab.MAX_MODEL_NAME == lib.AOTX_MAX_MODEL_NAME


def test_the_python_literals_equal_the_vocabulary() -> None:
    """pydantic and mypy need literal types; they must spell the same values."""
    assert typing.get_args(vocab.Action) == vocab.ACTIONS
    assert typing.get_args(vocab.Scope) == vocab.SCOPES
    assert typing.get_args(vocab.Permission) == vocab.PERMISSIONS
    schema = bodies.Mutation.model_fields["schema_"].annotation
    assert typing.get_args(schema) == (vocab.SCHEMA,)
    assert vocab.SHARED_ACTIONS == tuple(vocab.GRANT_BITS)


def test_principal_key_is_sha256_prefix() -> None:
    assert vocab.principal_key("alice") == hashlib.sha256(b"alice").digest()[:16].hex()
    assert vocab.principal_key("ü") == hashlib.sha256("ü".encode()).digest()[:16].hex()


def test_grant_mask() -> None:
    assert vocab.grant_mask(["shared_read"]) == 1
    assert vocab.grant_mask(["shared_write", "shared_manage", "models_read"]) == 6
    assert vocab.grant_mask([]) == 0


LIN = bytes(range(16)).hex()
RAW = bytes(range(16, 32)).hex()


def test_ids_round_trip() -> None:
    text = vocab.format_id("spc", LIN, RAW)
    assert text == f"spc-{LIN}-{RAW}"
    assert vocab.parse_id("spc", LIN, text) == RAW


@pytest.mark.parametrize("bad", [
    f"con-{LIN}-{RAW}", f"spc-{LIN}-{RAW}".upper(), f"spc-{LIN}-{RAW}0",
    f"spc-{bytes(16).hex()}-{RAW}", f"spc-{LIN}-{RAW[:-1]}g", f"spc-{LIN}-{RAW}-x",
    "spc-" + LIN + "-" + "\u0661" * 32, 7, None, "",
])
def test_ids_of_another_kind_or_lineage_name_nothing(bad: object) -> None:
    assert vocab.parse_id("spc", LIN, bad) is None


def test_is_hex32() -> None:
    assert vocab.is_hex32(RAW)
    assert not vocab.is_hex32(RAW.upper()) and not vocab.is_hex32(RAW + "0")
    assert not vocab.is_hex32(None) and not vocab.is_hex32(RAW + "\n")
