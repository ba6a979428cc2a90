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
        path = route.path.replace("<space>", "spc-x")
        found = match(path)
        assert found is not None and found[0] is route, path
    found = match(BASE + "/spaces/spc-x/members")
    assert found is not None
    assert (found[0].kind, found[0].actions, found[1]) == ("member.set", ("shared_manage",),
                                                           {"space": "spc-x"})
    found = match(BASE + "/spaces/s/conversations")
    assert found is not None
    assert (found[0].kind, found[0].actions, found[1]) == ("conversation.create",
                                                           ("shared_write",), {"space": "s"})
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


async def _asgi_channel(app: Any, path: str, headers: list[tuple[bytes, bytes]],
                        chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """As :func:`_asgi`, with ``receive`` a trio memory channel's (hypercorn's shape):
    ``chunks`` are queued before the app runs, then the channel stays open."""
    send_ch, recv_ch = trio.open_memory_channel[dict[str, Any]](len(chunks) + 1)
    for chunk in chunks:
        send_ch.send_nowait(chunk)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"test"), *headers], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 2), "extensions": {}}
    await app(scope, recv_ch.receive, send)
    return sent


async def test_queued_bodies_are_taken_without_a_timer_and_answer_alike(env: Env) -> None:
    """Bodies the server queued already (hypercorn's channel) are read with
    receive_nowait: the same answers as awaited reads, limits and disconnects included;
    a body not queued yet is awaited."""
    import json

    fast = env.app.config["AOTX_FAST"]
    assert isinstance(fast, FastMutations)
    auth = [(b"authorization", env.auth("alice")["Authorization"].encode())]
    chunked = [*auth, (b"transfer-encoding", b"chunked")]
    body = json.dumps(env.body(1, 1)).encode()
    parts = [{"type": "http.request", "body": body[:10], "more_body": True},
             {"type": "http.request", "body": body[10:], "more_body": True},
             {"type": "http.request", "body": b"", "more_body": False}]
    sent = await _asgi_channel(fast, BASE + "/participant", chunked, parts)
    assert sent[0]["status"] == 202 and fast.queued_bodies == 1
    again = await _asgi(fast, "POST", BASE + "/participant", chunked, list(parts))
    assert (again[0]["status"], again[1]["body"]) == (200, sent[1]["body"])  # exact retry
    assert fast.queued_bodies == 1
    big = [{"type": "http.request", "body": b"x" * 1500, "more_body": True},
           {"type": "http.request", "body": b"x" * 1500, "more_body": False}]
    over = await _asgi_channel(fast, BASE + "/spaces", chunked, big)
    assert over[0]["status"] == 413 and fast.queued_bodies == 1
    # with a Content-Length, the declared bytes end the body (the end message may
    # still be on its way)
    body = json.dumps(env.body(2, 2)).encode()
    sized = await _asgi_channel(fast, BASE + "/spaces",
                                [*auth, (b"content-length", str(len(body)).encode())],
                                [{"type": "http.request", "body": body, "more_body": True}])
    assert sized[0]["status"] == 202 and fast.queued_bodies == 2
    assert b"close" not in dict(sized[0]["headers"]).get(b"connection", b"")
    gone = await _asgi_channel(fast, BASE + "/spaces", [*auth, (b"content-length", b"100")],
                               [{"type": "http.disconnect"}])
    assert gone == []
    # half the body queued, the rest never comes: awaited under the body timeout (408)
    fast.body_timeout = 0.2
    try:
        late = await _asgi_channel(fast, BASE + "/spaces", chunked, parts[:1])
    finally:
        fast.body_timeout = 30.0
    assert late[0]["status"] == 408 and fast.queued_bodies == 2
    assert (b"connection", b"close") in late[0]["headers"]


async def test_hypercorn_bodies_arrive_queued(tmp_path: Path) -> None:
    """Through a real hypercorn, a request written at once (head and body) is read by
    the fast path from hypercorn's queue, without the timer, on one keep-alive
    connection; the declared length ends the body."""
    import json

    from _gateway_env import SCHEMA, served, token_for

    async with served(tmp_path, {"alice": ALL}) as srv:
        fast = srv.app.config["AOTX_FAST"]
        stream = await trio.open_tcp_stream("127.0.0.1", int(srv.url.rsplit(":", 1)[1]))
        for seq in range(1, 9):
            path = "/participant" if seq == 1 else "/participant/retirements"
            body = json.dumps({"schema": SCHEMA, "lineage": srv.lineage,
                               "operation_key": f"{seq:032x}", "sequence": str(seq),
                               **({"retry_floor": "1"} if seq > 1 else {})}).encode()
            await stream.send_all(
                f"POST {BASE}{path} HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer "
                f"{token_for('alice')}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            data = b""
            while b"\r\n\r\n" not in data:
                data += await stream.receive_some()
            head, _, rest = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 202 "), head
            assert b"connection: close" not in head.lower()
            size = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:"))
            while len(rest) < size:
                rest += await stream.receive_some()
            assert json.loads(rest)["sequence"] == str(seq)
        await stream.aclose()
        assert fast.answered == 8 and fast.queued_bodies == 8
