"""OpenAI-compatible ``POST /v1/chat/completions`` and ``GET /v1/models`` (the ready
text models and the embedding model, which ``POST /v1/embeddings`` serves:
gateway/embeddings.py).

The temporary request contract of docs/api.md: nothing persists; a
completion runs on the runtime's executor (the ``chat.generate`` stream of
the device client), so it shares the KV pool and the admission order with
shared inputs and queues, never fails, when the pool is busy.  Bearer auth
with the ``models_invoke`` action (``GET /v1/models``: ``models_read`` or
``models_invoke``).

Accepted: ``model``, ``messages`` (system, developer, user, assistant; string
content or a list of text parts, joined with newlines; an ``image_url``,
``input_audio`` or ``file`` part is 400 naming it: the models are text-only),
``stream`` (SSE chunks, then ``data: [DONE]``; ``stream_options.include_usage``
adds the usage chunk), ``max_tokens`` / ``max_completion_tokens``,
``temperature``, ``top_p``, ``seed``, ``stop`` (a string or up to 4), ``n``
(1..8: a generation per choice, choice i with seed + i; streamed, interleaved by
``index``),
and what the engine does not do yet only at its neutral values (:data:`NEUTRAL`:
penalties 0, ``logprobs`` false, ``top_logprobs`` 0, ``tools`` [],
``tool_choice`` none/auto, ``parallel_tool_calls``, ``response_format`` text).
Anything else that changes the answer (tools, logprobs, json response formats)
is 400 naming the parameter: never silently ignored.  Answers carry
``message.refusal: null`` and ``system_fingerprint`` (:func:`fingerprint`).  Errors are
rendered in the ``openai`` dialect of :mod:`aotx_trio.gateway.errors` (the rule
of an :class:`~aotx_trio.errors.InvalidParams` is OpenAI's ``code``:
:data:`INVALID` or :data:`UNSUPPORTED`), so the official ``openai`` client
raises its usual exceptions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio
from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import dumps, event_body, json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import client, principal
from aotx_trio.gateway.streams import open_streams, sse_response

#: Parameters that do not change the answer: accepted with any value.
IGNORED = {"user", "metadata", "store", "stream_options"}
#: Knobs the engine does not have (yet): accepted only at their neutral values (or
#: null; ``parallel_tool_calls`` and ``tool_choice`` "auto" change nothing without tools).
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0,), "presence_penalty": (0,), "logprobs": (False,),
    "top_logprobs": (0,), "tools": ([],), "tool_choice": ("none", "auto"),
    "parallel_tool_calls": (False, True), "response_format": ({"type": "text"},)}
KNOWN = {"model", "messages", "stream", "max_tokens", "max_completion_tokens",
         "temperature", "top_p", "seed", "stop", "n"} | IGNORED | set(NEUTRAL)
#: The id of the runtime's embedding model in the OpenAI routes (the name the runtime's
#: ``embed`` call answers with; capabilities names its weights file, also accepted).
EMBEDDING_ID = "embedding"
#: the rules of a wrong parameter here (OpenAI's error ``code``)
INVALID, UNSUPPORTED = "invalid_parameter", "unsupported_parameter"
OWNED_BY = "aotx"   # the models' owner in /v1/models
MAX_N = 8          # choices of one request at most
FINISH = {"stop": "stop", "length": "length", "deadline_exceeded": "length",
          "cancelled": "stop", "error": "stop"}
#: content part types of other modalities (a text-only model refuses them by name)
MEDIA_PARTS = {"image_url": "images", "input_audio": "audio", "file": "files"}


def _neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
    """``value`` is null or one of ``allowed`` (a boolean never stands for a number)."""
    return value is None or any(value == a and isinstance(value, bool) == isinstance(a, bool)
                                for a in allowed)


def refuse_unknown(body: Any, known: set[str],
                   neutral: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    """``body`` as a JSON object whose keys are all ``known`` and whose ``neutral``
    knobs are at a neutral value; else 400 naming the parameter."""
    if not isinstance(body, dict):
        raise errors.InvalidParams("", INVALID, "the body must be a JSON object")
    for key, value in body.items():
        if key not in known:
            raise errors.InvalidParams(key, UNSUPPORTED, f"unsupported parameter {key!r}")
        if key in neutral and not _neutral(value, neutral[key]):
            shown = " or ".join(dumps(v) for v in neutral[key]) or "null"
            raise errors.InvalidParams(key, UNSUPPORTED,
                                       f"{key} is not supported (only {shown})")
    return body


def _content(i: int, content: Any) -> Any:
    """A message's content as the runtime takes it: a string, or a list of text parts
    joined (each part's text, a newline between); a part of another modality is 400
    naming it (the served models are text-only).  Anything else is left for the
    runtime's check."""
    if not isinstance(content, list):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"messages.{i}.content.{j}"
        if kind in MEDIA_PARTS:
            raise errors.InvalidParams(where, UNSUPPORTED, f"{kind} content parts are not "
                                       f"supported: the model is text-only (no "
                                       f"{MEDIA_PARTS[kind]}); send text parts")
        if kind != "text" or not isinstance(part.get("text"), str):
            raise errors.InvalidParams(where, INVALID, "a content part must be "
                                       '{"type": "text", "text": "..."}')
        texts.append(part["text"])
    return "\n".join(texts)


def _messages(raw: Any) -> Any:
    """``messages`` with every content part list made one string."""
    if not isinstance(raw, list):
        return raw
    return [{**m, "content": _content(i, m.get("content"))} if isinstance(m, dict) else m
            for i, m in enumerate(raw)]


def _params(caller: Principal, body: Any) -> tuple[dict[str, Any], bool, bool, int]:
    """(the chat.generate params, stream?, include usage?, n) of a request body."""
    body = refuse_unknown(body, KNOWN, NEUTRAL)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise errors.InvalidParams("stream", INVALID, "stream must be a boolean")
    options = body.get("stream_options") or {}
    usage = isinstance(options, dict) and options.get("include_usage") is True
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else (stop or [])
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    params = {"principal": caller.name, "actions": list(caller.actions),
              "model": body.get("model"), "messages": _messages(body.get("messages")),
              "max_tokens": max_tokens, "temperature": body.get("temperature"),
              "top_p": body.get("top_p"), "seed": body.get("seed"), "stop": stops}
    return params, stream, usage, count_n(body)


def fingerprint(opened: dict[str, Any]) -> str:
    """``system_fingerprint``: the build's commit and the model's weights digest
    (``fp_<commit 12 hex>_<artifact sha256 12 hex>``), from the stream's identity."""
    ident = opened.get("identity") or {}
    return (f"fp_{str(ident.get('source_commit', ''))[:12]}_"
            f"{str(ident.get('artifact_sha256', ''))[:12]}")


def sse_data(doc: Any) -> bytes:
    """One SSE event of the chat stream (no event name, no id: OpenAI's framing)."""
    return b"data: " + dumps(doc).encode("utf-8") + b"\n\n"


DONE = b"data: [DONE]\n\n"


def choice_params(params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """The ``chat.generate`` params of each of ``n`` choices: choice i with ``seed`` +
    i when a seed is given (so the choices differ under sampling, and repeat)."""
    seed = params.get("seed")
    return [{**params, "seed": None if seed is None or isinstance(seed, bool)
             or not isinstance(seed, int) else (seed + i) % (1 << 64)} if i else params
            for i in range(n)]


def count_n(body: dict[str, Any]) -> int:
    """``n`` (1..:data:`MAX_N`; null is 1)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise errors.InvalidParams("n", INVALID, f"n must be an integer in 1..{MAX_N}")
    return n


def usage_of(finals: list[dict[str, Any]], n: int | None = None) -> dict[str, int]:
    """The usage of choices in groups of ``n`` per prompt (None: one prompt): each
    prompt's tokens once, every choice's output."""
    usages = [f.get("usage") or {} for f in finals]
    step = n or max(1, len(usages))
    prompt = sum(max((int(u.get("prompt_tokens", 0)) for u in usages[g:g + step]),
                     default=0) for g in range(0, len(usages), step))
    out = sum(int(u.get("completion_tokens", 0)) for u in usages)
    return {"prompt_tokens": prompt, "completion_tokens": out, "total_tokens": prompt + out}


async def collect(merged: trio.MemoryReceiveChannel[tuple[int, str, Any]], n: int,
                  ) -> tuple[list[str], list[dict[str, Any]]]:
    """(text, final item) of each of n merged streams, read to their ends; a stream's
    error raises."""
    parts: list[list[str]] = [[] for _ in range(n)]
    finals: list[dict[str, Any]] = [{} for _ in range(n)]
    async with merged:
        async for i, kind, value in merged:
            if kind == "error":
                raise value
            if kind == "item" and "text" in value:
                parts[i].append(value["text"])
            elif kind == "item":
                finals[i] = value
    return ["".join(p) for p in parts], finals


def finish_of(final: dict[str, Any]) -> str:
    return FINISH.get(str(final.get("finish_reason", "stop")), "stop")


async def chat_completions() -> Response:
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    params, stream, with_usage, n = _params(principal(), decode_json(raw))
    depth = int(current_app.config.get("AOTX_SSE_QUEUE_DEPTH", 256))
    opened, merged = await open_streams(client(), "chat.generate",
                                        choice_params(params, n), depth)
    first = opened[0]
    cid, model, created = f"chatcmpl-{first['id']}", str(first["model"]), int(time.time())
    fp = fingerprint(first)

    def chunk(choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        """A ``chat.completion.chunk``; no choices: the usage-only chunk."""
        doc: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                               "created": created, "model": model,
                               "system_fingerprint": fp, "choices": choices}
        if not choices:
            doc["usage"] = usage
        return sse_data(doc)

    def delta(i: int, d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": i, "delta": d, "finish_reason": finish, "logprobs": None}

    if not stream:
        texts, finals = await collect(merged, n)
        return json_response({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fp,
            "choices": [{"index": i, "finish_reason": finish_of(f), "logprobs": None,
                         "message": {"role": "assistant", "content": t, "refusal": None}}
                        for i, (t, f) in enumerate(zip(texts, finals, strict=True))],
            "usage": usage_of(finals)}, 200)

    async def body() -> AsyncIterator[bytes]:
        finals: list[dict[str, Any]] = []
        async with merged:
            yield chunk([delta(i, {"role": "assistant", "content": "", "refusal": None})
                         for i in range(n)])
            async for i, kind, value in merged:
                if kind == "error":
                    yield sse_data(event_body(value, "openai"))
                    break
                if kind == "item" and "text" in value:
                    yield chunk([delta(i, {"content": value["text"]})])
                elif kind == "item":
                    finals.append(value)
                    yield chunk([delta(i, {}, finish_of(value))])
            else:
                if with_usage:
                    yield chunk([], usage_of(finals))
            yield DONE

    return sse_response(body())


def _model_rows(caps: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI's model objects of the ready models: ``created`` is when the runtime
    process loaded the model (capabilities' ``loaded_at``)."""
    return [{"id": m["name"] if m.get("kind") == "text" else EMBEDDING_ID, "object": "model",
             "created": int(m.get("loaded_at") or 0), "owned_by": OWNED_BY}
            for m in caps.get("models", []) if m.get("ready")]   # text and embedding


async def list_models() -> Response:
    rows = _model_rows(await client().capabilities())
    return json_response({"object": "list", "data": rows}, 200)


async def get_model(model: str) -> Response:
    """``GET /v1/models/{id}``: one of :func:`list_models`' rows, else 404
    ``model_not_found``."""
    for row in _model_rows(await client().capabilities()):
        if row["id"] == model:
            return json_response(row, 200)
    raise errors.NotFound(f"no model {model!r}", code="model_not_found")


VIEWS: dict[str, Callable[..., Awaitable[Response]]] = {
    "v1_chat": chat_completions, "v1_models": list_models, "v1_model": get_model}
