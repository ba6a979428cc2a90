"""The shared-conversations routes end to end in-process (app -> client -> service ->
device -> journal on disk), one status code of docs/api.md's table at a time."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
from _gateway_env import ALL, Env, embedded

BASE = "/aotx/v1/shared"
READ_WRITE = ("shared_read", "shared_write")


async def _json(resp: Any) -> Any:
    return await resp.get_json(force=True)


async def _post(env: Env, who: str, path: str, body: Any) -> Any:
    return await env.client.post(BASE + path, headers=env.auth(who), json=body)


async def _get(env: Env, who: str, path: str) -> Any:
    return await env.client.get(BASE + path, headers=env.auth(who))


async def _error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, await resp.get_data(as_text=True)
    assert resp.headers["Cache-Control"] == "no-store"
    body = await _json(resp)
    assert set(body) == {"error"}
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    err: dict[str, Any] = body["error"]
    return err


async def _register(env: Env, who: str, key: int = 1) -> dict[str, Any]:
    resp = await _post(env, who, "/participant", env.body(key, 1))
    assert resp.status_code == 202, await resp.get_data(as_text=True)
    body: dict[str, Any] = await _json(resp)
    return body


async def _space(env: Env, who: str, key: int, seq: int, **fields: Any) -> str:
    resp = await _post(env, who, "/spaces", env.body(key, seq, **fields))
    assert resp.status_code == 202, await resp.get_data(as_text=True)
    resource: str = (await _json(resp))["resource"]
    return resource


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    async with embedded(tmp_path, {"alice": ALL, "bob": ALL, "carol": READ_WRITE,
                                   "reader": ("shared_read",)}) as e:
        yield e


async def test_capabilities_and_participant_before_registration(env: Env) -> None:
    resp = await _get(env, "reader", "/capabilities")
    assert resp.status_code == 200
    caps = await _json(resp)
    assert caps["lineage"] == env.lineage
    assert caps["schema"] == "aotx.shared.mutation.v1"
    assert caps["capacities"]["spaces"] >= 1 and caps["capacities"]["receipts"] >= 1
    assert caps["limits"]["max_body_bytes"] == 1024 * 1024
    text = [m for m in caps["models"] if m["kind"] == "text"]
    assert [m["name"] for m in text] == ["tiny.gguf"] and text[0]["ready"] is True
    assert len(text[0]["digest"]) == 64 and text[0]["context_length"] > 0
    assert text[0]["kv_type"] == "f16"                 # packed by `aotx pack`: f16 KV
    assert [m["ready"] for m in caps["models"] if m["kind"] == "embedding"] == [False]
    assert caps["features"]["inputs"] is True
    assert caps["usage"] is None                       # reader lacks shared_manage
    manager = await _json(await _get(env, "alice", "/capabilities"))
    assert manager["usage"]["participants"] == 0 and manager["capacities"] == caps["capacities"]
    resp = await _get(env, "alice", "/participant")
    assert resp.status_code == 200
    assert await _json(resp) == {"lineage": env.lineage, "participant": None,
                                 "next_sequence": "1", "retry_floor": "1"}


async def test_register_then_exact_retry_returns_the_same_receipt(env: Env) -> None:
    resp = await _post(env, "alice", "/participant", env.body(1, 1))
    assert resp.status_code == 202
    first = await _json(resp)
    assert resp.headers["Location"] == f"{BASE}/operations/{first['operation']}"
    assert first["kind"] == "participant.register"
    assert first["participant"] == env.par("alice")
    assert first["sequence"] == "1" and first["operation_key"] == f"{1:032x}"
    assert first["admission"]["saved"] is True            # answered after the save
    assert int(first["save"]["saved_records"]) > int(first["admission"]["record"])
    assert first["operation"].startswith(f"op-{env.lineage}-")
    resp = await _post(env, "alice", "/participant", env.body(1, 1))
    assert resp.status_code == 200
    again = await _json(resp)
    assert again["operation"] == first["operation"]
    assert again["admission"] == first["admission"]
    resp = await _get(env, "alice", "/participant")
    me = await _json(resp)
    assert me["participant"]["id"] == env.par("alice")
    assert me["next_sequence"] == "2"
    assert me["retry_floor"] == me["participant"]["retry_floor"] == "1"   # as before
    resp = await _get(env, "alice", f"/operations/{first['operation']}")
    assert resp.status_code == 200
    assert (await _json(resp))["operation"] == first["operation"]


async def test_spaces_conversations_and_members(env: Env) -> None:
    await _register(env, "alice")
    await _register(env, "bob")
    private = await _space(env, "alice", 2, 2)
    assert private == f"spc-{env.lineage}-{2:032x}"  # omitted id = the operation key
    room = await _space(env, "alice", 3, 3, scope="room", id=f"{0xabc:032x}")
    assert room == f"spc-{env.lineage}-{0xabc:032x}"
    resp = await _get(env, "alice", "/spaces")
    listed = await _json(resp)
    assert {s["id"]: s["scope"] for s in listed["items"]} == {private: "private", room: "room"}
    assert listed["next_cursor"] is None
    resp = await _get(env, "alice", f"/spaces/{room}")
    space = await _json(resp)
    assert space["owner"] == env.par("alice")
    assert space["permissions"] == ["read", "write", "manage"]

    resp = await _post(env, "alice", f"/spaces/{room}/conversations", env.body(4, 4))
    assert resp.status_code == 202
    con = (await _json(resp))["resource"]
    assert con == f"con-{env.lineage}-{4:032x}"
    resp = await _get(env, "alice", f"/spaces/{room}/conversations")
    assert [c["id"] for c in (await _json(resp))["items"]] == [con]
    resp = await _get(env, "alice", f"/conversations/{con}")
    got = await _json(resp)
    assert got["space"] == room and got["creator"] == env.par("alice") and got["inputs"] == "0"

    # Bob sees nothing of the room until he is a member.
    await _error(await _get(env, "bob", f"/spaces/{room}"), 404, "space_not_found")
    resp = await _post(env, "alice", f"/spaces/{room}/members",
                       env.body(5, 5, participant=env.par("bob"), permissions=["read"]))
    assert resp.status_code == 202
    resp = await _get(env, "bob", f"/spaces/{room}")
    assert (await _json(resp))["permissions"] == ["read"]
    resp = await _get(env, "bob", f"/conversations/{con}")
    assert resp.status_code == 200
    resp = await _get(env, "alice", f"/spaces/{room}/members")
    members = (await _json(resp))["items"]
    bob_row = next(m for m in members if m["participant"] == env.par("bob"))
    assert bob_row["permissions"] == ["read"]
    assert bob_row["next_sequence"] is None and bob_row["retry_floor"] is None  # foreign
    # Read-only member: writing is forbidden (403), not hidden.
    await _error(await _post(env, "bob", f"/spaces/{room}/conversations", env.body(2, 2)),
                 403, "forbidden")
    resp = await _get(env, "alice", "/participant")
    assert (await _json(resp))["next_sequence"] == "6"


async def test_other_participants_operations_are_hidden(env: Env) -> None:
    """Only input receipts (a later issue) are readable by other members; every other
    kind is the submitter's own: another participant gets 404, never 403."""
    await _register(env, "alice")
    await _register(env, "bob")
    room = await _space(env, "alice", 2, 2, scope="room")
    resp = await _post(env, "alice", f"/spaces/{room}/members",
                       env.body(3, 3, participant=env.par("bob"), permissions=["read"]))
    assert resp.status_code == 202
    resp = await _post(env, "alice", f"/spaces/{room}/conversations", env.body(4, 4))
    op = (await _json(resp))["operation"]
    await _error(await _get(env, "bob", f"/operations/{op}"), 404, "operation_not_found")
    await _error(await _get(env, "bob", f"/operations/{op}/result"), 404,
                 "operation_not_found")
    resp = await _get(env, "bob", "/participant")   # bob's own counters are visible
    assert (await _json(resp))["next_sequence"] == "2"


async def test_operation_result_reads_exact_bytes_by_offset(env: Env) -> None:
    receipt = await _register(env, "alice")
    op = receipt["operation"]
    resp = await _get(env, "alice", f"/operations/{op}/result")
    assert resp.status_code == 200
    whole = await _json(resp)
    data = base64.b64decode(whole["data"])
    assert whole["length"] == len(data) == whole["total"] == receipt["result"]["bytes"]
    assert whole["next_offset"] == len(data)
    assert whole["finished"] is True
    try:
        expected_text: str | None = data.decode("utf-8")
    except UnicodeDecodeError:
        expected_text = None
    assert whole["text"] == expected_text
    if len(data) > 3:
        resp = await _get(env, "alice", f"/operations/{op}/result?offset=3")
        tail = await _json(resp)
        assert tail["offset"] == 3
        assert base64.b64decode(tail["data"]) == data[3:]
    resp = await _get(env, "alice", f"/operations/{op}/result?offset={len(data)}")
    end = await _json(resp)
    assert end["length"] == 0 and end["data"] == "" and end["text"] == ""
    await _error(await _get(env, "alice", f"/operations/{op}/result?offset=-1"), 422,
                 "invalid_argument")


async def test_sequence_conflicts_409_and_retry_floor_410(env: Env) -> None:
    await _register(env, "alice")
    await _space(env, "alice", 2, 2)
    # same sequence, other canonical bytes
    await _error(await _post(env, "alice", "/spaces", env.body(2, 2, scope="room")),
                 409, "sequence_conflict")
    # a future sequence
    await _error(await _post(env, "alice", "/spaces", env.body(9, 9)), 409, "future_sequence")
    # the lineage of another runtime
    body = env.body(3, 3)
    body["lineage"] = "f" * 32
    err = await _error(await _post(env, "alice", "/spaces", body), 409, "lineage_mismatch")
    assert err["expected"] == env.lineage
    resp = await _post(env, "alice", "/participant/retirements",
                       env.body(3, 3, retry_floor="3"))
    assert resp.status_code == 202, await resp.get_data(as_text=True)
    assert (await _json(resp))["kind"] == "participant.retire"
    await _error(await _post(env, "alice", "/spaces", env.body(2, 2)), 410, "below_retry_floor")
    resp = await _get(env, "alice", "/participant")
    me = await _json(resp)
    assert me["next_sequence"] == "4" and int(me["retry_floor"]) >= 3


async def test_validation_400_and_422(env: Env) -> None:
    c, auth = env.client, env.auth("alice")
    resp = await c.post(BASE + "/spaces", headers=auth, data=b'{"schema": "\xff"}')
    err = await _error(resp, 400, "invalid_utf8")
    assert err["offset"] == 12
    await _error(await c.post(BASE + "/spaces", headers=auth, data=b'{"schema":'), 400,
                 "malformed_json")
    await _error(await c.post(BASE + "/spaces", headers=auth, data=b"[1]"), 400,
                 "malformed_json")
    bad_schema = env.body(1, 1)
    bad_schema["schema"] = "aotx.shared.mutation.v2"
    err = await _error(await _post(env, "alice", "/spaces", bad_schema), 400, "schema_invalid")
    assert err["field"] == "schema"
    # a body without schema is the same 400 (docs/api.md), not 422 missing_field
    for path in ("/participant", "/spaces", "/participant/retirements"):
        no_schema = env.body(1, 1, colour="red")
        del no_schema["schema"]
        err = await _error(await _post(env, "alice", path, no_schema), 400, "schema_invalid")
        assert err["field"] == "schema" and "schema" in err["message"]
        assert err["expected"] == "aotx.shared.mutation.v1"
    err = await _error(await _post(env, "alice", "/spaces", {}), 400, "schema_invalid")
    assert err["field"] == "schema"
    err = await _error(await _post(env, "alice", "/spaces", env.body(1, 1, colour="red")), 422,
                       "unknown_field")
    assert err["field"] == "colour" and "colour" in err["message"]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"operation_key": "0" * 32}, "operation_key"),
        ({"operation_key": "A" * 32}, "operation_key"),
        ({"operation_key": "1" * 31}, "operation_key"),
        ({"sequence": 1}, "sequence"),
        ({"sequence": "01"}, "sequence"),
        ({"sequence": "0"}, "sequence"),
        ({"sequence": str(1 << 64)}, "sequence"),
        ({"lineage": "xyz"}, "lineage"),
        ({"scope": "public"}, "scope"),
        ({"id": "spc-nope"}, "id"),
    ]
    for change, field in cases:
        body = env.body(1, 1)
        body.update(change)
        err = await _error(await _post(env, "alice", "/spaces", body), 422, "invalid_argument")
        assert err["field"] == field, (change, err)
    body = env.body(1, 1)
    del body["sequence"]
    err = await _error(await _post(env, "alice", "/spaces", body), 422, "missing_field")
    assert err["field"] == "sequence"
    await _error(await _post(env, "alice", "/spaces/x/members",
                             env.body(1, 1, participant="par-x", permissions=["read"])),
                 422, "invalid_argument")
    await _error(await _post(env, "alice", "/spaces/x/members",
                             env.body(1, 1, participant=env.par("bob"), permissions=["own"])),
                 422, "invalid_argument")
    await _error(await _get(env, "alice", "/spaces?limit=0"), 422, "invalid_argument")
    await _error(await _get(env, "alice", "/spaces?cursor=abc"), 422, "invalid_argument")


async def test_not_found_404(env: Env) -> None:
    await _register(env, "alice")
    await _register(env, "bob")
    private = await _space(env, "alice", 2, 2)
    other = f"spc-{'f' * 32}-{2:032x}"
    for path in [f"/spaces/{other}", "/spaces/spc-x", f"/spaces/{private}x",
                 f"/spaces/{env.lineage}", f"/conversations/con-{env.lineage}-{7:032x}",
                 f"/operations/op-{env.lineage}-{7:032x}",
                 f"/operations/op-{env.lineage}-{7:032x}/result",
                 f"/spaces/spc-{env.lineage}-{9:032x}/members"]:
        resp = await _get(env, "alice", path)
        assert resp.status_code == 404, path
        assert (await _json(resp))["error"]["code"].endswith("not_found")
    # A private space of someone else does not exist for bob.
    await _error(await _get(env, "bob", f"/spaces/{private}"), 404, "space_not_found")
    await _error(await _post(env, "bob", f"/spaces/{private}/conversations", env.body(2, 2)),
                 404, "space_not_found")
    # Routes of a later issue are not served (not faked).
    con = f"con-{env.lineage}-{1:032x}"
    await _error(await _get(env, "alice", f"/conversations/{con}/events"), 404,
                 "conversation_not_found")                 # served: an unknown one


async def test_body_over_limit_413(tmp_path: Path) -> None:
    async with embedded(tmp_path, {"alice": ALL}, max_body_bytes=1024) as env:
        body = env.body(1, 1, id="0" * 31 + "1")
        body["pad"] = "x" * 2000
        err = await _error(await _post(env, "alice", "/spaces", body), 413, "body_too_large")
        assert err["limit"] == 1024
        resp = await _get(env, "alice", "/capabilities")
        assert (await _json(resp))["limits"]["max_body_bytes"] == 1024


async def test_journal_hold_429_changes_nothing_and_reads_still_answer(env: Env) -> None:
    receipt = await _register(env, "alice")
    journal = env.handler.state.journal_file.journal
    journal.set_hold(2, True)  # disk pressure
    try:
        await _error(await _post(env, "alice", "/spaces", env.body(2, 2)), 429, "journal_hold")
        resp = await _get(env, "alice", "/participant")
        assert (await _json(resp))["next_sequence"] == "2"          # nothing changed
        resp = await _get(env, "alice", "/spaces")
        assert (await _json(resp))["items"] == []
        resp = await _get(env, "alice", f"/operations/{receipt['operation']}")
        assert resp.status_code == 200                              # receipts still answer
        resp = await _get(env, "alice", "/capabilities")
        assert (await _json(resp))["save"]["hold"] == ["disk"]
        # an exact retry of a saved operation still answers with its receipt
        resp = await _post(env, "alice", "/participant", env.body(1, 1))
        assert resp.status_code == 200, await resp.get_data(as_text=True)
    finally:
        journal.set_hold(2, False)
    assert (await _post(env, "alice", "/spaces", env.body(2, 2))).status_code == 202


async def test_cache_control_on_every_response(env: Env) -> None:
    for resp in [await _get(env, "alice", "/capabilities"),
                 await _get(env, "alice", "/participant"),
                 await env.client.get(BASE + "/participant"),
                 await env.client.get("/nowhere")]:
        assert resp.headers["Cache-Control"] == "no-store"


def test_openapi_describes_exactly_the_served_routes() -> None:
    import re

    from aotx_trio.gateway.app import create_app
    from aotx_trio.service.client import InProcessClient

    text = (Path(__file__).parent.parent / "docs" / "openapi.yaml").read_text()
    documented: set[tuple[str, str]] = set()
    path = None
    for line in text.splitlines():
        if m := re.match(r"^  (/\S+):$", line):
            path = m.group(1)
        elif path and (m := re.match(r"^    (get|post):", line)):
            documented.add((m.group(1).upper(), path))
    app = create_app(InProcessClient(None), [])  # type: ignore[arg-type]
    served = set()
    for rule in app.url_map.iter_rules():
        route = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)
        for method in rule.methods or ():
            if method in ("GET", "POST"):
                served.add((method, route))
    assert documented == served


_SMALL_SCRIPT = r'''
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from _gateway_env import ALL, embedded

async def main():
    out = {}
    names = ["a", "b", "c", "d"]
    async with embedded(Path(tempfile.mkdtemp()), dict.fromkeys(names, ALL)) as env:
        async def post(who, path, body):
            r = await env.client.post("/aotx/v1/shared" + path, headers=env.auth(who), json=body)
            j = await r.get_json()
            if r.status_code < 400:
                return [r.status_code, j]
            err = j["error"]
            extra = [err["table"]] if "table" in err else []
            if r.status_code == 429:
                extra = [r.headers.get("Retry-After"), err.get("retry_after")]
            return [r.status_code, err["code"], *extra]
        out["register"] = [(await post(n, "/participant", env.body(1, 1)))[0] for n in names]
        out["register_d"] = await post("d", "/participant", env.body(1, 1))
        s1 = (await post("a", "/spaces", env.body(2, 2)))[1]["resource"]
        out["space2"] = (await post("a", "/spaces", env.body(3, 3)))[0]
        out["space3"] = await post("a", "/spaces", env.body(4, 4))
        seq, statuses = 4, []
        while True:
            st = await post("a", f"/spaces/{s1}/conversations", env.body(seq, seq))
            statuses.append(st[0] if st[0] < 400 else st)
            if st[0] >= 400 or seq > 20:
                break
            seq += 1
        out["conversations"] = statuses
        out["retire"] = (await post("a", "/participant/retirements",
                                    env.body(seq, seq, retry_floor=str(seq))))[0]
        out["after_retire"] = (await post("a", f"/spaces/{s1}/conversations",
                                          env.body(seq + 1, seq + 1)))[0]
    print(json.dumps(out))

trio.run(main)
'''


@pytest.mark.slow
@pytest.mark.timeout(600)   # a build (<= 240 s) and a child run (<= 300 s)
def test_small_capacity_build_507_and_receipt_table_full(tmp_path: Path) -> None:
    """A build with tiny tables: a full fixed table is 507, a full receipt table 429
    until a retirement frees receipts."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "native"
    env = dict(os.environ, AOTX_MAX_PARTICIPANTS="3", AOTX_MAX_SPACES="2",
               AOTX_MAX_RECEIPTS="8")
    subprocess.run([sys.executable, "build.py", "--out", str(out)],   # the runtime runs models
                   cwd=root, env=env, check=True, capture_output=True, timeout=240)
    env["AOTX_NATIVE_DIR"] = str(out)
    proc = subprocess.run([sys.executable, "-c", _SMALL_SCRIPT, str(Path(__file__).parent)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["register"][:3] == [202, 202, 202]
    assert got["register_d"] == [507, "capacity_exhausted", "participants"]
    assert got["space2"] == 202
    assert got["space3"] == [507, "capacity_exhausted", "spaces"]
    *ok, last = got["conversations"]
    assert ok and all(s == 202 for s in ok)
    assert last == [429, "receipt_table_full", "1", 1]   # Retry-After, also in the body
    assert got["retire"] == 202
    assert got["after_retire"] == 202


async def test_unsaved_admission_is_503_save_pending_then_retry_answers(env: Env) -> None:
    """Fault injection at the I/O edge: fsync fails, so the admission cannot be saved;
    the caller gets 503 save_pending (never a 202 for unsaved work), and once the
    disk recovers an exact retry answers 200 with the saved receipt."""
    import errno as errno_mod

    from aotx_trio.runtime.journal_file import FileOps

    class FailingFsync(FileOps):
        def fsync(self, fd: int) -> None:
            raise OSError(errno_mod.EIO, "injected fsync failure")

    await _register(env, "alice")
    emitter = env.handler.state.emitter
    good = emitter.ops
    emitter.ops = FailingFsync()
    env.handler.save_timeout = 0.3
    try:
        err = await _error(await _post(env, "alice", "/spaces", env.body(2, 2)), 503,
                           "save_pending")
        assert err["operation"].startswith(f"op-{env.lineage}-")
        resp = await _get(env, "alice", "/capabilities")
        assert (await _json(resp))["save"]["disk_error"]["name"] == "EIO"
    finally:
        emitter.ops = good
        env.handler.save_timeout = 30.0
    resp = await _post(env, "alice", "/spaces", env.body(2, 2))
    assert resp.status_code == 200, await resp.get_data(as_text=True)
    receipt = await _json(resp)
    assert receipt["operation"] == err["operation"]
    assert receipt["admission"]["saved"] is True
    # the disk is back: new work is admitted and saved again
    assert (await _post(env, "alice", "/spaces", env.body(3, 3))).status_code == 202
