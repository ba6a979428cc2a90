"""Per-principal quotas (issue 10 item 4) through a real hypercorn on loopback + httpx,
on both the ASGI fast path and the Quart path: receipts not retired, spaces and
conversations created, and the request rate; over a limit is 429 ``over_quota`` with
``Retry-After``, and one principal at its limit leaves the others unaffected."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from _gateway_env import ALL, SCHEMA, served, token_for

from aotx_trio.config import Limits
from aotx_trio.native import lib as native
from aotx_trio.vocab import BASE_PATH

pytestmark = pytest.mark.timeout(120)


class Caller:
    def __init__(self, http: httpx.AsyncClient, name: str, lineage: str) -> None:
        self.http, self.name, self.lineage, self.seq = http, name, lineage, 0
        self.auth = {"Authorization": f"Bearer {token_for(name)}"}
        self.keys = 0 if name == "alice" else 1 << 64     # distinct operation keys (ids)

    def body(self, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"schema": SCHEMA, "lineage": self.lineage,
                "operation_key": f"{self.keys + self.seq:032x}",
                "sequence": str(self.seq), **fields}

    async def post(self, path: str, **fields: Any) -> httpx.Response:
        return await self.http.post(BASE_PATH + path, headers=self.auth,
                                    json=self.body(**fields))

    async def get(self, path: str) -> httpx.Response:
        return await self.http.get(BASE_PATH + path, headers=self.auth)


def _over(resp: httpx.Response, quota: str) -> dict[str, Any]:
    assert resp.status_code == 429, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert err["code"] == "over_quota" and err["quota"] == quota, err
    assert int(resp.headers["Retry-After"]) == err["retry_after"] >= 1
    return err


def _ok(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code in (200, 202), resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_defaults_leave_the_receipt_table_room_for_eight_principals() -> None:
    lim = Limits()
    caps = native.capacities()
    assert 8 * lim.max_receipts_per_principal < caps["receipts"]
    assert 8 * lim.max_spaces_per_principal < caps["spaces"]
    assert 8 * lim.max_conversations_per_principal < caps["conversations"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "quart"])
async def test_receipt_space_and_conversation_quotas(tmp_path: Path, fast: bool) -> None:
    limits = {"max_receipts_per_principal": 8, "max_spaces_per_principal": 2,
              "max_conversations_per_principal": 2}
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, fast_mutations=fast,
                      limits=limits) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        _ok(await alice.post("/participant"))
        spaces = [_ok(await alice.post("/spaces"))["resource"] for _ in range(2)]
        _over(await alice.post("/spaces"), "spaces")
        alice.seq -= 1                      # refused before the device: sequence unused
        for _ in range(2):
            _ok(await alice.post(f"/spaces/{spaces[0]}/conversations"))
        _over(await alice.post(f"/spaces/{spaces[0]}/conversations"), "conversations")
        alice.seq -= 1
        me = alice.body()["sequence"]
        alice.seq -= 1
        assert me == "6"
        # alice hammers member.set on her own space, concurrently, until the quota
        statuses: list[int] = []

        async def hammer() -> None:
            resp = await alice.post(f"/spaces/{spaces[1]}/members",
                                    participant=f"par-{srv.lineage}-" + _key("alice"),
                                    permissions=["read", "write", "manage"])
            statuses.append(resp.status_code)
            if resp.status_code == 429:
                _over(resp, "receipts")

        for _ in range(4):     # sequences 6..9: 6, 7, 8 fit (8 outstanding), 9 not
            await hammer()
        assert statuses == [202, 202, 202, 429], statuses
        alice.seq -= 1
        # at the quota, an exact retry of a known sequence still answers
        retry = await http.post(BASE_PATH + f"/spaces/{spaces[1]}/members", headers=alice.auth,
                                json={"schema": SCHEMA, "lineage": srv.lineage,
                                      "operation_key": f"{8:032x}", "sequence": "8",
                                      "participant": f"par-{srv.lineage}-" + _key("alice"),
                                      "permissions": ["read", "write", "manage"]})
        assert retry.status_code == 200, retry.text
        # at the quota a cancellation still reaches the device (which refuses this one:
        # its target has ended), never over_quota
        cancel = await alice.post("/participant/cancellations", target_sequence="6")
        assert cancel.status_code != 429, cancel.text
        if cancel.status_code not in (200, 202):
            alice.seq -= 1
        # bob is unaffected: registration and mutations still answer
        _ok(await bob.post("/participant"))
        _ok(await bob.post("/spaces"))
        # the way out: a retirement is never over the receipt quota
        _ok(await alice.post("/participant/retirements", retry_floor="5"))
        _ok(await alice.post(f"/spaces/{spaces[1]}/members",
                             participant=f"par-{srv.lineage}-" + _key("alice"),
                             permissions=["read"]))


def _key(name: str) -> str:
    from aotx_trio.vocab import principal_key
    return principal_key(name)


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "quart"])
async def test_request_rate_is_per_principal(tmp_path: Path, fast: bool) -> None:
    limits = {"requests_per_second": 1, "request_burst": 5}
    async with served(tmp_path, {"alice": ALL, "bob": ALL}, fast_mutations=fast,
                      limits=limits) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        alice, bob = Caller(http, "alice", srv.lineage), Caller(http, "bob", srv.lineage)
        _ok(await bob.post("/participant"))
        for _ in range(4):
            _ok(await bob.get("/participant"))
        err = _over(await bob.get("/participant"), "requests")      # the burst is spent
        assert err["retry_after"] == 1
        _over(await bob.post("/spaces"), "requests")                 # mutations too
        _ok(await alice.post("/participant"))                        # alice unaffected
        _ok(await alice.get("/participant"))
        await trio.sleep(1.1)                                        # one token back
        _ok(await bob.get("/participant"))


def test_the_token_bucket_refills_at_its_rate() -> None:
    from aotx_trio import errors
    from aotx_trio.gateway.quota import RateLimiter

    now = [0.0]
    rate = RateLimiter(2.0, 3, clock=lambda: now[0])
    for _ in range(3):
        rate.take("bob")
    with pytest.raises(errors.Refusal) as info:
        rate.take("bob")
    assert info.value.code == "over_quota" and info.value.fields["retry_after"] == 1
    rate.take("alice")                    # another principal's bucket is its own
    now[0] = 0.5                          # one token back (2 per second)
    rate.take("bob")
    with pytest.raises(errors.Refusal):
        rate.take("bob")
    now[0] = 100.0                        # never more than the burst
    for _ in range(3):
        rate.take("bob")
    with pytest.raises(errors.Refusal):
        rate.take("bob")
    RateLimiter(0, 1).take("anyone")      # rate 0: no limit
