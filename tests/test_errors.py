"""aotx_trio.errors: one tree, one native-code table, one map to HTTP."""

from __future__ import annotations

import inspect

import pytest

from aotx_trio import errors
from aotx_trio.native import lib as native


def _named_codes() -> dict[int, str]:
    """Every code the native library names (the rest read ``unknown...``)."""
    out = {}
    for code in range(-1000, 1000):
        name = native.code_name(code)
        if code != 0 and not name.startswith("unknown"):
            out[code] = name
    return out


def test_every_native_code_is_in_the_table() -> None:
    codes = _named_codes()
    assert len(codes) > 50
    assert set(codes.values()) <= set(errors.NATIVE), \
        sorted(set(codes.values()) - set(errors.NATIVE))
    assert set(errors.NATIVE) <= set(codes.values()), "the table names codes that do not exist"


def test_native_errors_keep_their_name_and_number() -> None:
    for code, name in _named_codes().items():
        exc = native.error_for(code)
        cls, public, extra = errors.NATIVE[name]
        assert type(exc) is cls
        assert exc.native == name and exc.rc == code
        assert exc.code == (public or name)
        for k, v in extra.items():
            assert exc.fields[k] == v


def test_positive_codes_are_refusals_and_only_they() -> None:
    """A positive native code means the same request may succeed later (a Refusal,
    429/503/507); every negative code is an error that retrying cannot fix."""
    for code, name in _named_codes().items():
        cls = errors.NATIVE[name][0]
        assert (code > 0) == issubclass(cls, errors.Refusal), (code, name, cls)


def test_full_tables_are_507_capacity_exhausted_naming_the_table() -> None:
    for name, table in [("participants_full", "participants"), ("spaces_full", "spaces"),
                        ("conversations_full", "conversations"), ("members_full", "members")]:
        code = next(c for c, n in _named_codes().items() if n == name)
        status, body, headers = errors.http_parts(native.error_for(code))
        assert status == 507
        assert body["error"]["code"] == "capacity_exhausted"
        assert body["error"]["table"] == table
        assert headers == {}


def test_missing_deployment_grant_is_403_forbidden() -> None:
    code = next(c for c, n in _named_codes().items() if n == "grant_forbidden")
    status, body, _ = errors.http_parts(native.error_for(code))
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert body["error"]["reason"] == "deployment_grant"


@pytest.mark.parametrize("exc", [
    errors.JournalHold("hold"), errors.ReceiptTableFull("full"), errors.OverCapacity("kv"),
    errors.RuntimeUnavailable("down"), errors.SavePending("later"),
])
def test_every_429_and_503_carries_retry_after(exc: errors.AotxError) -> None:
    status, body, headers = errors.http_parts(exc, retry_after_s=7)
    assert status in (429, 503)
    assert headers["Retry-After"] == "7" and body["error"]["retry_after"] == 7
    exc.fields["retry_after"] = 3   # the error's own value wins
    status, body, headers = errors.http_parts(exc, retry_after_s=7)
    assert headers["Retry-After"] == "3" and body["error"]["retry_after"] == 3


def test_401_carries_www_authenticate() -> None:
    status, body, headers = errors.http_parts(errors.Unauthorized("no token"))
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert body == {"error": {"code": "unauthorized", "message": "no token"}}


def test_the_docstring_draws_every_class() -> None:
    doc = errors.__doc__ or ""
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass)
               if issubclass(c, errors.AotxError)]
    assert len(classes) >= 25
    for cls in classes:
        assert cls.__name__ in doc, cls.__name__
        assert errors.by_name(cls.__name__) is cls
        line = next(ln for ln in doc.splitlines() if f" {cls.__name__} " in f" {ln} ")
        assert str(cls.status) in line, (cls.__name__, cls.status)
    assert errors.by_name("ValueError") is None and errors.by_name("log") is None


def test_no_error_class_lives_outside_errors() -> None:
    import aotx_trio.gateway.errors
    import aotx_trio.service.client
    import aotx_trio.service.wire

    for mod in (aotx_trio.service.client, aotx_trio.service.wire, aotx_trio.gateway.errors):
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if issubclass(cls, errors.AotxError):
                assert cls.__module__ == "aotx_trio.errors", (mod.__name__, cls)


def test_every_exception_class_is_defined_in_errors() -> None:
    """No module but errors.py defines an exception class (control-flow signals
    included: they are :class:`aotx_trio.errors.Signal`)."""
    import ast
    from pathlib import Path

    package = Path(errors.__file__).parent
    ours = {name for name, c in inspect.getmembers(errors, inspect.isclass)
            if issubclass(c, BaseException)} | {"Exception", "BaseException"}
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.name == "errors.py" and path.parent == package:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else
                         b.attr if isinstance(b, ast.Attribute) else "" for b in node.bases}
                if bases & ours:
                    found.append(f"{path.relative_to(package)}: {node.name}")
    assert not found, found
    for cls in (errors.OutboundFailed, errors.ClientGone, errors.H2cRefused,
                errors.LeaseLost):
        assert issubclass(cls, errors.Signal) and not issubclass(cls, errors.AotxError)
        assert f" {cls.__name__} " in (errors.__doc__ or "")
