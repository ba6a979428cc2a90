"""OpenAI-compatible ``POST /v1/completions`` (the legacy text completion): the prompt
continued as raw text (the ``chat.generate`` stream's ``prompt``: BOS then the text,
no chat template, special-token text kept as text), on the same executor, KV pool
and admission order as chat completions and shared inputs; nothing persists.

Bearer auth with ``models_invoke``.  Accepted: ``model``, ``prompt`` (a string or a
list of 1..:data:`MAX_PROMPTS` strings; token-id prompts are 400), ``max_tokens``
(default 16, as OpenAI's), ``stop``, ``echo`` (the prompt text before each choice's
text), ``stream`` (``text_completion`` chunks, then ``data: [DONE]``;
``stream_options.include_usage`` adds the usage chunk), ``seed``, ``temperature``,
``top_p``, ``n`` (1..8; choice ``p * n + i`` is prompt ``p``'s i-th, with seed + i),
``user``, and at their neutral values ``logprobs`` (null: the executor keeps no
per-token log-probabilities yet), ``best_of`` 1, ``suffix`` null, ``logit_bias``
{}, penalties 0.  Errors in the ``openai`` dialect, as for chat completions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.chat import (
    DONE,
    INVALID,
    UNSUPPORTED,
    choice_params,
    collect,
    count_n,
    fingerprint,
    finish_of,
    refuse_unknown,
    sse_data,
    usage_of,
)
from aotx_trio.gateway.errors import event_body, json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import client, principal
from aotx_trio.gateway.streams import open_streams, sse_response

IGNORED = {"user", "stream_options"}
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (),
    "best_of": (1,), "suffix": (), "logit_bias": ({},)}
KNOWN = {"model", "prompt", "max_tokens", "stop", "echo", "stream", "seed",
         "temperature", "top_p", "n"} | IGNORED | set(NEUTRAL)
MAX_PROMPTS = 16        # prompts of one request at most (each prompt's n choices: 8)
DEFAULT_MAX_TOKENS = 16


def _prompts(body: dict[str, Any]) -> list[str]:
    raw = body.get("prompt")
    prompts = [raw] if isinstance(raw, str) else raw
    if not isinstance(prompts, list) or not 1 <= len(prompts) <= MAX_PROMPTS:
        raise errors.InvalidParams("prompt", INVALID, "prompt must be a string or a list "
                                   f"of 1..{MAX_PROMPTS} strings")
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise errors.InvalidParams(f"prompt.{i}", UNSUPPORTED,
                                       "prompts must be text (token ids are not supported)")
    return prompts


def _params(caller: Principal, body: Any) -> tuple[list[dict[str, Any]], int, bool, bool,
                                                   list[str]]:
    """(the chat.generate params of every choice, n, stream?, include usage?, the
    prompt text echo puts before each choice: "" without echo)."""
    body = refuse_unknown(body, KNOWN, NEUTRAL)
    prompts, n = _prompts(body), count_n(body)
    for key in ("stream", "echo"):
        if not isinstance(body.get(key, False), bool):
            raise errors.InvalidParams(key, INVALID, f"{key} must be a boolean")
    options = body.get("stream_options") or {}
    usage = isinstance(options, dict) and options.get("include_usage") is True
    stop = body.get("stop")
    max_tokens = body.get("max_tokens")
    base = {"principal": caller.name, "actions": list(caller.actions),
            "model": body.get("model"), "stop": [stop] if isinstance(stop, str)
            else (stop or []), "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None
            else max_tokens, "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "seed": body.get("seed")}
    every = [p for prompt in prompts for p in choice_params({**base, "prompt": prompt}, n)]
    echo = [prompt if body.get("echo") else "" for prompt in prompts for _ in range(n)]
    return every, n, bool(body.get("stream", False)), usage, echo


async def create_completion() -> Response:
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    every, n, stream, with_usage, echo = _params(principal(), decode_json(raw))
    depth = int(current_app.config.get("AOTX_SSE_QUEUE_DEPTH", 256))
    opened, merged = await open_streams(client(), "chat.generate", every, depth)
    first = opened[0]
    cid, model, created = f"cmpl-{first['id']}", str(first["model"]), int(time.time())
    head = {"id": cid, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": fingerprint(first)}

    def choice(i: int, text: str, finish: str | None) -> dict[str, Any]:
        return {"index": i, "text": text, "logprobs": None, "finish_reason": finish}

    if not stream:
        texts, finals = await collect(merged, len(every))
        return json_response({**head, "choices": [
            choice(i, echo[i] + t, finish_of(f))
            for i, (t, f) in enumerate(zip(texts, finals, strict=True))],
            "usage": usage_of(finals, n)}, 200)

    async def body() -> AsyncIterator[bytes]:
        finals: list[dict[str, Any]] = [{} for _ in every]
        async with merged:
            for i, text in enumerate(echo):
                if text:
                    yield sse_data({**head, "choices": [choice(i, text, None)]})
            async for i, kind, value in merged:
                if kind == "error":
                    yield sse_data(event_body(value, "openai"))
                    break
                if kind == "item" and "text" in value:
                    yield sse_data({**head, "choices": [choice(i, value["text"], None)]})
                elif kind == "item":
                    finals[i] = value
                    yield sse_data({**head, "choices": [choice(i, "", finish_of(value))]})
            else:
                if with_usage:
                    yield sse_data({**head, "choices": [], "usage": usage_of(finals, n)})
            yield DONE

    return sse_response(body())


VIEWS = {"v1_completions": create_completion}
