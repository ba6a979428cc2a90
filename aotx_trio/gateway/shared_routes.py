"""Routes of the shared-conversations API (base ``/aotx/v1/shared``).

Each route authenticates (``g.principal``, set by the app), checks the
gateway action it needs, parses and validates the body, then makes exactly
one device-client call and renders its JSON.  Reads need ``shared_read``;
registering, creating spaces and conversations and retiring need
``shared_write``; membership changes need ``shared_manage`` (the device then
also checks the caller's manage right in that space).  ``capabilities`` needs
only a valid token.

Inputs, cancellations, events/SSE, publications, media and memory belong to a
later issue and are not routed (404).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from quart import Blueprint, Response, current_app, g, request

from aotx_trio import errors
from aotx_trio.client import DeviceClient
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import BadRequest, json_response
from aotx_trio.gateway.models import (
    SCHEMA,
    CreateConversation,
    CreateSpace,
    Mutation,
    RegisterParticipant,
    Retirement,
    SetMember,
)

BASE = "/aotx/v1/shared"
DEFAULT_LIMIT = 50
MAX_LIMIT = 500

bp = Blueprint("shared", __name__, url_prefix=BASE)


def _client() -> DeviceClient:
    client: DeviceClient = current_app.config["AOTX_CLIENT"]
    return client


def _principal(action: str | None) -> Principal:
    principal: Principal = g.principal
    if action is not None:
        principal.require(action)
    return principal


# --------------------------------------------------------------------------- body parsing


def decode_json(raw: bytes) -> Any:
    """Strict UTF-8 then JSON; 400 ``invalid_utf8`` / ``malformed_json`` with the offset."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 at byte offset {exc.start}",
                         code="invalid_utf8", offset=exc.start) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc.msg} at character {exc.pos}",
                         code="malformed_json", offset=exc.pos) from exc


def validate(model: type[Mutation], data: Any) -> Mutation:
    """The body as ``model``: 400 for a non-object or a wrong ``schema``, 422 (naming
    the field) for anything else."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="malformed_json")
    if "schema" in data and data["schema"] != SCHEMA:
        raise BadRequest(f"schema must be {SCHEMA!r}", code="schema_invalid", field="schema",
                         expected=SCHEMA)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise errors.InvalidInput(f"unknown field {field!r}", code="unknown_field",
                                      field=field) from exc
        if first["type"] == "missing":
            raise errors.InvalidInput(f"missing field {field!r}", code="missing_field",
                                      field=field) from exc
        raise errors.InvalidInput(f"field {field!r}: {first['msg']}", field=field) from exc


async def parse_body(model: type[Mutation]) -> Mutation:
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return validate(model, decode_json(raw))


def _list_args() -> tuple[str | None, int]:
    cursor = request.args.get("cursor")
    if cursor is not None and (not cursor.isdigit() or len(cursor) > 20):
        raise errors.InvalidInput("cursor must be a cursor returned by an earlier page",
                                  field="cursor")
    top = int(current_app.config.get("AOTX_LIST_LIMIT_MAX", MAX_LIMIT))
    default = int(current_app.config.get("AOTX_LIST_LIMIT_DEFAULT", DEFAULT_LIMIT))
    raw_limit = request.args.get("limit", str(default))
    if not raw_limit.isdigit() or len(raw_limit) > 9 or not 1 <= int(raw_limit) <= top:
        raise errors.InvalidInput(f"limit must be an integer in 1..{top}", field="limit")
    return cursor, int(raw_limit)


def _ok(body: Any) -> Response:
    return json_response(body, 200)


async def submit_mutation(client: DeviceClient, principal: Principal, kind: str,
                          model: type[Mutation], raw: bytes, path: dict[str, str],
                          ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Validate ``raw`` as ``model``, submit it and wait for its save: (status, receipt,
    headers).  202 for a new (saved) admission, 200 for an exact retry.  Shared by the
    Quart route and the ASGI fast path (aotx_trio.gateway.fast)."""
    parsed = validate(model, decode_json(raw))
    body = parsed.model_dump(by_alias=True)
    body.update(path)
    out = await client.submit(principal.name, principal.actions, kind, body)
    receipt: dict[str, Any] = out["receipt"]
    status = 202 if out["created"] else 200
    return status, receipt, {"Location": f"{BASE}/operations/{receipt['operation']}"}


async def _mutate(kind: str, model: type[Mutation], action: str,
                  **path: str) -> Response:
    principal = _principal(action)
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    status, receipt, headers = await submit_mutation(_client(), principal, kind, model, raw,
                                                     path)
    return json_response(receipt, status, headers)


# --------------------------------------------------------------------------- reads


@bp.get("/capabilities")
async def capabilities() -> Response:
    _principal(None)
    caps = await _client().capabilities()
    caps = dict(caps)
    limits = dict(caps.get("limits", {}))
    limits["max_body_bytes"] = current_app.config["MAX_CONTENT_LENGTH"]
    caps["limits"] = limits
    return _ok(caps)


@bp.get("/participant")
async def participant_get() -> Response:
    p = _principal("shared_read")
    return _ok(await _client().participant(p.name, p.actions))


@bp.get("/spaces")
async def spaces_list() -> Response:
    p = _principal("shared_read")
    cursor, limit = _list_args()
    return _ok(await _client().spaces(p.name, p.actions, cursor, limit))


@bp.get("/spaces/<space>")
async def space_get(space: str) -> Response:
    p = _principal("shared_read")
    return _ok(await _client().space(p.name, p.actions, space))


@bp.get("/spaces/<space>/members")
async def members_list(space: str) -> Response:
    p = _principal("shared_read")
    cursor, limit = _list_args()
    return _ok(await _client().members(p.name, p.actions, space, cursor, limit))


@bp.get("/spaces/<space>/conversations")
async def conversations_list(space: str) -> Response:
    p = _principal("shared_read")
    cursor, limit = _list_args()
    return _ok(await _client().conversations(p.name, p.actions, space, cursor, limit))


@bp.get("/conversations/<conversation>")
async def conversation_get(conversation: str) -> Response:
    p = _principal("shared_read")
    return _ok(await _client().conversation(p.name, p.actions, conversation))


@bp.get("/operations/<operation>")
async def operation_get(operation: str) -> Response:
    p = _principal("shared_read")
    return _ok(await _client().operation(p.name, p.actions, operation))


@bp.get("/operations/<operation>/result")
async def operation_result(operation: str) -> Response:
    p = _principal("shared_read")
    raw = request.args.get("offset", "0")
    if not raw.isdigit() or len(raw) > 20:
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return _ok(await _client().operation_result(p.name, p.actions, operation, int(raw)))


# --------------------------------------------------------------------------- mutations


@bp.post("/participant")
async def participant_register() -> Response:
    return await _mutate("participant.register", RegisterParticipant, "shared_write")


@bp.post("/spaces")
async def space_create() -> Response:
    return await _mutate("space.create", CreateSpace, "shared_write")


@bp.post("/spaces/<space>/members")
async def member_set(space: str) -> Response:
    return await _mutate("member.set", SetMember, "shared_manage", space=space)


@bp.post("/spaces/<space>/conversations")
async def conversation_create(space: str) -> Response:
    return await _mutate("conversation.create", CreateConversation, "shared_write",
                         space=space)


@bp.post("/participant/retirements")
async def participant_retire() -> Response:
    return await _mutate("participant.retire", Retirement, "shared_write")
