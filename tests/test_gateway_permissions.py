"""The permission matrix, property-based: for every space scope, explicit member-row
state and grant combination, a read or a write by another participant succeeds
exactly when the current grants and the space rights both allow it; a refusal is
404 when the caller has no rights in the space at all (existence is not revealed)
and 403 otherwise."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import trio
from _gateway_env import ALL, embedded, make_runtime_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BASE = "/aotx/v1/shared"
READ, WRITE, MANAGE = 1, 2, 4
PERMS = ("read", "write", "manage")
GRANT_SETS = [tuple(c) for n in range(4) for c in itertools.combinations(ALL, n)]


def expected(scope: str, row: int | None, grants: tuple[str, ...], action: str) -> int:
    """The status a read (GET the space) or write (create a conversation) gets."""
    resolved = row if row is not None else (READ | WRITE if scope == "instance" else 0)
    mask = sum(1 << i for i, g in enumerate(ALL) if g in grants)
    need_action, need_right, ok = (("shared_read", READ, 200) if action == "read"
                                   else ("shared_write", WRITE, 202))
    if need_action not in grants:
        return 403                     # the gateway's action check
    if resolved & mask & need_right:
        return ok
    return 404 if resolved == 0 else 403


@pytest.fixture(scope="module")
def runtime_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_runtime_file(tmp_path_factory.mktemp("rt"))


async def _case(ccir: Path, scope: str, row: int | None, grants: tuple[str, ...]) -> None:
    principals = {"alice": ALL, "bob": grants}
    async with embedded(ccir.parent, principals, deployed={"alice": ALL, "bob": ALL},
                        ccir=ccir) as env:
        async def admin(who: str, kind: str, key: int, seq: int, **fields: Any) -> Any:
            out = await env.handler.call("mutation.submit", {
                "principal": who, "actions": list(ALL), "kind": kind,
                "body": env.body(key, seq, **fields)})
            return out["receipt"]

        await admin("alice", "participant.register", 1, 1)
        await admin("bob", "participant.register", 1, 1)   # setup: bob's own full grants
        space = (await admin("alice", "space.create", 2, 2, scope=scope))["resource"]
        if row is not None:
            await admin("alice", "member.set", 3, 3, space=space, participant=env.par("bob"),
                        permissions=[p for i, p in enumerate(PERMS) if row & (1 << i)])
        auth = env.auth("bob")
        read = await env.client.get(f"{BASE}/spaces/{space}", headers=auth)
        assert read.status_code == expected(scope, row, grants, "read"), \
            (scope, row, grants, await read.get_data(as_text=True))
        if read.status_code == 200:
            body = await read.get_json()
            allowed = (row if row is not None else READ | WRITE) & \
                sum(1 << i for i, g in enumerate(ALL) if g in grants)
            assert body["permissions"] == [p for i, p in enumerate(PERMS) if allowed & (1 << i)]
        write = await env.client.post(f"{BASE}/spaces/{space}/conversations", headers=auth,
                                      json=env.body(9, 2))
        assert write.status_code == expected(scope, row, grants, "write"), \
            (scope, row, grants, await write.get_data(as_text=True))
        if write.status_code != 202:   # a refusal changed nothing
            me = await env.handler.call("participant.get",
                                        {"principal": "bob", "actions": list(ALL)})
            assert me["next_sequence"] == "2"


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scope=st.sampled_from(["private", "room", "instance"]),
       row=st.one_of(st.none(), st.integers(0, 7)),
       grants=st.sampled_from(GRANT_SETS))
def test_permission_matrix(runtime_file: Path, scope: str, row: int | None,
                           grants: tuple[str, ...]) -> None:
    trio.run(_case, runtime_file, scope, row, grants)


def test_the_model_itself() -> None:
    """A few fixed points of the oracle, spelled out."""
    assert expected("private", None, ALL, "read") == 404
    assert expected("instance", None, ALL, "read") == 200
    assert expected("instance", 0, ALL, "read") == 404          # zero row blocks instance
    assert expected("room", READ, ALL, "write") == 403           # visible, not writable
    assert expected("room", READ | WRITE, ("shared_read",), "write") == 403
    assert expected("room", WRITE, ALL, "read") == 403


async def test_only_the_owner_changes_the_owners_rights(tmp_path: Path,
                                                        runtime_file: Path) -> None:
    """A member with manage cannot reduce (or change) the owner's rights: 403, and the
    owner keeps every right; the owner still can change their own row."""
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL}, ccir=runtime_file) as env:
        c = env.client

        async def post(who: str, path: str, body: dict[str, Any]) -> Any:
            return await c.post(BASE + path, headers=env.auth(who), json=body)

        for i, who in enumerate(("alice", "bob")):
            assert (await post(who, "/participant", env.body(10 + i, 1))).status_code == 202
        r = await post("alice", "/spaces", env.body(20, 2, scope="room"))
        space = (await r.get_json())["resource"]
        r = await post("alice", f"/spaces/{space}/members",
                       env.body(21, 3, participant=env.par("bob"), permissions=["manage"]))
        assert r.status_code == 202
        r = await post("bob", f"/spaces/{space}/members",
                       env.body(30, 2, participant=env.par("alice"), permissions=[]))
        assert r.status_code == 403, await r.get_data(as_text=True)
        assert (await r.get_json())["error"]["code"] == "forbidden"
        got = await c.get(f"{BASE}/spaces/{space}", headers=env.auth("alice"))
        assert (await got.get_json())["permissions"] == ["read", "write", "manage"]
        r = await post("bob", f"/spaces/{space}/members",     # a manager may set his own row
                       env.body(31, 2, participant=env.par("bob"),
                                permissions=["read", "write", "manage"]))
        assert r.status_code == 202
        r = await post("alice", f"/spaces/{space}/members",
                       env.body(22, 4, participant=env.par("alice"),
                                permissions=["read", "manage"]))
        assert r.status_code == 202


async def test_adding_a_member_never_reveals_whether_a_name_is_registered(
        tmp_path: Path) -> None:
    """Issue 10 item 8, through a real hypercorn: a manager adding a registered
    non-member (bob) and a guessable name nobody registered (carol) gets the same status
    and the same body but for the operation's own ids; carol's row applies once she
    registers."""
    import httpx
    from _gateway_env import served, token_for

    async with served(tmp_path, {"alice": ALL, "bob": ALL, "carol": ALL}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        def body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
            return {"schema": "aotx.shared.mutation.v1", "lineage": srv.lineage,
                    "operation_key": f"{key:032x}", "sequence": str(seq), **fields}

        def auth(who: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {token_for(who)}"}

        from aotx_trio.vocab import principal_key
        par = {n: f"par-{srv.lineage}-{principal_key(n)}" for n in ("bob", "carol")}
        assert (await http.post(f"{BASE}/participant", headers=auth("alice"),
                                json=body(1, 1))).status_code == 202
        assert (await http.post(f"{BASE}/participant", headers=auth("bob"),
                                json=body(2, 1))).status_code == 202
        room = (await http.post(f"{BASE}/spaces", headers=auth("alice"),
                                json=body(3, 2, scope="room"))).json()["resource"]
        answers = []
        for seq, who in ((3, "bob"), (4, "carol")):
            resp = await http.post(f"{BASE}/spaces/{room}/members", headers=auth("alice"),
                                   json=body(10 + seq, seq, participant=par[who],
                                             permissions=["read"]))
            answers.append((resp.status_code, resp.json()))

        def shape(receipt: dict[str, Any]) -> dict[str, Any]:
            own = ("operation", "operation_key", "sequence", "device", "admission",
                   "terminal", "save")
            return {k: v for k, v in receipt.items() if k not in own}

        (s1, r1), (s2, r2) = answers
        assert s1 == s2 == 202, answers
        assert shape(r1) == shape(r2)
        assert set(r1) == set(r2)
        listed = (await http.get(f"{BASE}/spaces/{room}/members",
                                 headers=auth("alice"))).json()
        assert {m["participant"] for m in listed["items"]} >= set(par.values())
        assert (await http.get(f"{BASE}/spaces/{room}",
                               headers=auth("carol"))).status_code == 404
        assert (await http.post(f"{BASE}/participant", headers=auth("carol"),
                                json=body(5, 1))).status_code == 202
        got = await http.get(f"{BASE}/spaces/{room}", headers=auth("carol"))
        assert got.status_code == 200 and got.json()["permissions"] == ["read"]
