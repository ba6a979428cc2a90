"""routes_table.parse_body: the one-pass parse gives what decode_json + validate give,
and is used only for models without free text or numbers."""

from __future__ import annotations

import json

import pytest

from aotx_trio import errors
from aotx_trio.errors import BadRequest
from aotx_trio.gateway import bodies
from aotx_trio.gateway.routes_table import (
    MAX_INT_DIGITS,
    MUTATION_ROUTES,
    decode_json,
    one_pass,
    parse_body,
    validate,
)
from aotx_trio.vocab import SCHEMA

L, K = "0" * 31 + "1", "0" * 31 + "2"
COMMON = {"schema": SCHEMA, "lineage": L, "operation_key": K, "sequence": "7"}


def test_one_pass_only_for_closed_models() -> None:
    assert one_pass(bodies.SetMember) and one_pass(bodies.RegisterParticipant)
    assert not one_pass(bodies.CreateInput)          # free text and numbers
    assert {r.model for r in MUTATION_ROUTES if not one_pass(r.model)} == {bodies.CreateInput}


@pytest.mark.parametrize("raw", [
    json.dumps({**COMMON, "participant": f"par-{L}-{K}", "permissions": ["read", "manage"]}),
    json.dumps(COMMON)[:-1] + f', "participant": "par-{L}-{K}", "permissions": []}}',
    '\t' + json.dumps({**COMMON, "participant": f"par-{L}-{K}", "permissions": ["write"]})
    .replace('"7"', '"\\u0037"') + "\n",
])
def test_good_bodies_parse_alike(raw: str) -> None:
    data = raw.encode()
    assert parse_body(bodies.SetMember, data) == \
        validate(bodies.SetMember, decode_json(data)).model_dump(by_alias=True)


@pytest.mark.parametrize("raw", [
    b"\xef\xbb\xbf" + json.dumps(COMMON).encode(),                      # BOM: 400
    json.dumps({**COMMON, "schema": "x"}).encode(),                     # 400 schema
    json.dumps({k: v for k, v in COMMON.items() if k != "schema"}).encode(),
    json.dumps({**COMMON, "extra": 1}).encode(),                        # 422 unknown
    json.dumps(COMMON)[:-1].encode(),                                   # malformed
])
def test_bad_bodies_raise_the_old_errors(raw: bytes) -> None:
    def outcome(fn: object) -> tuple[type, str, str]:
        try:
            fn()  # type: ignore[operator]
        except errors.AotxError as exc:
            return type(exc), exc.code, str(exc)
        raise AssertionError("accepted")
    assert outcome(lambda: parse_body(bodies.RegisterParticipant, raw)) == \
        outcome(lambda: validate(bodies.RegisterParticipant, decode_json(raw)))


def test_huge_integer_in_free_model_is_still_bounded() -> None:
    body = {**COMMON, "text": "hi", "model": "m"}
    raw = json.dumps(body)[:-1] + ', "temperature": ' + "9" * (MAX_INT_DIGITS + 5) + "}"
    with pytest.raises(BadRequest):
        parse_body(bodies.CreateInput, raw.encode())
