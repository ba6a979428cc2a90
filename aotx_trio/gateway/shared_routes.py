"""Routes of the shared-conversations API (base ``/aotx/v1/shared``).

The paths, actions and limits are rows of :data:`aotx_trio.gateway.routes_table.ROUTES`;
the admit step has authenticated the caller (``g.principal``) and checked the
row's action before a view here runs (the device then also checks the caller's
rights in a space).  Each view parses and validates what is left, then makes
exactly one device-client call and renders its JSON.  :data:`VIEWS` maps the
rows' endpoints to the views: the mutation views are generated from the rows with
a kind (the rows the ASGI fast path answers from too), the plain reads from
:data:`READS`.

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

from quart import Response, current_app, g, request

from aotx_trio import errors
from aotx_trio.gateway import events
from aotx_trio.gateway.auth import Principal
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import MUTATION_ROUTES, Route, encode, submit
from aotx_trio.service.client import DeviceClient
from aotx_trio.vocab import is_decimal

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


def client() -> DeviceClient:
    """The app's device client (in a view)."""
    found: DeviceClient = current_app.config["AOTX_CLIENT"]
    return found


def principal() -> Principal:
    """The caller, as the admit step found it (in a view)."""
    found: Principal = g.principal
    return found


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


async def capabilities() -> Response:
    caps = dict(await client().capabilities())
    if "shared_manage" not in principal().actions:
        caps["usage"] = None    # deployment-wide counts are for managers only
    limits = dict(caps.get("limits", {}))
    limits["max_body_bytes"] = current_app.config["MAX_CONTENT_LENGTH"]
    limits["max_media_bytes"] = current_app.config["AOTX_MAX_MEDIA_BYTES"]
    caps["limits"] = limits
    return _ok(caps)


@dataclass(frozen=True, slots=True)
class Read:
    """A plain read: ``DeviceClient.<method>(principal, actions, *path parameters[,
    cursor, limit])``."""

    method: str
    paged: bool = False


READS: dict[str, Read] = {
    "participant_get": Read("participant"),
    "spaces_list": Read("spaces", paged=True),
    "space_get": Read("space"),
    "members_list": Read("members", paged=True),
    "conversations_list": Read("conversations", paged=True),
    "conversation_get": Read("conversation"),
    "memory_list": Read("memory_list", paged=True),
    "operation_get": Read("operation"),
}


def _read_view(read: Read) -> Callable[..., Awaitable[Response]]:
    async def view(**params: str) -> Response:
        p = principal()
        args: list[Any] = list(params.values())
        if read.paged:
            args.extend(_list_args())
        call = getattr(client(), read.method)
        return _ok(await call(p.name, p.actions, *args))

    return view


async def operation_result(operation: str) -> Response:
    p = principal()
    raw = request.args.get("offset", "0")
    if not is_decimal(raw):
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return _ok(await client().operation_result(p.name, p.actions, operation, int(raw)))


async def memory_get(space: str, **params: str) -> Response:
    p = principal()
    raw = request.args.get("offset", "0")
    if not is_decimal(raw):
        raise errors.InvalidInput("offset must be a non-negative byte offset", field="offset")
    return _ok(await client().memory_get(p.name, p.actions, space, params["object"],
                                          int(raw)))


async def conversation_events(conversation: str) -> Response:
    p = principal()
    stream = request.args.get("stream", "false")
    if stream not in ("true", "false"):
        raise errors.InvalidInput("stream must be true or false", field="stream")
    if stream == "true":
        return await events.conversation_events(client(), p, conversation)
    cursor, limit = _list_args()
    return _ok(await client().conversation_events(p.name, p.actions, conversation, cursor,
                                                   limit))


async def operation_events(operation: str) -> Response:
    return await events.operation_events(client(), principal(), operation)


# --------------------------------------------------------------------------- mutations


async def _body() -> bytes:
    raw: bytes = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return raw


def _mutation_view(route: Route) -> Callable[..., Awaitable[Response]]:
    async def view(**params: str) -> Response:
        status, receipt, headers = await submit(client(), principal(), route, params, _body)
        data, pairs = encode(receipt, headers)
        return Response(data, status=status, headers=pairs)

    return view


VIEWS: dict[str, Callable[..., Awaitable[Response]]] = {
    "capabilities": capabilities, "operation_result": operation_result,
    "memory_get": memory_get, "conversation_events": conversation_events,
    "operation_events": operation_events,
    **{endpoint: _read_view(read) for endpoint, read in READS.items()},
    **{route.endpoint: _mutation_view(route) for route in MUTATION_ROUTES},
}
