"""One corpus of good and bad mutation requests through both ways a mutation is
answered: the ASGI fast path (``create_app(fast_mutations=True)``) and the Quart
views generated from the same route table (``fast_mutations=False``).

Each app is backed by its own fresh runtime and served by a real hypercorn on a
loopback port; every request of the corpus goes to both, in the same order, over
httpx, and the two answers must agree in status, headers (as a sorted list of
lower-cased pairs, so duplicates count; only ``Date`` is left out) and body bytes.
The journal's random file incarnation is pinned for the test so that the two
fresh journals name themselves alike (receipts carry it and the commit digest).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from _gateway_env import ALL, LINEAGE, SCHEMA, make_runtime_file, served, token_for

from aotx_trio.gateway.fast import FastMutations
from aotx_trio.runtime import journal_file
from aotx_trio.vocab import principal_key

BASE = "/aotx/v1/shared"
LIMIT = 2048
PRINCIPALS = {"alice": ALL, "bob": ALL, "writer": ("shared_read", "shared_write"),
              "reader": ("shared_read",)}


@dataclass
class Req:
    """One request of the corpus: ``content`` is raw bytes, a JSON value, or a list
    of byte chunks (sent chunked, without Content-Length)."""

    what: str
    path: str
    content: Any
    who: str | None = "alice"
    auth: str | None = None          # an explicit Authorization header
    raw: bool = False                # content is bytes as they are
    chunked: bool = False


def body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


def par(name: str) -> str:
    return f"par-{LINEAGE}-{principal_key(name)}"


SPACE = f"spc-{LINEAGE}-{0xabc:032x}"
ROUTES = {  # a valid body for each mutation route, for the bad-body variants below
    "/participant": body(90, 90),
    "/spaces": body(90, 90, scope="room"),
    f"/spaces/{SPACE}/members": body(90, 90, participant=par("bob"), permissions=["read"]),
    f"/spaces/{SPACE}/conversations": body(90, 90),
    "/participant/retirements": body(90, 90, retry_floor="1"),
}


def _without(d: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


def _good() -> Iterator[Req]:
    """New mutations on every route, each followed by its exact retry."""
    steps = [
        ("alice", "/participant", body(1, 1)),
        ("bob", "/participant", body(1, 1)),
        ("writer", "/participant", body(1, 1)),
        ("alice", "/spaces", body(2, 2, scope="room", id=f"{0xabc:032x}")),
        ("alice", "/spaces", body(3, 3)),
        ("alice", f"/spaces/{SPACE}/conversations", body(4, 4, id=f"{0xc0:032x}")),
        ("alice", f"/spaces/{SPACE}/members",
         body(5, 5, participant=par("bob"), permissions=["read", "write"])),
        ("alice", f"/spaces/{SPACE}/members",
         body(6, 6, participant=par("writer"), permissions=["read"])),
        ("alice", "/participant/retirements", body(7, 7, retry_floor="3")),
        ("bob", f"/spaces/{SPACE}/conversations", body(2, 2)),
    ]
    for who, path, b in steps:
        yield Req(f"new {path}", path, b, who)
        yield Req(f"retry {path}", path, b, who)


def _bad() -> Iterator[Req]:
    for path, good in ROUTES.items():
        yield Req("invalid utf-8", path, b'{"schema": "\xff"}', raw=True)
        yield Req("invalid utf-8 deep", path, json.dumps(good).encode()[:-1] + b'\xc3"}',
                  raw=True)
        yield Req("malformed json", path, b'{"schema":', raw=True)
        yield Req("empty body", path, b"", raw=True)
        for value in ([1], "x", None, 5, True):
            yield Req(f"non-object {value!r}", path, value)
        yield Req("wrong schema", path, good | {"schema": "aotx.shared.mutation.v2"})
        yield Req("schema not a string", path, good | {"schema": 1})
        yield Req("missing schema", path, _without(good, "schema"))
        yield Req("missing schema, unknown field", path, _without(good, "schema") | {"x": 1})
        yield Req("empty object", path, {})
        yield Req("unknown field", path, good | {"colour": "red"})
        yield Req("missing sequence", path, _without(good, "sequence"))
        yield Req("sequence as a number", path, good | {"sequence": 90})
        yield Req("sequence 0", path, good | {"sequence": "0"})
        yield Req("sequence over u64", path, good | {"sequence": str(1 << 64)})
        yield Req("zero operation key", path, good | {"operation_key": "0" * 32})
        yield Req("upper-case key", path, good | {"operation_key": "A" * 32})
        yield Req("bad lineage", path, good | {"lineage": "xyz"})
        yield Req("other lineage", path, good | {"lineage": "f" * 32})
        yield Req("over the limit", path, good | {"pad": "x" * (LIMIT + 10)})
        yield Req("chunked over the limit", path, [b"x" * 1500, b"x" * 1500], chunked=True)
        yield Req("no token", path, good, who=None)
        yield Req("wrong token", path, good, auth="Bearer not-a-token")
        yield Req("malformed authorization", path, good, auth="Basic YWxpY2U6eA==")
        yield Req("two tokens", path, good, auth=f"Bearer {token_for('alice')} x")
        yield Req("missing action", path, good, who="reader")
    yield Req("wrong type: scope", "/spaces", body(8, 8, scope=5))
    yield Req("wrong value: scope", "/spaces", body(8, 8, scope="public"))
    yield Req("wrong type: id", "/spaces", body(8, 8, id=12))
    yield Req("bad id", "/spaces", body(8, 8, id="spc-nope"))
    yield Req("bad id: conversation", f"/spaces/{SPACE}/conversations", body(8, 8, id="c0"))
    members = f"/spaces/{SPACE}/members"
    yield Req("bad participant id", members, body(8, 8, participant="par-x",
                                                    permissions=["read"]))
    yield Req("wrong type: permissions", members,
              body(8, 8, participant=par("bob"), permissions="read"))
    yield Req("unknown permission", members, body(8, 8, participant=par("bob"),
                                                    permissions=["own"]))
    yield Req("missing participant", members, body(8, 8, permissions=["read"]))
    yield Req("wrong type: retry_floor", "/participant/retirements", body(8, 8, retry_floor=3))
    yield Req("unknown space", f"/spaces/spc-{LINEAGE}-{7:032x}/conversations", body(8, 8))
    yield Req("malformed space id", "/spaces/spc-nope/members",
              body(8, 8, participant=par("bob"), permissions=["read"]))
    yield Req("missing manage action", members,
              body(2, 2, participant=par("bob"), permissions=["read"]), who="writer")
    yield Req("no manage right in the space", members,
              body(3, 3, participant=par("writer"), permissions=["read"]), who="bob")
    yield Req("future sequence", "/spaces", body(99, 99))
    yield Req("sequence conflict", "/spaces", body(3, 3, scope="instance"))
    yield Req("below the retry floor", "/spaces", body(2, 2))
    yield Req("not registered", "/spaces", body(1, 1), who="reader")


def _chunked_good() -> Iterator[Req]:
    b = json.dumps(body(8, 8, id=f"{0xc1:032x}")).encode()
    path = f"/spaces/{SPACE}/conversations"
    yield Req("chunked new", path, [b[:7], b[7:30], b[30:]], chunked=True)
    yield Req("chunked retry", path, [b[:1], b[1:]], chunked=True)
    b = json.dumps(body(9, 9, participant=par("bob"), permissions=["read"])).encode()
    yield Req("chunked new member", f"/spaces/{SPACE}/members", [b], chunked=True)


CORPUS = [*_good(), *_bad(), *_chunked_good()]


async def _send(http: httpx.AsyncClient, req: Req) -> tuple[int, list[tuple[str, str]], bytes]:
    headers: dict[str, str] = {}
    if req.auth is not None:
        headers["Authorization"] = req.auth
    elif req.who is not None:
        headers["Authorization"] = f"Bearer {token_for(req.who)}"
    kw: dict[str, Any]
    if req.chunked:
        chunks = list(req.content)

        async def gen() -> AsyncIterator[bytes]:
            for c in chunks:
                yield c

        kw = {"content": gen()}
    elif req.raw:
        kw = {"content": req.content}
    else:
        kw = {"content": json.dumps(req.content).encode()}
        headers["Content-Type"] = "application/json"
    resp = await http.post(BASE + req.path, headers=headers, **kw)
    pairs = sorted((k.decode("latin-1").lower(), v.decode("latin-1"))
                   for k, v in resp.headers.raw if k.lower() != b"date")
    return resp.status_code, pairs, resp.content


@pytest.fixture
def pinned_incarnation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both fresh journals get the same file incarnation (otherwise random)."""
    monkeypatch.setattr(journal_file, "secrets", SimpleNamespace(randbits=lambda bits: 0x5EED))


async def test_one_corpus_answers_byte_for_byte_alike_on_both_paths(
        tmp_path: Path, pinned_incarnation: None) -> None:
    ccir = make_runtime_file(tmp_path / "rt")
    async with served(tmp_path, PRINCIPALS, fast_mutations=True, max_body_bytes=LIMIT,
                      ccir=ccir) as fast, \
            served(tmp_path, PRINCIPALS, fast_mutations=False, max_body_bytes=LIMIT,
                   ccir=ccir) as quart:
        fast_mw = fast.app.config["AOTX_FAST"]
        assert isinstance(fast_mw, FastMutations)
        assert "AOTX_FAST" not in quart.app.config
        answers: list[tuple[Req, tuple[int, list[tuple[str, str]], bytes]]] = []
        async with httpx.AsyncClient(base_url=fast.url, timeout=30) as a, \
                httpx.AsyncClient(base_url=quart.url, timeout=30) as b:
            for req in CORPUS:
                got_fast = await _send(a, req)
                got_quart = await _send(b, req)
                assert got_fast == got_quart, (req, got_fast, got_quart)
                answers.append((req, got_fast))
        assert fast_mw.answered == len(CORPUS)     # the fast side never fell back to Quart

    by_what: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for req, (status, pairs, data) in answers:
        headers = dict(pairs)
        assert headers["cache-control"] == "no-store", req
        assert headers["content-type"] == "application/json", req
        assert int(headers["content-length"]) == len(data), req
        by_what.setdefault(req.what, []).append((status, json.loads(data)))

    def statuses(what: str) -> set[tuple[int, str | None]]:
        return {(s, b.get("error", {}).get("code")) for s, b in by_what[what]}

    # the corpus reaches every outcome it names (so the comparison above is not vacuous)
    assert {s for s, _ in by_what["new /spaces"]} == {202}
    assert {s for s, _ in by_what["retry /spaces"]} == {200}
    for what in (f"new /spaces/{SPACE}/members", f"new /spaces/{SPACE}/conversations",
                 "new /participant", "new /participant/retirements", "chunked new",
                 "chunked new member"):
        assert {s for s, _ in by_what[what]} == {202}, what
    assert statuses("chunked retry") == {(200, None)}
    expected = {
        "invalid utf-8": (400, "invalid_utf8"), "invalid utf-8 deep": (400, "invalid_utf8"),
        "malformed json": (400, "malformed_json"), "empty body": (400, "malformed_json"),
        "non-object [1]": (400, "malformed_json"), "non-object None": (400, "malformed_json"),
        "wrong schema": (400, "schema_invalid"), "schema not a string": (400, "schema_invalid"),
        "missing schema": (400, "schema_invalid"),
        "missing schema, unknown field": (400, "schema_invalid"),
        "empty object": (400, "schema_invalid"),
        "unknown field": (422, "unknown_field"), "missing sequence": (422, "missing_field"),
        "sequence as a number": (422, "invalid_argument"),
        "zero operation key": (422, "invalid_argument"),
        "bad lineage": (422, "invalid_argument"),
        "other lineage": (409, "lineage_mismatch"),
        "over the limit": (413, "body_too_large"),
        "chunked over the limit": (413, "body_too_large"),
        "no token": (401, "unauthorized"), "wrong token": (401, "unauthorized"),
        "malformed authorization": (401, "unauthorized"), "two tokens": (401, "unauthorized"),
        "missing action": (403, "forbidden"),
        "wrong type: scope": (422, "invalid_argument"), "bad id": (422, "invalid_argument"),
        "bad participant id": (422, "invalid_argument"),
        "wrong type: permissions": (422, "invalid_argument"),
        "missing participant": (422, "missing_field"),
        "missing manage action": (403, "forbidden"),
        "future sequence": (409, "future_sequence"),
        "sequence conflict": (409, "sequence_conflict"),
        "below the retry floor": (410, "below_retry_floor"),
    }
    for what, outcome in expected.items():
        assert statuses(what) == {outcome}, (what, statuses(what))
    for _, err in by_what["missing schema"]:
        assert err["error"]["field"] == "schema"
        assert err["error"]["expected"] == SCHEMA
    assert statuses("unknown space") == {(404, "space_not_found")}
    assert {s for s, _ in by_what["no manage right in the space"]} == {403}
