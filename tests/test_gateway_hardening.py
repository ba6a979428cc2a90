"""Issue 25 ("Hardening, round 2"), the gateway's side, through a real hypercorn on
loopback with httpx: writes held by the journal, the metrics' route labels, body
errors on every route, ambiguous requests, media records and per-principal
quotas."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, make_runtime_file, served, token_for
from prometheus_client.parser import text_string_to_metric_families

from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(120)
SCHEMA = "aotx.shared.mutation.v1"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(32)


def _auth(name: str, content_type: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {token_for(name)}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    return headers


def _error(r: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert r.status_code == status, (r.status_code, r.text)
    err: dict[str, object] = r.json()["error"]
    assert err["code"] == code, r.text
    return err


async def _register_alice(http: httpx.AsyncClient, lineage: str) -> httpx.Response:
    return await http.post(BASE_PATH + "/participant", headers=_auth("alice"), json={
        "schema": SCHEMA, "lineage": lineage, "operation_key": "1" * 32, "sequence": "1"})


def _held_for_disk(r: httpx.Response, srv: Any) -> None:
    """A media upload refused for the disk (429 journal_hold, hold disk): nothing stored."""
    err = _error(r, 429, "journal_hold")
    assert err["hold"] == ["disk"] and r.headers["retry-after"] == "1"
    media = srv.handler.services.media
    assert media is not None and not (media.folder / "blobs").exists()


async def test_media_upload_is_held_with_the_journal(tmp_path: Path) -> None:
    """Item 14: POST /media during a journal hold is 429 journal_hold like every write;
    nothing is stored."""
    st = os.statvfs(tmp_path)
    floor = st.f_bavail * st.f_frsize + (1 << 40)     # more than the disk has free
    async with served(tmp_path, {"alice": ALL},
                      limits={"journal_min_free_bytes": floor}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        r = await _register_alice(http, srv.lineage)
        _error(r, 429, "journal_hold")
        r = await http.post(BASE_PATH + "/media", headers=_auth("alice", "image/png"),
                            content=PNG)
        _held_for_disk(r, srv)


async def test_a_media_upload_never_takes_the_disk_below_the_floor(tmp_path: Path) -> None:
    """Item 4: the disk floor is checked before a blob is written, counting the blob: with
    the floor 1.5 MiB under the free space (no journal hold: a mutation is saved), a
    3 MiB upload is 429 journal_hold (hold disk) and stores nothing, a small one is 201."""
    ccir = make_runtime_file(tmp_path / "rt")       # written before the floor is measured
    st = os.statvfs(tmp_path)
    floor = st.f_bavail * st.f_frsize - (3 << 19)
    async with served(tmp_path, {"alice": ALL}, ccir=ccir,
                      limits={"journal_min_free_bytes": floor,
                              "max_media_bytes": 3 << 20}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        r = await _register_alice(http, srv.lineage)
        assert r.is_success and r.json()["save"]["hold"] == [], r.text   # no journal hold
        big = b"RIFF" + os.urandom((3 << 20) - 4)
        r = await http.post(BASE_PATH + "/media", headers=_auth("alice", "audio/wav"),
                            content=big)
        _held_for_disk(r, srv)
        media = srv.handler.services.media
        assert media is not None and not (media.folder / "owners").exists()
        r = await http.post(BASE_PATH + "/media", headers=_auth("alice", "image/png"),
                            content=PNG)
        assert r.status_code == 201, r.text


async def test_the_media_floor_counts_the_blob_in_whole_blocks(tmp_path: Path) -> None:
    """Item 4, the accounting: a put needs the blob rounded up to blocks plus four blocks
    (owner folder, record, temp files) above the floor; bytes already stored need only
    the record's blocks."""
    from aotx_trio import errors
    from aotx_trio.runtime.media import MediaStore, block_size

    free = [0]
    store = MediaStore(tmp_path / "media", min_free_bytes=1 << 20, free=lambda _p: free[0])
    (tmp_path / "media").mkdir()
    block = block_size(str(tmp_path / "media"))
    data = b"\x89PNG" + bytes(block + 1)            # two blocks
    need = (1 << 20) + 2 * block + 4 * block
    free[0] = need - 1
    with pytest.raises(errors.JournalHold) as info:
        await store.put("a" * 32, "image/png", data)
    assert info.value.fields["hold"] == ["disk"]
    assert not (tmp_path / "media" / "blobs").exists()
    free[0] = need
    media, created = await store.put("a" * 32, "image/png", data)
    assert created and (tmp_path / "media" / "blobs" / media.sha256).read_bytes() == data
    free[0] = (1 << 20) + 4 * block                  # the blob is there: a record only
    assert (await store.put("b" * 32, "image/png", data))[1]
    free[0] -= 1
    with pytest.raises(errors.JournalHold):
        await store.put("c" * 32, "image/png", data)


async def test_v1_routes_are_labelled_and_invoke_bodies_are_400(tmp_path: Path) -> None:
    """Item 14: /v1/* (and every other row) is labelled by its route in the HTTP
    metrics; a body that is not UTF-8 JSON is 400 on /v1 too."""
    who = {"alice": ALL, "ops": ("metrics_read", "models_read", "models_invoke")}
    async with served(tmp_path, who) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        assert (await http.get("/v1/models", headers=_auth("ops"))).status_code == 200
        r = await http.post("/v1/chat/completions", headers=_auth("ops", "application/json"),
                            content=b"{nope")
        _error(r, 400, "malformed_json")
        r = await http.post("/v1/embeddings", headers=_auth("ops", "application/json"),
                            content=b'{"input":"\xff"}')
        assert _error(r, 400, "invalid_utf8")["offset"] == 10
        assert (await http.get("/webhooks/x", headers=_auth("ops"))).status_code == 405
        text = (await http.get("/metrics", headers=_auth("ops"))).text
    seen = {(s.labels["method"], s.labels["route"], s.labels["status"])
            for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name == "aotx_http_requests_total"}
    assert ("GET", "/v1/models", "200") in seen
    assert ("POST", "/v1/chat/completions", "400") in seen
    assert ("POST", "/v1/embeddings", "400") in seen
    assert ("GET", "/webhooks/{uuid}", "405") in seen
    assert not any(route == "other" for _, route, _ in seen), seen


async def _raw(url: str, request: bytes, timeout: float = 10.0) -> bytes:
    """One request on a fresh connection: everything the server sent until it closed
    or ``timeout`` passed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    data = b""
    with trio.move_on_after(timeout):
        await stream.send_all(request)
        while chunk := await stream.receive_some(65536):
            data += chunk
    await stream.aclose()
    return data


def _status_code(raw: bytes) -> tuple[int, str | None]:
    assert raw.startswith(b"HTTP/1.1 "), raw
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    error = json.loads(body).get("error", {}) if body.startswith(b"{") else {}
    return status, error.get("code")


def _json(path: str, body: str) -> str:
    return (f"POST {BASE_PATH}{path} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token_for('alice')}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(body)}\r\n\r\n{body}")


async def test_ambiguous_requests_are_refused(tmp_path: Path) -> None:
    """Item 5, with raw sockets through a real hypercorn (both mutation paths)."""
    alice = f"Authorization: Bearer {token_for('alice')}\r\n"
    spaces = f"POST {BASE_PATH}/spaces HTTP/1.1\r\nHost: x\r\n{alice}"
    caps = f"GET {BASE_PATH}/capabilities HTTP/1.1\r\nHost: x\r\n"
    cases = {
        # framing: a doubled (even equal) or listed length, a doubled coding, both
        spaces + "Content-Length: 2\r\nContent-Length: 2\r\n\r\n{}": (400, "ambiguous_framing"),
        spaces + "Content-Length: 2, 2\r\n\r\n{}": (400, "ambiguous_framing"),
        spaces + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "2\r\n{}\r\n0\r\n\r\n": (400, "ambiguous_framing"),
        spaces + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "2\r\n{}\r\n0\r\n\r\n": (400, "ambiguous_framing"),
        # two credentials (the second one bad, or the same twice)
        caps + alice + "Authorization: Bearer nope\r\n\r\n": (400, "ambiguous_request"),
        caps + alice + alice + "\r\n": (400, "ambiguous_request"),
        # a query parameter twice on the shared API
        f"GET {BASE_PATH}/spaces?limit=1&limit=2 HTTP/1.1\r\nHost: x\r\n{alice}\r\n":
            (400, "ambiguous_request"),
        # JSON under another Content-Type: 415; none declared: read as JSON
        spaces + "Content-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}":
            (415, "unsupported_media_type"),
        spaces + "Content-Type: application/json; charset=utf-8\r\nContent-Length: 2\r\n"
                 "\r\n{}": (400, "schema_invalid"),
        # a key twice in one object (a one-pass body too), at any depth
        _json("/participant", f'{{"schema":"{SCHEMA}","lineage":"{"0" * 32}",'
              f'"operation_key":"{"1" * 32}","operation_key":"{"2" * 32}",'
              '"sequence":"1"}'): (400, "malformed_json"),
        _json("/spaces", f'{{"schema":"{SCHEMA}","schema":"x"}}'): (400, "malformed_json"),
        _json("/spaces", f'{{"schema":"{SCHEMA}","a":{{"b":1,"b":2}}}}'):
            (400, "malformed_json"),
        _json("/spaces", f'{{"schema":"{SCHEMA}","a":{{"b":1}}}}'): (422, "missing_field"),
        # %2F is not a separator, // is not merged
        f"GET {BASE_PATH}%2Fcapabilities HTTP/1.1\r\nHost: x\r\n{alice}\r\n": (404, "not_found"),
        f"GET {BASE_PATH}/spaces%2fx HTTP/1.1\r\nHost: x\r\n{alice}\r\n": (404, "not_found"),
        f"GET {BASE_PATH}//capabilities HTTP/1.1\r\nHost: x\r\n{alice}\r\n": (404, "not_found"),
        f"GET /aotx/v1//shared/capabilities HTTP/1.1\r\nHost: x\r\n{alice}\r\n":
            (404, "not_found"),
        f"GET {BASE_PATH}/capabilities HTTP/1.1\r\nHost: x\r\n{alice}\r\n": (200, None),
    }
    async def one(url: str, request: str, got: dict[str, tuple[int, str | None]]) -> None:
        raw = await _raw(url, request.encode(), 3)
        assert raw, request
        got[request] = _status_code(raw)

    for fast in (True, False):
        got: dict[str, tuple[int, str | None]] = {}
        async with served(tmp_path, {"alice": ALL}, fast_mutations=fast) as srv:
            async with trio.open_nursery() as nursery:
                for request in cases:
                    nursery.start_soon(one, srv.url, request, got)
            for request, want in cases.items():
                assert got[request] == want, (fast, request, got[request])


async def test_expect_continue_over_the_limit_is_413_without_100(tmp_path: Path) -> None:
    """Item 5: a declared length over the route's limit with Expect: 100-continue is
    answered 413 at once, never invited by 100 Continue; under it, 100 comes first."""
    alice = f"Authorization: Bearer {token_for('alice')}\r\n"
    async with served(tmp_path, {"alice": ALL}, max_body_bytes=4096) as srv:
        for path, ctype, length in (("/spaces", "application/json", 5000),
                                    ("/media", "image/png", 3 * 1024 * 1024)):
            raw = await _raw(srv.url, (
                f"POST {BASE_PATH}{path} HTTP/1.1\r\nHost: x\r\n{alice}Content-Type: {ctype}"
                f"\r\nExpect: 100-continue\r\nContent-Length: {length}\r\n\r\n").encode(), 3)
            assert raw.startswith(b"HTTP/1.1 413 "), raw[:200]
            assert b" 100 " not in raw and _status_code(raw) == (413, "body_too_large")
        # under the media limit (over the other one): invited
        raw = await _raw(srv.url, (
            f"POST {BASE_PATH}/media HTTP/1.1\r\nHost: x\r\n{alice}Content-Type: image/png"
            "\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n").encode(), 1)
        assert raw.startswith(b"HTTP/1.1 100 "), raw[:200]


async def test_media_records_keep_their_type(tmp_path: Path) -> None:
    """Item 6: the same bytes again under another type are 409 (the record keeps its
    type; the same type again is 200 with it); the type is on the allowlist."""
    async with served(tmp_path, {"alice": ALL, "bob": ALL}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        url = BASE_PATH + "/media"
        first = await http.post(url, content=PNG, headers=_auth("alice", "image/png"))
        assert first.status_code == 201, first.text
        for other in ("image/jpeg", "audio/wav"):
            r = await http.post(url, content=PNG, headers=_auth("alice", other))
            err = _error(r, 409, "media_type_conflict")
            assert err["content_type"] == "image/png"
        again = await http.post(url, content=PNG, headers=_auth("alice", "IMAGE/PNG; x=1"))
        assert (again.status_code, again.json()) == (200, first.json())
        # another owner's record of the same bytes has its own type
        bob = await http.post(url, content=PNG, headers=_auth("bob", "image/webp"))
        assert bob.status_code == 201 and bob.json()["content_type"] == "image/webp"
        for bad in ("image/x<script>", "image/" + "p" * 300, "image/svg+xml",
                    "audio/", "image/png/x", "text/plain"):
            r = await http.post(url, content=PNG, headers=_auth("alice", bad))
            assert _error(r, 422, "media_type_invalid")["field"] == "Content-Type"


async def test_one_principal_cannot_fill_the_memory_table(tmp_path: Path) -> None:
    """Item 2: memory rows are a per-principal quota (429 over_quota naming
    memory_rows, Retry-After); another principal's input is still admitted."""
    import synth_gguf as sg
    from _gateway_env import LINEAGE, TINY, TINY_MODEL
    from _real import real_embedding_dir

    from aotx_trio.runtime import pack
    from aotx_trio.vocab import principal_key

    ccir = tmp_path / "runtime.aotxccir"
    pack.pack(ccir, models=[sg.write_model(tmp_path / TINY_MODEL, TINY)],
              embedding=real_embedding_dir(), shared=True, lineage=LINEAGE, progress=False)
    seqs: dict[str, int] = {}

    async def post(who: str, path: str, status: int = 202, **fields: object) -> httpx.Response:
        seq = seqs.get(who, 1)
        r = await http.post(BASE_PATH + path, headers=_auth(who), json={
            "schema": SCHEMA, "lineage": LINEAGE, "sequence": str(seq),
            "operation_key": f"{seq:030x}{len(who):02x}", **fields})
        assert r.status_code == status, r.text
        if status in (200, 202):
            seqs[who] = seq + 1
        return r

    async def settled(who: str, op: str) -> None:
        with trio.fail_after(60):
            while not (await http.get(f"{BASE_PATH}/operations/{op}",
                                      headers=_auth(who))).json()["terminal"]["saved"]:
                await trio.sleep(0.02)

    limits = {"max_memory_rows_per_principal": 6}
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, ccir=ccir,
                      limits=limits) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        for who in ("alice", "bob"):
            await post(who, "/participant")
        space = (await post("alice", "/spaces", scope="room")).json()["resource"]
        con = (await post("alice", f"/spaces/{space}/conversations")).json()["resource"]
        await post("alice", f"/spaces/{space}/members", permissions=["read", "write"],
                   participant=f"par-{LINEAGE}-{principal_key('bob')}")
        op = (await post("alice", f"/conversations/{con}/inputs", text="a fact",
                         model=TINY_MODEL, max_output_tokens=2)).json()["operation"]
        await settled("alice", op)                                  # 2 rows
        text_row = (await http.get(f"{BASE_PATH}/spaces/{space}/memory",
                                   headers=_auth("alice"))).json()["items"][0]
        for _ in range(2):                                          # 2 more each
            await post("alice", f"/spaces/{space}/publications", object=text_row["object"],
                       source_version="1")
        r = await post("alice", f"/spaces/{space}/publications", 429,
                       object=text_row["object"], source_version="1")
        err = _error(r, 429, "over_quota")
        assert err["quota"] == "memory_rows" and err["limit"] == 6
        assert r.headers["retry-after"] == "1"
        r = await post("alice", f"/conversations/{con}/inputs", 429, text="more",
                       model=TINY_MODEL, max_output_tokens=2)
        assert _error(r, 429, "over_quota")["quota"] == "memory_rows"
        # bob's input is admitted: alice's quota is not everyone's table
        op = (await post("bob", f"/conversations/{con}/inputs", text="mine",
                         model=TINY_MODEL, max_output_tokens=2)).json()["operation"]
        await settled("bob", op)
        caps = (await http.get(BASE_PATH + "/capabilities", headers=_auth("alice"))).json()
        assert caps["usage"]["memory"] == 8


async def test_one_principal_cannot_hold_every_connection(tmp_path: Path) -> None:
    """Item 2: connections and requests in flight (an SSE stream) are per-principal
    quotas (429 over_quota naming them); another principal is still served."""
    limits = {"max_connections_per_principal": 2, "max_inflight_per_principal": 1,
              "keep_alive_timeout_s": 60}
    caps = "GET {}/capabilities HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\r\n"

    async def connect(url: str) -> trio.SocketStream:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        return await trio.open_tcp_stream(host, int(port))

    async def ask(stream: trio.SocketStream, who: str) -> tuple[int, dict[str, object]]:
        await stream.send_all(caps.format(BASE_PATH, token_for(who)).encode())
        data = b""
        with trio.fail_after(10):
            while True:
                data += await stream.receive_some(65536)
                head, sep, body = data.partition(b"\r\n\r\n")
                length = [int(v) for k, _, v in (h.partition(b":") for h in head.split(b"\r\n"))
                          if k.lower() == b"content-length"]
                if sep and length and len(body) >= length[0]:
                    break
        status = int(head.split(b" ", 2)[1])
        headers = {k.strip().lower().decode(): v.strip().decode()
                   for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])}
        return status, {**headers, "body": json.loads(body)}

    async with served(tmp_path, {"alice": ALL, "bob": ALL}, limits=limits) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        held = [await connect(srv.url) for _ in range(2)]
        for s in held:
            got_ = await ask(s, "alice")
            assert got_[0] == 200, got_[1]["body"]
        third = await connect(srv.url)
        status, got = await ask(third, "alice")
        assert status == 429 and got["connection"] == "close" and got["retry-after"] == "1"
        assert got["body"] == {"error": {"code": "over_quota", "quota": "connections",
                                         "limit": 2, "retry_after": 1,
                                         "message": got["body"]["error"]["message"]}}
        await third.aclose()
        other = await connect(srv.url)
        assert (await ask(other, "bob"))[0] == 200            # bob is served
        assert (await ask(held[0], "alice"))[0] == 200        # on a connection alice holds
        await held[1].aclose()                                # a slot comes back
        with trio.fail_after(10):
            while True:
                again = await connect(srv.url)
                status, _ = await ask(again, "alice")
                if status == 200:
                    break
                await again.aclose()
                await trio.sleep(0.05)
        for s in (held[0], again, other):
            await s.aclose()
        # a stream in flight is alice's one request in flight
        for who in ("alice", "bob"):
            r = await http.post(BASE_PATH + "/participant", headers=_auth(who), json={
                "schema": SCHEMA, "lineage": srv.lineage, "operation_key": "1" * 32,
                "sequence": "1"})
            assert r.status_code == 202, r.text
        space = (await http.post(BASE_PATH + "/spaces", headers=_auth("alice"), json={
            "schema": SCHEMA, "lineage": srv.lineage, "operation_key": "2" * 32,
            "sequence": "2"})).json()["resource"]
        con = (await http.post(f"{BASE_PATH}/spaces/{space}/conversations",
                               headers=_auth("alice"), json={
            "schema": SCHEMA, "lineage": srv.lineage, "operation_key": "3" * 32,
            "sequence": "3"})).json()["resource"]
        url = f"{BASE_PATH}/conversations/{con}/events?stream=true"
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as streamer, \
                streamer.stream("GET", url, headers=_auth("alice")) as sse:
            assert sse.status_code == 200
            r = await http.get(BASE_PATH + "/capabilities", headers=_auth("alice"))
            assert _error(r, 429, "over_quota")["quota"] == "inflight"
            r = await http.get(BASE_PATH + "/capabilities", headers=_auth("bob"))
            assert r.status_code == 200
        with trio.fail_after(10):
            while (await http.get(BASE_PATH + "/capabilities",
                                  headers=_auth("alice"))).status_code != 200:
                await trio.sleep(0.05)


def test_defaults_leave_room_for_eight_principals() -> None:
    """Item 2: the new quotas' defaults leave the shared memory table and the
    connection slots room for 8 principals at full use."""
    from aotx_trio.config import Limits
    from aotx_trio.native import lib as native

    lim = Limits()
    assert 8 * lim.max_memory_rows_per_principal < native.capacities()["memory"]
    assert 8 * lim.max_connections_per_principal <= lim.max_connections
    assert lim.max_inflight_per_principal <= lim.max_connections_per_principal
