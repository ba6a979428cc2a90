"""The quotas issue 10 item 4 still lacked, through a real hypercorn on loopback + httpx:
member rows per owner (``limits.max_members_per_principal``), media bytes per uploader
(``limits.max_media_bytes_per_principal``), and the request rate of the OpenAI-compatible
``/v1/*`` routes (``limits.v1_requests_per_second`` / ``v1_request_burst``).  Over each is
429 ``over_quota`` naming the quota, with ``Retry-After``; another principal is never
affected, and the counts hold across a restart of the runtime."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio
from _gateway_env import ALL, TINY_MODEL, served
from test_gateway_quota import Caller, _key, _ok, _over

from aotx_trio.config import Limits
from aotx_trio.native import lib as native
from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(120)


def test_defaults_leave_the_member_table_room_for_eight_principals() -> None:
    lim = Limits()
    caps = native.capacities()
    assert 8 * lim.max_members_per_principal < caps["members"]
    assert lim.max_media_bytes_per_principal >= 8 * lim.max_media_bytes  # 8 full uploads
    assert lim.v1_requests_per_second > 0 and lim.v1_request_burst >= 1


def _par(srv_lineage: str, name: str) -> str:
    return f"par-{srv_lineage}-{_key(name)}"


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "quart"])
async def test_member_rows_are_counted_against_the_spaces_owner(tmp_path: Path,
                                                                fast: bool) -> None:
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, fast_mutations=fast,
                      limits={"max_members_per_principal": 3}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        _ok(await alice.post("/participant"))
        _ok(await bob.post("/participant"))
        s1 = _ok(await alice.post("/spaces", scope="room"))["resource"]
        s2 = _ok(await alice.post("/spaces", scope="room"))["resource"]
        assert (await alice.get(f"/spaces/{s1}/members")).json()["items"] == []  # no own row
        for i, space in enumerate((s1, s2, s1)):     # 3 rows over her 2 spaces
            _ok(await alice.post(f"/spaces/{space}/members",
                                 participant=_par(srv.lineage, f"guest{i}"),
                                 permissions=["read"]))
        for space in (s1, s2):                       # a 4th row is over, in either space
            err = _over(await alice.post(f"/spaces/{space}/members",
                                         participant=_par(srv.lineage, "one-more"),
                                         permissions=["read"]), "members")
            assert err["limit"] == 3
            alice.seq -= 1                           # refused before the device
        # changing a row that exists takes none
        _ok(await alice.post(f"/spaces/{s2}/members", participant=_par(srv.lineage, "guest1"),
                             permissions=["read", "write"]))
        # bob's spaces are his own quota
        b1 = _ok(await bob.post("/spaces", scope="room"))["resource"]
        _ok(await bob.post(f"/spaces/{b1}/members", participant=_par(srv.lineage, "carol"),
                           permissions=["read"]))


async def test_a_manager_spends_the_owners_member_rows(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL, "bob": ALL},
                      limits={"max_members_per_principal": 3}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        _ok(await alice.post("/participant"))
        _ok(await bob.post("/participant"))
        s1 = _ok(await alice.post("/spaces", scope="room"))["resource"]
        _ok(await alice.post(f"/spaces/{s1}/members", participant=_par(srv.lineage, "bob"),
                             permissions=["read", "write", "manage"]))
        for i in range(2):                          # bob's row + 2 = the owner's 3
            _ok(await bob.post(f"/spaces/{s1}/members",
                               participant=_par(srv.lineage, f"guest{i}"), permissions=["read"]))
        err = _over(await bob.post(f"/spaces/{s1}/members",
                                   participant=_par(srv.lineage, "guest-x"),
                                   permissions=["read"]), "members")
        assert err["limit"] == 3


async def test_media_bytes_per_uploader(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL, "bob": ALL},
                      limits={"max_media_bytes_per_principal": 5000}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        _ok(await alice.post("/participant"))
        _ok(await bob.post("/participant"))

        async def upload(who: Caller, data: bytes) -> httpx.Response:
            return await http.post(BASE_PATH + "/media", content=data,
                                   headers={**who.auth, "Content-Type": "image/png"})

        a, b, c = os.urandom(2000), os.urandom(2000), os.urandom(1001)
        assert (await upload(alice, a)).status_code == 201
        assert (await upload(alice, b)).status_code == 201
        err = _over(await upload(alice, c), "media_bytes")          # 4000 + 1001 > 5000
        assert err["limit"] == 5000
        assert (await upload(alice, a)).status_code == 200          # owned already: no bytes
        assert (await upload(alice, c[:1000])).status_code == 201   # exactly 5000
        _over(await upload(alice, b"x"), "media_bytes")
        # bob has his own quota, even for the same bytes alice stored
        assert (await upload(bob, a)).status_code == 201
        assert (await upload(bob, c)).status_code == 201


async def test_media_bytes_are_counted_from_the_store_after_a_restart(
        tmp_path: Path) -> None:
    """A fresh runtime on the same folder counts what each principal's owner records
    hold (the restart of the runtime process, without the process)."""
    from aotx_trio.runtime.media import MediaStore
    from aotx_trio.runtime.quota import MediaQuota
    from aotx_trio.runtime.quota import errors as quota_errors

    class Lim:
        receipts = spaces = conversations = members = 1
        media_bytes = 3000

    first = MediaQuota(MediaStore(tmp_path / "media"))
    await first.put(Lim(), "aa" * 16, "image/png", os.urandom(2500))
    await first.put(Lim(), "bb" * 16, "image/png", os.urandom(2500))
    again = MediaQuota(MediaStore(tmp_path / "media"))     # after the restart
    with pytest.raises(quota_errors.Refusal) as info:
        await again.put(Lim(), "aa" * 16, "image/png", os.urandom(600))
    assert info.value.code == "over_quota" and info.value.fields["quota"] == "media_bytes"
    media, created = await again.put(Lim(), "bb" * 16, "image/png", os.urandom(500))
    assert created and media.bytes == 500                  # exactly 3000


async def test_v1_routes_have_a_rate_of_their_own(tmp_path: Path) -> None:
    limits = {"v1_requests_per_second": 1, "v1_request_burst": 3,
              "requests_per_second": 0}
    actions = (*ALL, "models_read", "models_invoke")
    async with served(tmp_path, {"alice": actions, "bob": actions}, limits=limits) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        chat = {"model": TINY_MODEL, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}
        assert (await http.get("/v1/models", headers=bob.auth)).status_code == 200
        r = await http.post("/v1/chat/completions", json=chat, headers=bob.auth)
        assert r.status_code == 200, r.text
        r = await http.post("/v1/embeddings", json={"input": "hi"}, headers=bob.auth)
        assert r.status_code != 429, r.text           # the third request: the burst is 3
        for path, send in (("/v1/models", None), ("/v1/chat/completions", chat),
                           ("/v1/embeddings", {"input": "hi"})):
            r = await (http.get(path, headers=bob.auth) if send is None
                       else http.post(path, json=send, headers=bob.auth))
            err = _over(r, "v1_requests")
            assert err["limit"] == 1
        # alice's bucket is hers; the shared API is not charged by /v1/*
        assert (await http.get("/v1/models", headers=alice.auth)).status_code == 200
        _ok(await bob.post("/participant"))
        # a bad token is the route's own 401, not a quota
        r = await http.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401
        await trio.sleep(1.1)                          # one token back
        assert (await http.get("/v1/models", headers=bob.auth)).status_code == 200


def test_a_member_row_seen_once_is_not_scanned_for_again() -> None:
    """Quotas remembers the member rows it found on the device (rows are never freed): a
    member.set of a known row neither scans the space's rows again nor charges anyone,
    and a new row is still charged to the space's owner."""
    from dataclasses import dataclass

    from test_device import A, B, Rig

    from aotx_trio import errors
    from aotx_trio.native import device as D
    from aotx_trio.runtime.quota import Quotas

    @dataclass
    class Lim:
        receipts: int = 100
        spaces: int = 100
        conversations: int = 100
        members: int = 1
        media_bytes: int = 0

    rig = Rig()
    try:
        rig.register(A, B)
        space = rig.space(A, scope="room")
        quotas = Quotas(rig.dev)
        scans = 0
        members = rig.dev.members

        def counted(*args: object, **kw: object) -> tuple[list[D.Member], int]:
            nonlocal scans
            scans += 1
            return members(*args, **kw)   # type: ignore[arg-type]

        rig.dev.members = counted         # type: ignore[method-assign]

        def member_set(who: str) -> D.Request:
            return rig.req(A, D.Kind.MEMBER_SET, space=space, participant=who,
                           permissions=("read",))

        first = member_set(B)
        quotas.check(Lim(), A, first)        # a new row: charged to the owner (A)
        assert scans == 2 and quotas._new_row == A   # its rows, then the owner's count
        scans = 0
        quotas.admitted(A, rig.dev.submit(D.ALL_GRANTS, A, first))
        again = member_set(B)
        quotas.check(Lim(), A, again)        # found on the device: no charge, remembered
        assert scans == 1 and quotas._new_row is None
        rig.dev.submit(D.ALL_GRANTS, A, again)
        for _ in range(3):                   # known: no scan, no charge, even at the limit
            req = member_set(B)
            quotas.check(Lim(), A, req)
            assert quotas._new_row is None
            rig.dev.submit(D.ALL_GRANTS, A, req)
        assert scans == 1
        with pytest.raises(errors.AotxError) as info:   # a new row is over
            quotas.check(Lim(), A, member_set("c3" * 16))
        assert info.value.code == "over_quota" and scans == 2
    finally:
        rig.dev.close()
