"""Checking service-call parameters before they reach the device.

The gateway has already checked each body's shape (``gateway/bodies.py``);
these checks are the runtime's own, because the service socket also takes
calls from other clients: the caller's principal and actions, ids of this
lineage, cursors, and a mutation body turned into a
:class:`aotx_trio.native.device.Request`.  Every failure is an
:class:`aotx_trio.errors.AotxError` naming the bad field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aotx_trio import errors, vocab
from aotx_trio.native.device_codec import Request, new_request
from aotx_trio.vocab import PERMISSIONS, PREFIXES, SCOPES, Kind

DEFAULT_LIMIT = 50
MAX_LIMIT = 10000
DEFAULT_OUTPUT_TOKENS = 256
_HEX64 = re.compile(r"[0-9a-f]{64}")


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error never echoes an unbounded
    path segment or field back."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def caller(params: Mapping[str, Any]) -> tuple[str, list[str]]:
    """(principal name, actions the gateway vouches for) of a principal call."""
    name = params.get("principal")
    actions = params.get("actions", [])
    if not isinstance(name, str) or not name or not isinstance(actions, list):
        raise errors.InvalidInput("call needs principal (string) and actions (list)",
                                  field="principal")
    return name, actions


def parse_id(resource: str, text: Any, lineage: str) -> str:
    """The 32-hex id of ``{prefix}-{lineage}-{hex}`` naming a ``resource`` (a key of
    :data:`aotx_trio.vocab.PREFIXES`); a malformed id, or one of another lineage,
    names nothing here (404 ``{resource}_not_found``)."""
    ident = vocab.parse_id(PREFIXES[resource], lineage, text)
    if ident is None:
        raise errors.NotFound(f"no such {resource}: {shown(text)}", code=f"{resource}_not_found",
                              field=resource)
    return ident


def cursor(params: Mapping[str, Any]) -> tuple[int, int]:
    """(cursor, limit) of a list call: the cursor is one this runtime returned."""
    raw = params.get("cursor")
    limit = params.get("limit", DEFAULT_LIMIT)
    if raw is None:
        c = 0
    elif vocab.is_decimal(raw):
        c = int(raw)
    else:
        c = -1
    if not 0 <= c < 1 << 64:
        raise errors.InvalidInput("cursor is not one this runtime returned", field="cursor")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise errors.InvalidInput(f"limit must be an integer in 1..{MAX_LIMIT}",
                                  field="limit")
    return c, limit


def offset(params: Mapping[str, Any]) -> int:
    """A result read's byte ``offset`` (default 0)."""
    value = params.get("offset", 0)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 64:
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return value


def _decimal(value: Any, field: str) -> int:
    if not vocab.is_decimal(value) or int(value) >= 1 << 64:
        raise errors.InvalidInput(f"{field} must be a decimal string below 2**64",
                                  field=field)
    return int(value)


def _new_id(body: Mapping[str, Any], resource: str, lineage: str) -> str | None:
    """A create's optional ``id``: 32 hex digits, or the full id of this lineage."""
    raw = body.get("id")
    if raw is None or vocab.is_hex32(raw):
        return raw
    ident = vocab.parse_id(PREFIXES[resource], lineage, raw)
    if ident is None:
        raise errors.InvalidInput(
            f"id must be 32 hex digits or {PREFIXES[resource]}-{lineage}-<hex>", field="id")
    return ident


def _number(body: Mapping[str, Any], field: str, default: float, ok: Any) -> float:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or not ok(value):
        raise errors.InvalidInput(f"{field} {value!r} is out of range", field=field)
    return float(value)


def _count(body: Mapping[str, Any], field: str, default: int, lo: int, hi: int) -> int:
    value = body.get(field)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise errors.InvalidInput(f"{field} must be an integer in {lo}..{hi}", field=field)
    return value


def _input_fields(body: Mapping[str, Any], lineage: str) -> dict[str, Any]:
    """An input's fields with the spec's defaults (256 output tokens, the current page
    grant, temperature 0, top_p 1); the text and media limits are the device's."""
    text, model = body.get("text", ""), body.get("model")
    if not isinstance(text, str):
        raise errors.InvalidInput("text must be a string", field="text")
    if not isinstance(model, str) or not model:
        raise errors.InvalidInput("model must name one of the runtime's models",
                                  field="model")
    media = body.get("media") or []
    if not isinstance(media, list) or len(media) > vocab.MAX_MEDIA or any(
            not isinstance(m, Mapping) or m.get("type") not in vocab.MEDIA_TYPES
            or not isinstance(m.get("sha256"), str) or not _HEX64.fullmatch(m["sha256"])
            for m in media):
        raise errors.InvalidInput(f"media must list at most {vocab.MAX_MEDIA} rows of "
                                  "{type: image|audio, sha256: 64 hex}", field="media")
    return {
        "conversation": parse_id("conversation", body.get("conversation"), lineage),
        "text": text, "model": model,
        "max_output_tokens": _count(body, "max_output_tokens", DEFAULT_OUTPUT_TOKENS, 1,
                                    1 << 20),
        "pages": _count(body, "pages", 0, 0, 1 << 20),
        "temperature": _number(body, "temperature", 0.0, lambda v: v >= 0),
        "top_p": _number(body, "top_p", 1.0, lambda v: 0 < v <= 1),
        "media": tuple((m["type"], m["sha256"]) for m in media),
    }


def build_request(kind: str, body: Mapping[str, Any], lineage: str) -> Request:
    """The device request of a mutation body of kind ``kind`` (its wire name)."""
    code = vocab.KINDS_BY_NAME.get(kind)
    if code is None:
        raise errors.InvalidInput(f"unknown mutation kind {shown(kind)}", field="kind")
    if body.get("lineage") != lineage:
        raise errors.Conflict(f"lineage {body.get('lineage')!r} is not this runtime's "
                              f"lineage {lineage}", code="lineage_mismatch",
                              field="lineage", expected=lineage)
    key = body.get("operation_key")
    if not vocab.is_hex32(key):
        raise errors.InvalidInput("operation_key must be 32 lowercase hex digits",
                                  field="operation_key")
    seq = _decimal(body.get("sequence"), "sequence")
    fields: dict[str, Any] = {}
    if code == Kind.SPACE_CREATE:
        fields["id"] = _new_id(body, "space", lineage)
        scope = body.get("scope", "private")
        if scope not in SCOPES:
            raise errors.InvalidInput(f"unknown scope {scope!r}", field="scope")
        fields["scope"] = scope
    elif code == Kind.CONVERSATION_CREATE:
        fields["id"] = _new_id(body, "conversation", lineage)
        fields["space"] = parse_id("space", body.get("space"), lineage)
    elif code == Kind.MEMBER_SET:
        fields["space"] = parse_id("space", body.get("space"), lineage)
        participant = vocab.parse_id(PREFIXES["participant"], lineage,
                                     body.get("participant"))
        if participant is None:
            raise errors.InvalidInput("participant must be par-<lineage>-<hex> of this "
                                      "runtime", field="participant")
        fields["participant"] = participant
        perms = body.get("permissions", [])
        if not isinstance(perms, list) or any(p not in PERMISSIONS for p in perms):
            raise errors.InvalidInput("permissions must list read, write or manage",
                                      field="permissions")
        fields["permissions"] = tuple(p for p in PERMISSIONS if p in perms)
    elif code == Kind.RETIRE:
        fields["retry_floor"] = _decimal(body.get("retry_floor", "0"), "retry_floor")
    elif code == Kind.INPUT:
        fields.update(_input_fields(body, lineage))
    elif code == Kind.CANCEL:
        fields["target_sequence"] = _decimal(body.get("target_sequence"), "target_sequence")
    elif code == Kind.PUBLISH:
        fields["space"] = parse_id("space", body.get("space"), lineage)
        fields["object"] = parse_id("memory", body.get("object"), lineage)
        fields["source_version"] = _decimal(body.get("source_version"), "source_version")
    return new_request(code, lineage, str(key), seq, **fields)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[tuple[str, bytes]]
    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[bytes, ...]
    #: a raw prompt, continued as is (no chat template): instead of ``messages``
    prompt: bytes | None = None


CHAT_ROLES = ("system", "developer", "user", "assistant")


def chat_request(params: Mapping[str, Any]) -> ChatRequest:
    """A ``chat.generate`` call's request (the gateway checked the OpenAI shape)."""
    model = params.get("model")
    if not isinstance(model, str) or not model:
        raise errors.InvalidInput("model must name one of the runtime's models",
                                  field="model")
    raw = params.get("messages")
    prompt = params.get("prompt")
    if prompt is not None:
        if raw is not None or not isinstance(prompt, str) or not prompt:
            raise errors.InvalidInput("prompt must be a non-empty string, without messages",
                                      field="prompt")
        raw = []
    elif not isinstance(raw, list) or not raw:
        raise errors.InvalidInput("messages must be a non-empty list", field="messages")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, Mapping) or m.get("role") not in CHAT_ROLES \
                or not isinstance(m.get("content"), str):
            raise errors.InvalidInput("each message needs a role (system, developer, user, "
                                      "assistant) and string content",
                                      field=f"messages.{i}")
        messages.append((str(m["role"]), str(m["content"]).encode("utf-8")))
    stop = params.get("stop") or []
    if not isinstance(stop, list) or len(stop) > 4 or any(
            not isinstance(x, str) or not x for x in stop):
        raise errors.InvalidInput("stop must be up to 4 non-empty strings", field="stop")
    seed = params.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise errors.InvalidInput("seed must be an integer", field="seed")
    return ChatRequest(
        model=model, messages=messages,
        max_tokens=None if params.get("max_tokens") is None
        else _count(params, "max_tokens", 0, 1, 1 << 20),
        temperature=_number(params, "temperature", 0.0, lambda v: 0 <= v <= 2),
        top_p=_number(params, "top_p", 1.0, lambda v: 0 < v <= 1),
        seed=None if seed is None else seed & 0xFFFFFFFFFFFFFFFF,
        stop=tuple(x.encode("utf-8") for x in stop),
        prompt=None if prompt is None else prompt.encode("utf-8"))


MAX_EMBED_TEXTS = 256
MAX_EMBED_TEXT_BYTES = 65536


def embed_texts(params: Mapping[str, Any]) -> list[str]:
    """An ``embed`` call's ``texts``: 1..256 strings of at most 64 KiB each."""
    texts = params.get("texts")
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_EMBED_TEXTS:
        raise errors.InvalidInput(f"texts must be a list of 1..{MAX_EMBED_TEXTS} strings",
                                  field="texts")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or len(t.encode("utf-8", "surrogatepass")) \
                > MAX_EMBED_TEXT_BYTES:
            raise errors.InvalidInput(f"texts.{i} must be a string of at most "
                                      f"{MAX_EMBED_TEXT_BYTES} bytes", field=f"texts.{i}")
    return list(texts)


def model_load(params: Mapping[str, Any]) -> tuple[Path, str, dict[str, Any] | None]:
    """A ``model.load`` call's (absolute path of a regular file, sha256, descriptor)."""
    raw = params.get("path")
    path = Path(raw) if isinstance(raw, str) and raw else None
    if path is None or not path.is_absolute() or not path.is_file():
        raise errors.InvalidInput("path must be an absolute path of a GGUF file",
                                  field="path")
    sha = params.get("artifact_sha256")
    if not isinstance(sha, str) or len(sha) != 64 or not all(c in "0123456789abcdef"
                                                             for c in sha):
        raise errors.InvalidInput("artifact_sha256 must be 64 lowercase hex digits",
                                  field="artifact_sha256")
    descriptor = params.get("descriptor")
    if descriptor is not None:
        keys = {"backend", "threads", "kv_page_tokens", "context", "kv_type"}
        if not isinstance(descriptor, dict) or set(descriptor) - keys:
            raise errors.InvalidInput(f"descriptor must be an object of {sorted(keys)}",
                                      field="descriptor")
        for key in ("threads", "kv_page_tokens", "context"):
            v = descriptor.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 20:
                raise errors.InvalidInput(f"descriptor.{key} must be an integer",
                                          field=f"descriptor.{key}")
        if descriptor.get("kv_type") not in (None, "f16", "f32"):
            raise errors.InvalidInput('descriptor.kv_type must be "f16", "f32" or null '
                                      "(the runtime's default, f16)",
                                      field="descriptor.kv_type")
        descriptor = dict(descriptor)
    return path, sha, descriptor
