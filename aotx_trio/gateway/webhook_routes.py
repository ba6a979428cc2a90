"""The webhook routes (serving-router.txt "Webhooks and events"), in the gateway app.

``POST /webhooks`` (201 with the subscription), ``GET /webhooks`` (every one,
disabled history included), ``DELETE /webhooks/{uuid}[?why=]`` (disables; 404
``webhook_not_found`` when no active one), ``GET /webhooks/signing-key``.  Bearer
auth with ``webhooks_manage`` on every route.  What each answers is
:class:`aotx_trio.webhooks.service.WebhookService`'s; a gateway without a ``store``
answers 503 ``not_ready`` (``missing: ["store"]``).
"""

from __future__ import annotations

from quart import Response, request
from quart_trio import QuartTrio

from aotx_trio import errors
from aotx_trio.gateway.auth import Authenticator
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.router_routes import query
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.webhooks.service import WebhookService


def mount(app: QuartTrio, auth: Authenticator, hooks: WebhookService | None) -> None:
    def service() -> WebhookService:
        auth.authenticate(request.headers.get("Authorization")).require("webhooks_manage")
        if hooks is None:
            raise errors.NotReady("this gateway has no model registry (set store in "
                                  "gateway.json)", missing=["store"])
        return hooks

    @app.post("/webhooks", endpoint="webhooks_create")
    async def _create() -> Response:
        svc = service()
        query(())
        raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        return json_response(await svc.create(decode_json(raw)), 201)

    @app.get("/webhooks", endpoint="webhooks_list")
    async def _list() -> Response:
        svc = service()
        query(())
        return json_response(await svc.list(), 200)

    @app.get("/webhooks/signing-key", endpoint="webhooks_signing_key")
    async def _key() -> Response:
        svc = service()
        query(())
        return json_response(svc.signing_key(), 200)

    @app.delete("/webhooks/<uuid>", endpoint="webhooks_disable")
    async def _disable(uuid: str) -> Response:
        svc = service()
        return json_response(await svc.disable(uuid, query(("why",)).get("why")), 200)
