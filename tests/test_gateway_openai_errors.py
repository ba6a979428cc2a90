"""Every ``/v1`` error in OpenAI's shape ``{"error": {"message", "type", "param",
"code"}}``, through a real hypercorn on loopback: raw bodies with httpx (401, 404 of an
unknown route, 405, 413, 429, malformed JSON, invalid UTF-8, a wrong field) and the
official ``openai`` client's exceptions on them; one code vocabulary across routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from _gateway_env import ALL, TINY_MODEL, served, token_for

pytestmark = pytest.mark.timeout(120)
INVOKER = (*ALL, "models_invoke", "models_read")
AUTH = {"Authorization": f"Bearer {token_for('alice')}"}


def _shape(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


async def test_every_v1_error_in_openai_shape(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": INVOKER}, max_body_bytes=4096) as srv, \
            httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
        chat = "/v1/chat/completions"
        ok = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "x"}]}
        got = {
            "401": await http.post(chat, json=ok, headers={"Authorization": "Bearer no"}),
            "404": await http.get("/v1/nothing-here", headers=AUTH),
            "405": await http.get(chat, headers=AUTH),
            "413": await http.post(chat, headers={**AUTH, "Content-Type": "application/json"},
                                   content=b'{"model": "' + b"x" * 5000 + b'"}'),
            "json": await http.post(chat, headers={**AUTH, "Content-Type": "application/json"},
                                    content=b'{"model": '),
            "utf8": await http.post("/v1/embeddings",
                                    headers={**AUTH, "Content-Type": "application/json"},
                                    content=b'{"model": "\xff"}'),
            "field": await http.post(chat, headers=AUTH, json={**ok, "temperature": "hot"}),
            "model": await http.post(chat, headers=AUTH, json={**ok, "model": "nope"}),
        }
        # the shared API keeps its own envelope
        shared = await http.get("/aotx/v1/shared/participant",
                                headers={"Authorization": "Bearer no"})
    status = {k: r.status_code for k, r in got.items()}
    assert status == {"401": 401, "404": 404, "405": 405, "413": 413, "json": 400,
                      "utf8": 400, "field": 400, "model": 404}
    e = {k: _shape(r) for k, r in got.items()}
    assert (e["401"]["type"], e["401"]["code"], e["401"]["param"]) == \
        ("authentication_error", "invalid_api_key", None)
    assert got["401"].headers["WWW-Authenticate"].startswith("Bearer")
    assert (e["404"]["type"], e["404"]["code"]) == ("invalid_request_error", "not_found")
    assert e["405"]["code"] == "method_not_allowed" and "POST" in got["405"].headers["Allow"]
    assert (e["413"]["code"], e["413"]["limit"]) == ("body_too_large", 4096)
    assert (e["json"]["code"], e["json"]["param"]) == ("malformed_json", None)
    assert (e["utf8"]["code"], e["utf8"]["offset"]) == ("invalid_utf8", 11)
    assert (e["field"]["code"], e["field"]["param"]) == ("invalid_parameter", "temperature")
    assert (e["model"]["code"], e["model"]["param"]) == ("model_not_found", "model")
    assert all(r.headers["Cache-Control"] == "no-store" for r in got.values())
    assert "type" not in shared.json()["error"] and shared.status_code == 401


async def test_429_in_openai_shape_and_the_clients_exceptions(tmp_path: Path) -> None:
    limits = {"v1_requests_per_second": 0.001, "v1_request_burst": 2}
    async with served(tmp_path, {"alice": INVOKER}, limits=limits) as srv:
        def run() -> list[tuple[type[Exception], dict[str, Any]]]:
            c = openai.OpenAI(base_url=srv.url + "/v1", api_key=token_for("alice"),
                              max_retries=0, timeout=60)
            seen = []
            for call in (lambda: c.chat.completions.create(   # type: ignore[call-overload]
                             model=TINY_MODEL, temperature="hot",
                             messages=[{"role": "user", "content": "x"}]),
                         c.models.list, c.models.list):
                try:
                    call()
                    seen.append((type(None), {}))
                except openai.APIStatusError as exc:
                    seen.append((type(exc), dict(exc.body) if isinstance(exc.body, dict)
                                 else {}))
            return seen

        seen = await trio.to_thread.run_sync(run)
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            raw = await http.get("/v1/models", headers=AUTH)
    assert seen[0][0] is openai.BadRequestError and seen[0][1]["param"] == "temperature"
    assert seen[0][1]["code"] == "invalid_parameter"
    assert seen[1][0] is type(None)
    assert seen[2][0] is openai.RateLimitError
    assert (seen[2][1]["type"], seen[2][1]["param"]) == ("rate_limit_error", None)
    assert raw.status_code == 429
    assert int(raw.headers["Retry-After"]) == raw.json()["error"]["retry_after"] >= 1
    assert _shape(raw)["code"] == seen[2][1]["code"]
