"""POST /aotx/v1/shared/media through a real hypercorn with httpx: content-addressed,
owned by the uploader, durable before the answer; the route's own body limit; and
inputs that reference media (ownership, then the model's modality)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from _gateway_env import ALL, LINEAGE, SCHEMA, TINY_MODEL, served, token_for

from aotx_trio.runtime.media import MediaStore
from aotx_trio.vocab import media_kind, principal_key

pytestmark = [
    pytest.mark.timeout(120),
    # a refused upload's body is not read: httpx's own body generator is left unfinished
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object ByteStream.__aiter__:"
        "pytest.PytestUnraisableExceptionWarning"),
]
BASE = "/aotx/v1/shared"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
PEOPLE = {"alice": ALL, "bob": ALL, "eve": ("shared_read",)}


def _auth(who: str, content_type: str | None = None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {token_for(who)}"}
    if content_type is not None:
        h["Content-Type"] = content_type
    return h


def _body(key: int, seq: int, **fields: Any) -> dict[str, Any]:
    return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
            "sequence": str(seq), **fields}


def test_media_kind() -> None:
    assert media_kind("image/png") == media_kind(" IMAGE/PNG; q=1") == "image"
    assert media_kind("audio/wav") == "audio"
    for bad in ("", "image", "image/", "text/plain", "application/octet-stream", "imagex/y"):
        assert media_kind(bad) is None, bad


async def test_uploads_are_content_addressed_owned_and_durable(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(base_url=srv.url,
                                                                  timeout=30) as http:
        url = BASE + "/media"
        sha = hashlib.sha256(PNG).hexdigest()
        r = await http.post(url, content=PNG, headers=_auth("alice", "image/png"))
        assert r.status_code == 201, r.text
        assert r.json() == {"type": "image", "sha256": sha, "content_type": "image/png",
                            "bytes": len(PNG)}
        assert r.headers["cache-control"] == "no-store"
        again = await http.post(url, content=PNG, headers=_auth("alice", "image/png"))
        assert (again.status_code, again.json()) == (200, r.json())
        assert (await http.post(url, content=PNG, headers=_auth("bob", "image/png"))
                ).status_code == 201                      # bob's own copy of the same bytes
        # durable and owned, as the runtime finds it on disk
        state = srv.handler.state
        assert state is not None
        store = MediaStore(state.journal_file.path.parent / "media")
        assert store.owned(principal_key("alice"), sha) is not None
        assert (store.folder / "blobs" / sha).read_bytes() == PNG
        assert store.owned(principal_key("eve"), sha) is None
        # refusals
        for headers, status, code in (
                (_auth("alice", "text/plain"), 422, "media_type_invalid"),
                (_auth("alice"), 422, "media_type_invalid"),
                (_auth("eve", "image/png"), 403, "forbidden"),
                ({"Content-Type": "image/png"}, 401, "unauthorized")):
            r = await http.post(url, content=PNG, headers=headers)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
        r = await http.post(url, content=b"", headers=_auth("alice", "audio/wav"))
        assert r.status_code == 422 and r.json()["error"]["field"] == "body"
        caps = (await http.get(BASE + "/capabilities", headers=_auth("alice"))).json()
        assert caps["features"]["media"] is True
        assert caps["limits"]["max_media_bytes"] == 2 * 1024 * 1024


async def test_the_media_route_has_its_own_body_limit(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(base_url=srv.url,
                                                                  timeout=60) as http:
        url = BASE + "/media"
        big = b"\x00" * (1024 * 1024 + 10)          # over max_body_bytes, under the media one
        r = await http.post(url, content=big, headers=_auth("alice", "audio/wav"))
        assert r.status_code == 201, r.text
        over = b"\x01" * (2 * 1024 * 1024 + 1)
        r = await http.post(url, content=over, headers=_auth("alice", "audio/wav"))
        assert r.status_code == 413
        assert r.json()["error"] == {"code": "body_too_large", "limit": 2 * 1024 * 1024,
                                     "message": r.json()["error"]["message"]}

        # other routes keep max_body_bytes
        r = await http.post(BASE + "/spaces", content=big, headers=_auth("alice",
                                                                          "application/json"))
        assert r.status_code == 413


async def test_inputs_reference_only_their_own_media(tmp_path: Path) -> None:
    async with served(tmp_path, PEOPLE) as srv, httpx.AsyncClient(base_url=srv.url,
                                                                  timeout=30) as http:
        sha = (await http.post(BASE + "/media", content=PNG,
                               headers=_auth("alice", "image/png"))).json()["sha256"]
        seq = {"alice": 1, "bob": 1}

        async def post(who: str, path: str, **fields: Any) -> httpx.Response:
            r = await http.post(BASE + path, headers=_auth(who),
                                json=_body(seq[who] * 10 + len(who), seq[who], **fields))
            if r.status_code in (200, 202):
                seq[who] += 1
            return r

        for who in seq:
            assert (await post(who, "/participant")).status_code == 202
        space = (await post("alice", "/spaces", scope="instance")).json()["resource"]
        con = (await post("alice", f"/spaces/{space}/conversations")).json()["resource"]

        async def say(who: str, media: list[dict[str, str]]) -> httpx.Response:
            return await post(who, f"/conversations/{con}/inputs", text="look",
                              model=TINY_MODEL, media=media)

        r = await say("bob", [{"type": "image", "sha256": sha}])    # alice's, not bob's
        assert r.status_code == 404
        assert (r.json()["error"]["code"], r.json()["error"]["field"]) == \
               ("media_not_found", "media[0]")
        r = await say("alice", [{"type": "audio", "sha256": sha}])  # hers, but an image
        assert r.status_code == 404 and r.json()["error"]["code"] == "media_not_found"
        r = await say("alice", [{"type": "image", "sha256": "ab" * 32}])  # nobody's
        assert r.status_code == 404 and r.json()["error"]["code"] == "media_not_found"
        r = await say("alice", [{"type": "image", "sha256": sha}])  # hers: the model is text
        assert r.status_code == 422
        assert (r.json()["error"]["code"], r.json()["error"]["model"]) == \
               ("media_unsupported", TINY_MODEL)
        # nothing was admitted by any of them
        assert (await http.get(f"{BASE}/conversations/{con}", headers=_auth("alice"))
                ).json()["inputs"] == "0"


async def test_an_early_refusal_closes_the_connection(tmp_path: Path) -> None:
    """A refusal answered before the body was read (here 413 on a 2 MiB chat body: the
    admit step checks the declared length before the action) says Connection: close,
    so the client's next request gets a fresh connection instead of waiting behind the
    unread bytes."""
    async with served(tmp_path, {"alice": ("shared_read",)}) as srv, httpx.AsyncClient(
            base_url=srv.url, timeout=10) as http:
        r = await http.post("/v1/chat/completions", content=b"\0" * (2 * 1024 * 1024),
                            headers=_auth("alice", "application/json"))
        assert r.status_code == 413 and r.headers["connection"] == "close"
        r = await http.get(BASE + "/capabilities", headers=_auth("alice"))
        assert r.status_code == 200 and "connection" not in r.headers   # keep-alive stays
