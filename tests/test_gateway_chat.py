"""POST /v1/chat/completions and GET /v1/models with the official ``openai`` client
as a black box (sync and streaming, unchanged but for base_url and api_key) against
a real hypercorn on loopback, on the runtime's own tiny model."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
import trio
from _gateway_env import ALL, TINY_MODEL, served, token_for

from aotx_trio.native.engine import Engine
from aotx_trio.runtime.prompt import render_chat

pytestmark = pytest.mark.timeout(120)
INVOKER = (*ALL, "models_invoke", "models_read")


def _client(url: str, who: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=token_for(who), max_retries=0,
                         timeout=60)


def _offline(model: Path, messages: list[tuple[str, bytes]], n: int) -> str:
    with Engine.load(model, max_seqs=1) as eng:
        prompt = render_chat(eng, messages)
        return b"".join(eng.generate(prompt, max_tokens=n)).decode("utf-8", "replace")


async def test_completion_stream_and_models(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": INVOKER}) as srv:
        def run() -> tuple[object, str, list[str], object]:
            c = _client(srv.url)
            models = c.models.list()
            done = c.chat.completions.create(
                model=TINY_MODEL, max_tokens=8,
                messages=[{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": "Hello world"}])
            pieces, finish = [], None
            with c.chat.completions.create(model=TINY_MODEL, max_tokens=8, stream=True,
                                           messages=[{"role": "user", "content": "Hello"}],
                                           stream_options={"include_usage": True}) as s:
                usage = None
                for chunk in s:
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for ch in chunk.choices:
                        if ch.delta.content:
                            pieces.append(ch.delta.content)
                        finish = ch.finish_reason or finish
            return models, done, pieces, (finish, usage)

        models, done, pieces, (finish, usage) = await trio.to_thread.run_sync(run)
    assert [m.id for m in models.data] == [TINY_MODEL]          # type: ignore[attr-defined]
    model = tmp_path / "rt" / TINY_MODEL
    want = _offline(model, [("system", b"Be brief."), ("user", b"Hello world")], 8)
    msg = done.choices[0]                                         # type: ignore[attr-defined]
    assert msg.message.content == want and msg.message.role == "assistant"
    assert msg.finish_reason in ("stop", "length")
    assert done.usage.completion_tokens <= 8 and done.usage.prompt_tokens > 0  # type: ignore[attr-defined]
    assert "".join(pieces) == _offline(model, [("user", b"Hello")], 8)
    assert finish in ("stop", "length")
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens  # type: ignore[attr-defined]


async def test_errors_in_openai_terms(tmp_path: Path) -> None:
    async with served(tmp_path, {"alice": INVOKER, "reader": ("shared_read",)}) as srv:
        def run() -> list[tuple[type[Exception], str | None]]:
            c = _client(srv.url)
            out: list[tuple[type[Exception], str | None]] = []
            attempts = [
                dict(model="nope", messages=[{"role": "user", "content": "x"}]),
                dict(model=TINY_MODEL, n=9, messages=[{"role": "user", "content": "x"}]),
                dict(model=TINY_MODEL, messages=[]),
                dict(model=TINY_MODEL, max_tokens=999999,
                     messages=[{"role": "user", "content": "x"}]),
                dict(model=TINY_MODEL, temperature=-1,
                     messages=[{"role": "user", "content": "x"}]),
                dict(model=TINY_MODEL, tools=[{"type": "function", "function": {"name": "f"}}],
                     messages=[{"role": "user", "content": "x"}]),
            ]
            for kw in attempts:
                try:
                    c.chat.completions.create(**kw)  # type: ignore[call-overload]
                    out.append((type(None), None))  # type: ignore[arg-type]
                except openai.APIStatusError as exc:
                    out.append((type(exc), exc.body.get("code") if isinstance(exc.body, dict)
                                else None))
            try:
                _client(srv.url, "reader").chat.completions.create(
                    model=TINY_MODEL, messages=[{"role": "user", "content": "x"}])
            except openai.APIStatusError as exc:
                out.append((type(exc), None))
            try:
                openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong",
                              max_retries=0).models.list()
            except openai.APIStatusError as exc:
                out.append((type(exc), None))
            return out

        got = await trio.to_thread.run_sync(run)
    assert got[0] == (openai.NotFoundError, "model_not_found")
    assert [g[0] for g in got[1:6]] == [openai.BadRequestError] * 5
    assert got[1][1] == "invalid_parameter" and got[3][1] == "context_length_exceeded"
    assert got[6][0] is openai.PermissionDeniedError
    assert got[7][0] is openai.AuthenticationError


async def test_a_chat_request_queues_behind_shared_inputs_on_a_full_pool(
        tmp_path: Path) -> None:
    """Chat completions share the executor and its KV pool with shared inputs: with the
    pool taken by inputs, a chat request waits in order (no error), then completes."""
    from _gateway_env import LINEAGE, SCHEMA

    from aotx_trio.native import lib as native
    from aotx_trio.runtime.executor import Executor
    from aotx_trio.runtime.served import ModelSet, TextModel

    async with served(tmp_path, {"alice": INVOKER}) as srv:
        state = srv.handler.state
        assert state is not None
        # 12 pages of 16 positions: the scenario's geometry (the default page is 8)
        eng = Engine.load(tmp_path / "rt" / TINY_MODEL, kv_pages=12, max_seqs=4, page_tokens=16)
        # revision 2: the pool is sized for its contexts (the tiny byte-level vocabulary
        # spends ~75 tokens on revision 3's historical-data rule)
        executor = Executor(state.device, state.emitter, native.capacities()["result_bytes"],
                            revision=2)
        srv.handler.models = ModelSet({TINY_MODEL: TextModel(TINY_MODEL, "0" * 64, eng)}, [])
        srv.handler.executor = executor
        h = {"Authorization": f"Bearer {token_for('alice')}"}
        import httpx

        def body(key: int, seq: int, **f: object) -> dict[str, object]:
            return {"schema": SCHEMA, "lineage": LINEAGE, "operation_key": f"{key:032x}",
                    "sequence": str(seq), **f}

        try:
            async with httpx.AsyncClient(base_url=srv.url + "/aotx/v1/shared", headers=h,
                                         timeout=60) as c:
                assert (await c.post("/participant", json=body(1, 1))).status_code == 202
                space = (await c.post("/spaces", json=body(2, 2))).json()["resource"]
                con = (await c.post(f"/spaces/{space}/conversations",
                                    json=body(3, 3))).json()["resource"]
                r = await c.post(f"/conversations/{con}/inputs", json=body(
                    4, 4, text="a city", model=TINY_MODEL, max_output_tokens=60))
                assert r.status_code == 202
                op = r.json()["operation"]
                async with trio.open_nursery() as n:
                    await executor.cycle()          # the input takes most of the pool
                    assert executor.metrics()["running"] == 1
                    got: list[str] = []

                    def chat() -> None:
                        done = _client(srv.url).chat.completions.create(
                            model=TINY_MODEL, max_tokens=60,
                            messages=[{"role": "user", "content": "a city " * 6}])
                        got.append(done.choices[0].finish_reason or "")

                    n.start_soon(trio.to_thread.run_sync, chat)
                    with trio.fail_after(30):
                        while executor.queued() == 0:   # the chat request arrived...
                            await trio.sleep(0.01)
                    await executor.cycle()
                    assert executor.page_waits > 0      # ... and waits for pages
                    assert executor.metrics()["running"] == 1
                    await n.start(executor.run)         # now let everything run
                    with trio.fail_after(60):
                        while not got:
                            await trio.sleep(0.01)
                    n.cancel_scope.cancel()
                assert got[0] in ("stop", "length")
                assert (await c.get(f"/operations/{op}")).json()["status"] == "succeeded"
        finally:
            eng.close()


def test_the_async_openai_client(tmp_path: Path) -> None:
    """``openai.AsyncOpenAI`` (asyncio, its default), unchanged but for base_url and
    api_key: a completion and a stream, each the engine's greedy output, against the
    runtime served from a trio thread."""
    import asyncio
    import threading

    got: dict[str, object] = {}
    ready, stop = threading.Event(), threading.Event()

    async def server() -> None:
        async with served(tmp_path, {"alice": INVOKER}) as srv:
            got["url"] = srv.url
            ready.set()
            await trio.to_thread.run_sync(stop.wait)

    thread = threading.Thread(target=trio.run, args=(server,))
    thread.start()
    try:
        assert ready.wait(120)

        async def client() -> None:
            c = openai.AsyncOpenAI(base_url=f"{got['url']}/v1", api_key=token_for("alice"),
                                   max_retries=0, timeout=60)
            done = await c.chat.completions.create(
                model=TINY_MODEL, max_tokens=6, messages=[{"role": "user", "content": "Hi"}])
            got["text"] = done.choices[0].message.content
            pieces = []
            stream = await c.chat.completions.create(
                model=TINY_MODEL, max_tokens=6, stream=True,
                messages=[{"role": "user", "content": "Hello"}])
            async for chunk in stream:
                pieces += [ch.delta.content for ch in chunk.choices if ch.delta.content]
            got["stream"] = "".join(pieces)
            models = await c.models.list()
            got["models"] = [m.id for m in models.data]
            await c.close()

        asyncio.run(client())
    finally:
        stop.set()
        thread.join(60)
    model = tmp_path / "rt" / TINY_MODEL
    assert got["text"] == _offline(model, [("user", b"Hi")], 6)
    assert got["stream"] == _offline(model, [("user", b"Hello")], 6)
    assert got["models"] == [TINY_MODEL]


async def test_chat_as_clients_send_it(tmp_path: Path) -> None:
    """Text content parts (joined with newlines), every neutral value of what the engine
    does not do, ``refusal: null`` and ``system_fingerprint``; media parts are 400
    naming the part; sync and streamed."""
    async with served(tmp_path, {"alice": INVOKER}) as srv:
        def run() -> tuple[object, list[object], list[tuple[str | None, str | None]]]:
            c = _client(srv.url)
            neutral = dict(response_format={"type": "text"}, tools=[], tool_choice="none",
                           parallel_tool_calls=False, top_logprobs=0, n=1, logprobs=False,
                           frequency_penalty=0, presence_penalty=0.0)
            parts = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                     {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                                  {"type": "text", "text": "world"}]}]
            done = c.chat.completions.create(model=TINY_MODEL, max_tokens=8,
                                             messages=parts, **neutral)  # type: ignore[arg-type]
            chunks = list(c.chat.completions.create(
                model=TINY_MODEL, max_tokens=8, messages=parts, stream=True,
                **neutral))  # type: ignore[call-overload]
            refused = []
            for part in ({"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                         {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
                         {"type": "text"}):
                try:
                    c.chat.completions.create(model=TINY_MODEL, messages=[
                        {"role": "user", "content": [{"type": "text", "text": "x"}, part]}])
                    refused.append((None, None))
                except openai.BadRequestError as exc:
                    body = exc.body if isinstance(exc.body, dict) else {}
                    refused.append((body.get("param"), body.get("message")))
            for kw in (dict(tools=[{"type": "function", "function": {"name": "f"}}]),
                       dict(logprobs=True), dict(top_logprobs=2),
                       dict(response_format={"type": "json_object"}),
                       dict(tool_choice="required"), dict(frequency_penalty=True)):
                try:
                    c.chat.completions.create(model=TINY_MODEL, **kw,  # type: ignore[call-overload]
                                              messages=[{"role": "user", "content": "x"}])
                    refused.append((None, None))
                except openai.BadRequestError as exc:
                    body = exc.body if isinstance(exc.body, dict) else {}
                    refused.append((body.get("param"), body.get("code")))
            return done, chunks, refused

        done, chunks, refused = await trio.to_thread.run_sync(run)
    model = tmp_path / "rt" / TINY_MODEL
    want = _offline(model, [("system", b"Be brief."), ("user", b"Hello\nworld")], 8)
    choice = done.choices[0]                                      # type: ignore[attr-defined]
    assert choice.message.content == want and choice.message.refusal is None
    fp = done.system_fingerprint                                  # type: ignore[attr-defined]
    assert fp.startswith("fp_") and len(fp) == 3 + 12 + 1 + 12
    streamed = "".join(ch.delta.content or "" for k in chunks
                       for ch in k.choices)                       # type: ignore[attr-defined]
    assert streamed == want
    assert {k.system_fingerprint for k in chunks} == {fp}        # type: ignore[attr-defined]
    assert refused[0][0] == "messages.0.content.1" and "image_url" in str(refused[0][1])
    assert "text-only" in str(refused[0][1])
    assert refused[1][0] == "messages.0.content.1" and "input_audio" in str(refused[1][1])
    assert refused[2][0] == "messages.0.content.1"
    assert refused[3:] == [("tools", "unsupported_parameter"),
                           ("logprobs", "unsupported_parameter"),
                           ("top_logprobs", "unsupported_parameter"),
                           ("response_format", "unsupported_parameter"),
                           ("tool_choice", "unsupported_parameter"),
                           ("frequency_penalty", "unsupported_parameter")]


async def test_n_choices_sync_streamed_and_async(tmp_path: Path) -> None:
    """``n`` up to 8: each choice is its own generation of the prompt (choice i with
    seed + i), so each equals that seed's completion alone; streamed choices come back
    interleaved by ``index``; usage counts the prompt once, every choice's output."""
    msgs = [{"role": "user", "content": "Hello"}]
    async with served(tmp_path, {"alice": INVOKER}) as srv:
        def run() -> tuple[object, list[object], list[str]]:
            c = _client(srv.url)
            many = c.chat.completions.create(model=TINY_MODEL, max_tokens=6, n=3,
                                             temperature=1.0, seed=7,
                                             messages=msgs)  # type: ignore[arg-type]
            alone = [c.chat.completions.create(
                model=TINY_MODEL, max_tokens=6, temperature=1.0, seed=7 + i,
                messages=msgs).choices[0].message.content or ""  # type: ignore[arg-type]
                for i in range(3)]
            chunks = list(c.chat.completions.create(
                model=TINY_MODEL, max_tokens=6, n=3, temperature=1.0, seed=7,
                stream=True, stream_options={"include_usage": True},
                messages=msgs))  # type: ignore[arg-type]
            return many, chunks, alone

        many, chunks, alone = await trio.to_thread.run_sync(run)

        async def run_async() -> object:
            async with openai.AsyncOpenAI(base_url=srv.url + "/v1", max_retries=0,
                                          api_key=token_for("alice"), timeout=60) as c:
                return await c.chat.completions.create(
                    model=TINY_MODEL, max_tokens=6, n=8, messages=msgs)  # type: ignore[arg-type]

        # the async client (asyncio) in its own thread, next to the trio server
        import asyncio
        greedy = await trio.to_thread.run_sync(asyncio.run, run_async())
    choices = many.choices                                        # type: ignore[attr-defined]
    assert [ch.index for ch in choices] == [0, 1, 2]
    assert [ch.message.content for ch in choices] == alone
    usage = many.usage                                            # type: ignore[attr-defined]
    assert usage.completion_tokens <= 18 and usage.prompt_tokens > 0
    by_index: dict[int, str] = {}
    finishes: dict[int, str] = {}
    usages = []
    for k in chunks:
        if k.usage is not None:                                   # type: ignore[attr-defined]
            usages.append(k.usage)                                # type: ignore[attr-defined]
        for ch in k.choices:                                      # type: ignore[attr-defined]
            by_index[ch.index] = by_index.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    assert [by_index[i] for i in range(3)] == alone and set(finishes) == {0, 1, 2}
    assert len(usages) == 1 and usages[0].prompt_tokens == usage.prompt_tokens
    want = _offline(tmp_path / "rt" / TINY_MODEL, [("user", b"Hello")], 6)
    assert [ch.message.content for ch in greedy.choices] == [want] * 8  # type: ignore[attr-defined]
