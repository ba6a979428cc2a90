"""The webhook routes (docs/webhooks.md), in the gateway app.

``POST /webhooks`` (201 with the subscription; 429 ``over_quota`` past
``limits.max_webhooks``), ``GET /webhooks[?cursor=&limit=]`` (a page, oldest first,
disabled history included), ``DELETE /webhooks/{uuid}[?why=]`` (disables; 404
``webhook_not_found`` when no active one), ``GET /webhooks/signing-key``: rows of
:data:`aotx_trio.gateway.routes_table.ROUTES` (the admit step checks the token, the
rate and ``webhooks_manage``).  What each answers is
:class:`aotx_trio.webhooks.service.WebhookService`'s; a gateway without a ``store``
answers 503 ``not_ready`` (``missing: ["store"]``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.router_routes import not_ready, query
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import principal
from aotx_trio.vocab import is_decimal
from aotx_trio.webhooks.service import WebhookService


def _service() -> WebhookService:
    hooks: WebhookService | None = current_app.config.get("AOTX_WEBHOOKS")
    if hooks is None:
        raise not_ready()
    return hooks


async def _create() -> Response:
    svc = _service()
    query(())
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return json_response(await svc.create(decode_json(raw), principal().name), 201)


async def _list() -> Response:
    svc = _service()
    args = query(("cursor", "limit"))
    top = int(current_app.config["AOTX_LIST_LIMIT_MAX"])
    raw_limit = args.get("limit", str(current_app.config["AOTX_LIST_LIMIT_DEFAULT"]))
    if not is_decimal(raw_limit, 9) or not 1 <= int(raw_limit) <= top:
        raise errors.InvalidParams("limit", "range", f"limit must be an integer in 1..{top}")
    return json_response(await svc.list(args.get("cursor"), int(raw_limit)), 200)


async def _key() -> Response:
    svc = _service()
    query(())
    return json_response(svc.signing_key(), 200)


async def _disable(uuid: str) -> Response:
    svc = _service()
    return json_response(await svc.disable(uuid, query(("why",)).get("why")), 200)


VIEWS: dict[str, Callable[..., Awaitable[Response]]] = {
    "webhooks_create": _create, "webhooks_list": _list,
    "webhooks_signing_key": _key, "webhooks_disable": _disable}
