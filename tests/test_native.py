"""The native library loads, reports its build capacities, and names its codes."""

from __future__ import annotations

import pytest

from aotx_trio import errors, native


def test_capacities_are_the_spec_defaults() -> None:
    caps = native.capacities()
    assert caps == {
        "participants": 1024, "spaces": 1024, "conversations": 4096, "members": 4096,
        "receipts": 1024, "command_bytes": 8192, "result_bytes": 65536,
    }


def test_common_code_names() -> None:
    assert native.code_name(0) == "ok"
    assert native.code_name(-2) == "invalid_argument"
    assert native.code_name(-99999) == "unknown_error"
    assert native.code_name(99) == "unknown_refusal"


def test_check_translates_codes() -> None:
    assert native.check(0) == 0
    assert native.check(5, ok_positive=True) == 5
    with pytest.raises(errors.InvalidInput) as info:
        native.check(-2, "field 'x'")
    assert info.value.code == "invalid_argument"
    assert "field 'x'" in info.value.message
    assert errors.http_status(info.value) == 422
    with pytest.raises(errors.DiskError):
        native.check(-3)


def test_error_envelope_shape() -> None:
    exc = errors.JournalHold("journal on hold", retry_after=1)
    assert exc.envelope() == {"error": {"code": "journal_hold", "message": "journal on hold",
                                        "retry_after": 1}}
    assert errors.http_status(exc) == 429
