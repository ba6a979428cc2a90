"""The ASGI fast path of the mutation routes (aotx_trio.gateway.fast) answers exactly
as the Quart routes do, and hands everything else to Quart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, Env, embedded

from aotx_trio.gateway import routes_table
from aotx_trio.gateway.fast import FastMutations, match
from aotx_trio.gateway.routes_table import MUTATION_ROUTES

BASE = "/aotx/v1/shared"


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL, "reader": ("shared_read",)},
                        max_body_bytes=2048) as e:
        yield e


def test_match_takes_exactly_the_mutation_routes() -> None:
    assert match is routes_table.match      # one matcher, built from the one table
    for route in MUTATION_ROUTES:
        path = BASE + route.rule.replace("<space>", "spc-x")
        found = match(path)
        assert found is not None and found[0] is route, path
    found = match(BASE + "/spaces/spc-x/members")
    assert found is not None
    assert (found[0].kind, found[0].action, found[1]) == ("member.set", "shared_manage",
                                                          {"space": "spc-x"})
    found = match(BASE + "/spaces/s/conversations")
    assert found is not None
    assert (found[0].kind, found[0].action, found[1]) == ("conversation.create",
                                                          "shared_write", {"space": "s"})
    for other in (BASE + "/participant/", BASE + "/spaces/", BASE + "/spaces//members",
                  BASE + "/spaces/a/b/members", BASE + "/spaces/a/members/", BASE + "/nowhere",
                  "/aotx/v1/sharedx/spaces", BASE + "/capabilities", BASE + "/spaces/members",
                  BASE + "/spaces/a/conversations/x"):
        assert match(other) is None, other


async def _snapshot(resp: Any) -> tuple[int, dict[str, str], str]:
    headers = {k.lower(): v for k, v in resp.headers.items() if k.lower() != "date"}
    return resp.status_code, headers, await resp.get_data(as_text=True)


async def _cases(env: Env, key: int, space: str) -> list[tuple[int, dict[str, str], str]]:
    """Every outcome of a mutation route, in one order (the caller runs it twice)."""
    c = env.client
    me = env.par("alice")
    perms = {"participant": me, "permissions": ["read"]}
    no_schema = {k: v for k, v in env.body(key, 9).items() if k != "schema"}
    out = []
    calls: list[tuple[str | None, str, Any, None]] = [
        ("alice", "/participant", env.body(1, 1), None),                   # exact retry: 200
        (None, "/spaces", env.body(key, 9), None),                          # 401
        ("reader", "/spaces", env.body(key, 9), None),                      # 403
        ("reader", f"/spaces/{space}/members", env.body(key, 9, **perms), None),  # 403 manage
        ("alice", "/spaces", {"schema": "other"}, None),                    # 400 schema
        ("alice", "/spaces", [1, 2], None),                                 # 400 not an object
        ("alice", "/spaces", env.body(key, 9, extra=1), None),              # 422 unknown
        ("alice", "/spaces", env.body(key, 9, scope="bad"), None),          # 422 field
        ("alice", "/spaces", {"schema": "aotx.shared.mutation.v1"}, None),  # 422 missing
        ("alice", "/spaces", no_schema, None),                              # 400 no schema
        ("alice", "/spaces", env.body(key, 99), None),                      # 409 future
        ("alice", "/spaces", env.body(key, 3, pad="x" * 4000), None),       # 413
        ("alice", "/spaces/spc-nope/conversations", env.body(key, 3), None),  # 404 space
    ]
    for who, path, body, _ in calls:
        headers = env.auth(who) if who else {}
        out.append(await _snapshot(await c.post(BASE + path, headers=headers, json=body)))
    for raw in (b"\xff{}", b"{", b""):                                     # 400 utf-8 / json
        out.append(await _snapshot(await c.post(BASE + "/spaces", headers=env.auth("alice"),
                                                data=raw)))
    return out


async def test_fast_path_answers_byte_for_byte_like_the_quart_routes(env: Env) -> None:
    fast = env.app.config["AOTX_FAST"]
    assert isinstance(fast, FastMutations)
    c = env.client
    r = await c.post(BASE + "/participant", headers=env.auth("alice"), json=env.body(1, 1))
    assert r.status_code == 202
    r = await c.post(BASE + "/spaces", headers=env.auth("alice"), json=env.body(2, 2))
    space = (await r.get_json())["resource"]
    before = fast.answered
    with_fast = await _cases(env, 3, space)
    assert fast.answered - before == len(with_fast)   # every one answered by the fast path
    env.app.asgi_app = fast.app  # type: ignore[method-assign,assignment]
    try:
        before = fast.answered
        with_quart = await _cases(env, 3, space)
        assert fast.answered == before
    finally:
        env.app.asgi_app = fast  # type: ignore[method-assign]
    assert [s for s, _, _ in with_fast] == [200, 401, 403, 403, 400, 400, 422, 422, 422, 400,
                                             409, 413, 404, 400, 400, 400]
    assert with_fast == with_quart
    for _status, headers, _ in with_fast:
        assert headers["cache-control"] == "no-store"
        assert headers["content-type"] == "application/json"
    # and the fast path's new admissions are saved before their 202
    r = await c.post(BASE + f"/spaces/{space}/conversations", headers=env.auth("alice"),
                     json=env.body(3, 3))
    assert r.status_code == 202
    receipt = await r.get_json()
    assert r.headers["Location"] == f"{BASE}/operations/{receipt['operation']}"
    assert receipt["admission"]["saved"] is True
    saved = env.handler.state.emitter.saved_records
    assert saved > int(receipt["admission"]["record"])


async def _asgi(app: Any, method: str, path: str, headers: list[tuple[bytes, bytes]],
                chunks: list[dict[str, Any]], *, then_disconnect: bool = False,
                ) -> list[dict[str, Any]]:
    """Call ``app`` as an ASGI server would; after ``chunks`` the client stays connected
    (or disconnects)."""
    sent: list[dict[str, Any]] = []
    queue = list(chunks)

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        if not then_disconnect:
            await trio.sleep_forever()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), *headers], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "extensions": {}}
    await app(scope, receive, send)
    return sent


async def test_chunked_bodies_disconnects_and_odd_framing(env: Env) -> None:
    import json

    fast = env.app.config["AOTX_FAST"]
    assert isinstance(fast, FastMutations)
    auth = [(b"authorization", env.auth("alice")["Authorization"].encode())]
    chunked = [*auth, (b"transfer-encoding", b"chunked")]
    body = json.dumps(env.body(1, 1)).encode()
    # a chunked body (no Content-Length) in two messages: read whole, admitted
    sent = await _asgi(fast, "POST", BASE + "/participant", chunked,
                       [{"type": "http.request", "body": body[:10], "more_body": True},
                        {"type": "http.request", "body": body[10:], "more_body": False}])
    assert sent[0]["status"] == 202 and fast.answered == 1
    names = [k for k, _ in sent[0]["headers"]]
    assert b"cache-control" in names and b"location" in names
    # a chunked body over the limit: 413 with Quart's own envelope, on both paths
    big = [{"type": "http.request", "body": b"x" * 1500, "more_body": True},
           {"type": "http.request", "body": b"x" * 1500, "more_body": False}]
    over = [await _asgi(app, "POST", BASE + "/spaces", chunked, list(big))
            for app in (fast, fast.app)]
    assert fast.answered == 2
    assert over[0][0]["status"] == over[1][0]["status"] == 413
    assert over[0][1]["body"] == over[1][1]["body"]
    assert json.loads(over[0][1]["body"])["error"] == {
        "code": "body_too_large", "message": "request body is over the configured limit",
        "limit": 2048}
    # the client goes away before its body: nothing is admitted, nothing is answered
    journal = env.handler.state.journal_file.journal
    before = journal.save_state().next_record
    sent = await _asgi(fast, "POST", BASE + "/spaces", [*auth, (b"content-length", b"100")],
                       [], then_disconnect=True)
    assert sent == [] and fast.answered == 2
    assert journal.save_state().next_record == before
    # a malformed Content-Length is left to Quart (which still answers with the envelope)
    body = json.dumps(env.body(2, 2)).encode()
    sent = await _asgi(fast, "POST", BASE + "/spaces", [*auth, (b"content-length", b"x1")],
                       [{"type": "http.request", "body": body, "more_body": False}])
    assert fast.answered == 2
    assert sent[0]["status"] == 202   # Quart ignores the unreadable length and reads the body
    # other methods on the same path stay Quart's (405 with the envelope)
    sent = await _asgi(fast, "PUT", BASE + "/spaces", auth, [{"type": "http.request"}])
    assert sent[0]["status"] == 405 and fast.answered == 2
