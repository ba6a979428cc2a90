"""Routes of the shared-conversations API (base ``/aotx/v1/shared``).

Each route authenticates (``g.principal``, set by the app), checks the
gateway action it needs, parses and validates the body, then makes exactly
one device-client call and renders its JSON.  Reads need ``shared_read``;
registering, creating spaces and conversations and retiring need
``shared_write``; membership changes need ``shared_manage`` (the device then
also checks the caller's manage right in that space).  ``capabilities`` needs
only a valid token.

The mutation views are generated from
:data:`aotx_trio.gateway.routes_table.MUTATION_ROUTES` (the table the ASGI
fast path answers from too); the plain reads from :data:`READ_ROUTES`.

``GET /operations/{op}/events`` and ``GET /conversations/{con}/events?stream=true``
stream server-sent events (:mod:`aotx_trio.gateway.events`); without
``stream=true`` the conversation's events are one JSON page.
``GET /spaces/{space}/memory[/{object}]`` read shared memory (runtime/memory.py).
Publications belong to later work and are not routed (404).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from quart import Blueprint, Response, current_app, g, request

from aotx_trio import errors
from aotx_trio.gateway import events
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import BASE, MUTATION_ROUTES, MutationRoute, encode, submit
from aotx_trio.service.client import DeviceClient
from aotx_trio.vocab import is_decimal

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


def _list_args() -> tuple[str | None, int]:
    cursor = request.args.get("cursor")
    if cursor is not None and not is_decimal(cursor):
        raise errors.InvalidInput("cursor must be a cursor returned by an earlier page",
                                  field="cursor")
    top = int(current_app.config.get("AOTX_LIST_LIMIT_MAX", MAX_LIMIT))
    default = int(current_app.config.get("AOTX_LIST_LIMIT_DEFAULT", DEFAULT_LIMIT))
    raw_limit = request.args.get("limit", str(default))
    if not is_decimal(raw_limit, 9) or not 1 <= int(raw_limit) <= top:
        raise errors.InvalidInput(f"limit must be an integer in 1..{top}", field="limit")
    return cursor, int(raw_limit)


def _ok(body: Any) -> Response:
    return json_response(body, 200)


# --------------------------------------------------------------------------- reads


@bp.get("/capabilities")
async def capabilities() -> Response:
    principal = _principal(None)
    caps = await _client().capabilities()
    caps = dict(caps)
    if "shared_manage" not in principal.actions:
        caps["usage"] = None    # deployment-wide counts are for managers only
    limits = dict(caps.get("limits", {}))
    limits["max_body_bytes"] = current_app.config["MAX_CONTENT_LENGTH"]
    limits["max_media_bytes"] = current_app.config["AOTX_MAX_MEDIA_BYTES"]
    caps["limits"] = limits
    return _ok(caps)


@dataclass(frozen=True, slots=True)
class ReadRoute:
    """``GET BASE + rule`` -> ``DeviceClient.<method>(principal, actions, *path
    parameters[, cursor, limit])``, with ``shared_read``."""

    endpoint: str
    rule: str
    method: str
    paged: bool = False


READ_ROUTES: tuple[ReadRoute, ...] = (
    ReadRoute("participant_get", "/participant", "participant"),
    ReadRoute("spaces_list", "/spaces", "spaces", paged=True),
    ReadRoute("space_get", "/spaces/<space>", "space"),
    ReadRoute("members_list", "/spaces/<space>/members", "members", paged=True),
    ReadRoute("conversations_list", "/spaces/<space>/conversations", "conversations",
              paged=True),
    ReadRoute("conversation_get", "/conversations/<conversation>", "conversation"),
    ReadRoute("memory_list", "/spaces/<space>/memory", "memory_list", paged=True),
    ReadRoute("operation_get", "/operations/<operation>", "operation"),
)


def _read_view(route: ReadRoute) -> Callable[..., Awaitable[Response]]:
    async def view(**params: str) -> Response:
        p = _principal("shared_read")
        args: list[Any] = list(params.values())
        if route.paged:
            args.extend(_list_args())
        call = getattr(_client(), route.method)
        return _ok(await call(p.name, p.actions, *args))

    return view


for _read in READ_ROUTES:
    bp.add_url_rule(_read.rule, _read.endpoint, _read_view(_read), methods=["GET"])


@bp.get("/operations/<operation>/result")
async def operation_result(operation: str) -> Response:
    p = _principal("shared_read")
    raw = request.args.get("offset", "0")
    if not is_decimal(raw):
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return _ok(await _client().operation_result(p.name, p.actions, operation, int(raw)))


@bp.get("/spaces/<space>/memory/<object>")
async def memory_get(space: str, **params: str) -> Response:
    p = _principal("shared_read")
    raw = request.args.get("offset", "0")
    if not is_decimal(raw):
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return _ok(await _client().memory_get(p.name, p.actions, space, params["object"],
                                          int(raw)))


@bp.get("/conversations/<conversation>/events")
async def conversation_events(conversation: str) -> Response:
    p = _principal("shared_read")
    stream = request.args.get("stream", "false")
    if stream not in ("true", "false"):
        raise errors.InvalidInput("stream must be true or false", field="stream")
    if stream == "true":
        return await events.conversation_events(_client(), p, conversation)
    cursor, limit = _list_args()
    return _ok(await _client().conversation_events(p.name, p.actions, conversation, cursor,
                                                   limit))


@bp.get("/operations/<operation>/events")
async def operation_events(operation: str) -> Response:
    return await events.operation_events(_client(), _principal("shared_read"), operation)


# --------------------------------------------------------------------------- mutations


async def _body() -> bytes:
    raw: bytes = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return raw


def _mutation_view(route: MutationRoute) -> Callable[..., Awaitable[Response]]:
    async def view(**params: str) -> Response:
        status, receipt, headers = await submit(_client(), g.principal, route, params, _body)
        data, pairs = encode(receipt, headers)
        return Response(data, status=status, headers=pairs)

    return view


for _mutation in MUTATION_ROUTES:
    bp.add_url_rule(_mutation.rule, _mutation.endpoint, _mutation_view(_mutation),
                    methods=["POST"])
