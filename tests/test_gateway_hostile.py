"""Hostile inputs get a 4xx in the error envelope, never a 500, on the fast path and
on the Quart views alike (a real hypercorn on loopback, httpx)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from _gateway_env import ALL, LINEAGE, SCHEMA, served, token_for

pytestmark = pytest.mark.timeout(120)
BASE = "/aotx/v1/shared"
HEAD = f'{{"schema":"{SCHEMA}","lineage":"{LINEAGE}","operation_key":"{1:032x}",'

BODIES = [
    (HEAD + '"sequence":"1","x":' + "9" * 5000 + "}", 400, "malformed_json"),
    (HEAD + '"sequence":"1","x":' + "[" * 100000 + "]" * 100000 + "}", 400,
     "malformed_json"),
    ('{"a":' * 50000 + "1" + "}" * 50000, 400, "malformed_json"),
    (HEAD + '"sequence":"1","x":' + "-" + "1" * 4400 + "}", 400, "malformed_json"),
    (HEAD + '"sequence":1e99999}', 422, None),
    (HEAD + "\"sequence\":\"\u0661\"}", 422, None),
]


@pytest.mark.parametrize("fast", [True, False])
async def test_hostile_bodies_are_4xx(tmp_path: Path, fast: bool) -> None:
    async with served(tmp_path, {"alice": ALL}, fast_mutations=fast,
                      max_body_bytes=1 << 20) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}",
                                       "Content-Type": "application/json"}, timeout=30) as c:
        for body, status, code in BODIES:
            r = await c.post(BASE + "/participant", content=body.encode())
            assert r.status_code == status, (body[:60], r.text[:200])
            err = r.json()["error"]
            assert isinstance(err["message"], str) and len(r.text) < 2000
            if code is not None:
                assert err["code"] == code
        ok = await c.post(BASE + "/participant", content=(HEAD + '"sequence":"1"}').encode())
        assert ok.status_code == 202, ok.text


@pytest.mark.parametrize("query", ["limit=%C2%B2", "limit=%D9%A5", "cursor=%C2%B2",
                                   "limit=" + "9" * 5000, "cursor=" + "1" * 5000,
                                   "limit=-1", "limit=0x10"])
async def test_hostile_query_strings_are_422(tmp_path: Path, query: str) -> None:
    async with served(tmp_path, {"alice": ALL}) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as c:
        r = await c.get(f"{BASE}/spaces?{query}")
        assert r.status_code == 422, r.text
        assert r.json()["error"]["field"] in ("limit", "cursor")
        op = f"op-{LINEAGE}-{1:032x}"
        r = await c.get(f"{BASE}/operations/{op}/result?offset=%C2%B2")
        assert r.status_code == 422 and r.json()["error"]["field"] == "offset"


@pytest.mark.parametrize("fast", [True, False])
async def test_both_framings_at_once_are_refused(tmp_path: Path, fast: bool) -> None:
    """A request with Content-Length and Transfer-Encoding both (request smuggling's
    shape) is 400 in the envelope, never admitted."""
    import trio

    async with served(tmp_path, {"alice": ALL}, fast_mutations=fast) as srv:
        host, port = srv.url.removeprefix("http://").rsplit(":", 1)
        body = (HEAD + '"sequence":"1"}').encode()
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"POST " + BASE.encode() + b"/participant HTTP/1.1\r\nHost: x\r\n"
                b"Authorization: Bearer " + token_for("alice").encode() + b"\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(body):x}".encode() + b"\r\n" + body + b"\r\n0\r\n\r\n")
            reply = b""
            with trio.move_on_after(10):
                while b"\r\n\r\n" not in reply or b'"error"' not in reply:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        break
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
        assert b'"error"' in reply and b'"code"' in reply
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
            me = await c.get(BASE + "/participant",
                             headers={"Authorization": f"Bearer {token_for('alice')}"})
        assert me.json()["participant"] is None          # nothing was admitted


async def test_errors_never_echo_unbounded_input(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": ALL}) as srv, httpx.AsyncClient(
            base_url=srv.url, headers={"Authorization": f"Bearer {token_for('alice')}"},
            timeout=30) as c:
        r = await c.get(f"{BASE}/spaces/{'x' * 20000}")
        assert r.status_code == 404 and len(r.text) < 400
        r = await c.get(f"{BASE}/operations/op-{'y' * 20000}")
        assert r.status_code == 404 and len(r.text) < 400
