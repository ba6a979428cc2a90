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
``temperature``, ``top_p``, ``seed``, ``stop`` (a string or up to 4), ``n`` = 1,
and what the engine does not do yet only at its neutral values (:data:`NEUTRAL`:
penalties 0, ``logprobs`` false, ``top_logprobs`` 0, ``tools`` [],
``tool_choice`` none/auto, ``parallel_tool_calls``, ``response_format`` text).
Anything else that changes the answer (tools, logprobs, json response formats,
n > 1) is 400 naming the parameter: never silently ignored.  Answers carry
``message.refusal: null`` and ``system_fingerprint`` (:func:`fingerprint`).  Errors are
rendered in the ``openai`` dialect of :mod:`aotx_trio.gateway.errors` (the rule
of an :class:`~aotx_trio.errors.InvalidParams` is OpenAI's ``code``:
:data:`INVALID` or :data:`UNSUPPORTED`), so the official ``openai`` client
raises its usual exceptions.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import dumps, event_body, json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import client, principal
from aotx_trio.gateway.streams import open_stream, sse_response

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
            shown = " or ".join(dumps(v) for v in neutral[key])
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


def _params(caller: Principal, body: Any) -> tuple[dict[str, Any], bool, bool]:
    """(the chat.generate params, stream?, include usage?) of a request body."""
    body = refuse_unknown(body, KNOWN, NEUTRAL)
    if body.get("n", 1) not in (None, 1) or isinstance(body.get("n"), bool):
        raise errors.InvalidParams("n", UNSUPPORTED, "n must be 1")
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
    return params, stream, usage


def fingerprint(opened: dict[str, Any]) -> str:
    """``system_fingerprint``: the build's commit and the model's weights digest
    (``fp_<commit 12 hex>_<artifact sha256 12 hex>``), from the stream's identity."""
    ident = opened.get("identity") or {}
    return (f"fp_{str(ident.get('source_commit', ''))[:12]}_"
            f"{str(ident.get('artifact_sha256', ''))[:12]}")


def _data(doc: Any) -> bytes:
    """One SSE event of the chat stream (no event name, no id: OpenAI's framing)."""
    return b"data: " + dumps(doc).encode("utf-8") + b"\n\n"


def _chunk(cid: str, created: int, model: str, fp: str, delta: dict[str, Any] | None,
           finish: str | None, usage: Any = None) -> bytes:
    """A ``chat.completion.chunk``; ``delta`` None is the usage-only chunk."""
    doc: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created,
                           "model": model, "system_fingerprint": fp,
                           "choices": [] if delta is None else [
                               {"index": 0, "delta": delta, "finish_reason": finish,
                                "logprobs": None}]}
    if delta is None:
        doc["usage"] = usage
    return _data(doc)


async def chat_completions() -> Response:
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    params, stream, with_usage = _params(principal(), decode_json(raw))
    depth = int(current_app.config.get("AOTX_SSE_QUEUE_DEPTH", 256))
    opened, receive = await open_stream(client(), "chat.generate", params, depth)
    cid, model, created = f"chatcmpl-{opened['id']}", str(opened["model"]), int(time.time())
    fp = fingerprint(opened)

    if not stream:
        parts: list[str] = []
        final: dict[str, Any] = {}
        async with receive:
            async for kind, value in receive:
                if kind == "error":
                    raise value
                if kind == "item" and "text" in value:
                    parts.append(value["text"])
                elif kind == "item":
                    final = value
        return json_response({
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "system_fingerprint": fp,
            "choices": [{"index": 0, "finish_reason": FINISH.get(final.get(
                "finish_reason", "stop"), "stop"), "logprobs": None,
                "message": {"role": "assistant", "content": "".join(parts),
                            "refusal": None}}],
            "usage": final.get("usage")}, 200)

    async def body() -> AsyncIterator[bytes]:
        async with receive:
            yield _chunk(cid, created, model, fp,
                         {"role": "assistant", "content": "", "refusal": None}, None)
            async for kind, value in receive:
                if kind == "error":
                    yield _data(event_body(value, "openai"))
                    break
                if kind == "item" and "text" in value:
                    yield _chunk(cid, created, model, fp, {"content": value["text"]}, None)
                elif kind == "item":
                    yield _chunk(cid, created, model, fp, {},
                                 FINISH.get(value["finish_reason"], "stop"))
                    if with_usage:
                        yield _chunk(cid, created, model, fp, None, None, value["usage"])
            yield b"data: [DONE]\n\n"

    return sse_response(body())


async def list_models() -> Response:
    caps = await client().capabilities()
    data = [{"id": m["name"] if m.get("kind") == "text" else EMBEDDING_ID, "object": "model",
             "created": 0, "owned_by": "aotx"}
            for m in caps.get("models", []) if m.get("ready")]   # text and embedding
    return json_response({"object": "list", "data": data}, 200)


VIEWS = {"v1_chat": chat_completions, "v1_models": list_models}
