"""POST /v1/completions and GET /v1/models/{id} with the official ``openai`` client as
a black box (sync and async, streamed and not) against a real hypercorn on loopback,
on the runtime's own tiny model: each choice equals the engine's own continuation of
the raw prompt."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio
from _gateway_env import ALL, TINY_MODEL, served, token_for

from aotx_trio.native.engine import Engine

pytestmark = pytest.mark.timeout(120)
INVOKER = (*ALL, "models_invoke", "models_read")


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token_for("alice"), max_retries=0,
                         timeout=60)


def _offline(model: Path, prompt: str, n: int) -> str:
    with Engine.load(model, max_seqs=1) as eng:
        ids = eng.tokenize(prompt.encode("utf-8"), add_bos=True, parse_special=False)
        return b"".join(eng.generate(ids, max_tokens=n)).decode("utf-8", "replace")


async def test_completions_sync_streamed_echo_stop_and_lists(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": INVOKER}) as srv:
        def run() -> dict[str, Any]:
            c = _client(srv.url)
            out: dict[str, Any] = {}
            out["one"] = c.completions.create(model=TINY_MODEL, prompt="Once upon a",
                                              max_tokens=8)
            out["default"] = c.completions.create(model=TINY_MODEL, prompt="Once upon a")
            out["list"] = c.completions.create(model=TINY_MODEL, max_tokens=5, n=2,
                                               prompt=["Hello", "The cat"], echo=True)
            out["stream"] = list(c.completions.create(
                model=TINY_MODEL, prompt="Once upon a", max_tokens=8, stream=True,
                echo=True, stream_options={"include_usage": True}))
            return out

        got = await trio.to_thread.run_sync(run)
        model = tmp_path / "rt" / TINY_MODEL
        want = _offline(model, "Once upon a", 8)
        stop = want[2:4] if len(want) >= 4 else None

        def run_stop() -> Any:
            return _client(srv.url).completions.create(
                model=TINY_MODEL, prompt="Once upon a", max_tokens=8, stop=stop)

        stopped = await trio.to_thread.run_sync(run_stop) if stop else None
    one = got["one"]
    assert one.object == "text_completion" and one.id.startswith("cmpl-")
    assert one.choices[0].text == want and one.choices[0].index == 0
    assert one.choices[0].finish_reason in ("stop", "length")
    assert one.system_fingerprint.startswith("fp_")
    assert one.usage.completion_tokens <= 8 and one.usage.prompt_tokens > 0
    assert got["default"].usage.completion_tokens <= 16      # OpenAI's default max_tokens
    assert got["default"].choices[0].text.startswith(want) or \
        got["default"].choices[0].finish_reason == "stop"
    texts = [ch.text for ch in got["list"].choices]
    hello, cat = _offline(model, "Hello", 5), _offline(model, "The cat", 5)
    assert texts == ["Hello" + hello, "Hello" + hello, "The cat" + cat, "The cat" + cat]
    assert [ch.index for ch in got["list"].choices] == [0, 1, 2, 3]
    usage = got["list"].usage
    with Engine.load(model, max_seqs=1) as eng:
        prompt_tokens = sum(len(eng.tokenize(p.encode(), add_bos=True, parse_special=False))
                            for p in ("Hello", "The cat"))
    assert usage.prompt_tokens == prompt_tokens
    chunks = got["stream"]
    assert "".join(ch.text for k in chunks for ch in k.choices) == "Once upon a" + want
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert chunks[-1].usage.total_tokens == one.usage.total_tokens
    if stopped is not None:
        assert stopped.choices[0].text == want[:want.index(stop)]
        assert stopped.choices[0].finish_reason == "stop"


async def test_models_retrieve_created_and_async_completions(tmp_path: Path) -> None:
    before = int(time.time())
    async with served(tmp_path, {"alice": INVOKER}) as srv:
        after = int(time.time())

        async def run() -> dict[str, Any]:
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", max_retries=0,
                                          api_key=token_for("alice"), timeout=60) as c:
                out: dict[str, Any] = {"list": await c.models.list(),
                                       "one": await c.models.retrieve(TINY_MODEL)}
                try:
                    await c.models.retrieve("nope.gguf")
                except openai.NotFoundError as exc:
                    out["missing"] = exc.body
                out["done"] = await c.completions.create(model=TINY_MODEL, prompt="Hi",
                                                         max_tokens=4)
                stream = await c.completions.create(model=TINY_MODEL, prompt="Hi",
                                                    max_tokens=4, stream=True)
                out["pieces"] = [ch.text async for k in stream for ch in k.choices]
                for kw in (dict(logprobs=2), dict(prompt=[1, 2, 3]), dict(best_of=2),
                           dict(suffix="x"), dict(n=9)):
                    try:
                        await c.completions.create(**{"model": TINY_MODEL,  # type: ignore[call-overload]
                                                      "prompt": "Hi", **kw})
                    except openai.BadRequestError as exc:
                        body = exc.body if isinstance(exc.body, dict) else {}
                        out.setdefault("refused", []).append((body.get("param"),
                                                              body.get("code")))
                return out

        got = await trio.to_thread.run_sync(asyncio.run, run())
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            raw = await http.get(f"/v1/models/{TINY_MODEL}",
                                 headers={"Authorization": f"Bearer {token_for('alice')}"})
    rows = {m.id: m for m in got["list"].data}
    one = got["one"]
    assert one.id == TINY_MODEL and one.object == "model" and one.owned_by == "aotx"
    assert before <= one.created <= after and rows[TINY_MODEL].created == one.created
    assert raw.json() == {"id": TINY_MODEL, "object": "model", "created": one.created,
                          "owned_by": "aotx"}
    assert got["missing"]["code"] == "model_not_found" and got["missing"]["param"] == "model"
    want = _offline(tmp_path / "rt" / TINY_MODEL, "Hi", 4)
    assert got["done"].choices[0].text == want and "".join(got["pieces"]) == want
    assert got["refused"] == [("logprobs", "unsupported_parameter"),
                              ("prompt.0", "unsupported_parameter"),
                              ("best_of", "unsupported_parameter"),
                              ("suffix", "unsupported_parameter"),
                              ("n", "invalid_parameter")]


@pytest.mark.xfail(strict=False, reason=(
    "known intermittent hang, open in issue 28: under CPU load (two busy loops beside it) "
    "about 1 run in 4 never finishes the n=3 streamed choices through the service socket "
    "(the client's read times out after 60 s); alone it passes"))
async def test_choices_through_the_service_socket_and_a_client_leaving(
        tmp_path: Path) -> None:
    """As ``aotx gateway serve`` runs it (the runtime behind its service socket): n
    streamed choices arrive whole; a client that leaves mid-stream frees every
    choice's generation (the runtime's executor ends with nothing running)."""
    async with served(tmp_path, {"alice": INVOKER}, socket=True) as srv:
        def run() -> list[Any]:
            c = _client(srv.url)
            whole = list(c.completions.create(model=TINY_MODEL, prompt="Hi", max_tokens=4,
                                              n=3, stream=True))
            with c.completions.create(model=TINY_MODEL, prompt="Hi", max_tokens=200, n=4,
                                      stream=True) as left:
                next(iter(left))
            return whole

        whole = await trio.to_thread.run_sync(run)
        executor = srv.handler.executor
        assert executor is not None
        with trio.fail_after(30):
            while executor.metrics()["running"] or executor.queued():
                await trio.sleep(0.05)
    want = _offline(tmp_path / "rt" / TINY_MODEL, "Hi", 4)
    texts = ["".join(ch.text for k in whole for ch in k.choices if ch.index == i)
             for i in range(3)]
    assert texts == [want] * 3
