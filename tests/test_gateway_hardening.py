"""Issue 25 ("Hardening, round 2"), the gateway's side, through a real hypercorn on
loopback with httpx: writes held by the journal, the metrics' route labels, body
errors on every route, ambiguous requests, media records and per-principal
quotas."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from _gateway_env import ALL, served, token_for
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


async def test_media_upload_is_held_with_the_journal(tmp_path: Path) -> None:
    """Item 14: POST /media during a journal hold is 429 journal_hold like every write;
    nothing is stored."""
    st = os.statvfs(tmp_path)
    floor = st.f_bavail * st.f_frsize + (1 << 40)     # more than the disk has free
    async with served(tmp_path, {"alice": ALL},
                      limits={"journal_min_free_bytes": floor}) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        r = await http.post(BASE_PATH + "/participant", headers=_auth("alice"), json={
            "schema": SCHEMA, "lineage": srv.lineage, "operation_key": "1" * 32,
            "sequence": "1"})
        _error(r, 429, "journal_hold")
        r = await http.post(BASE_PATH + "/media", headers=_auth("alice", "image/png"),
                            content=PNG)
        err = _error(r, 429, "journal_hold")
        assert err["hold"] == ["disk"] and r.headers["retry-after"] == "1"
        media = srv.handler.services.media
        assert media is not None and not (media.folder / "blobs").exists()


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
