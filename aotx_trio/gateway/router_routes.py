"""The serving router's routes (``serving-router.txt``), in the gateway app.

``GET /models``, ``GET /models/{id-or-alias}`` (slashes allowed), ``POST
/models/{id-or-alias}/invoke``, ``GET /aliases/{name}``, ``GET
/scratch-sessions[?active=]``, ``GET /scratch-sessions/{uuid}``, ``POST
/scratch-sessions/{uuid}/invoke``.  Bearer auth on every route: ``models_read``
for the reads, ``models_invoke`` for the invokes (403 ``forbidden`` without
it).  What each answers is :class:`aotx_trio.router.service.RouterService`'s;
here only HTTP: query strings and the body; errors leave in the ``shared`` dialect,
the invoke routes' in the ``router`` one (``"ok": false`` added:
:mod:`aotx_trio.gateway.errors`).  A gateway without a ``store``
answers every route 503 ``not_ready`` (``missing: ["store"]``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

from aotx_trio import errors
from aotx_trio.gateway.auth import Authenticator, Principal
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.registry.records import check_key
from aotx_trio.router.dispatch import Caller
from aotx_trio.router.service import RouterService

SHOWN = 80


def query(allowed: tuple[str, ...]) -> dict[str, str]:
    """The query string of a router or webhook route: only ``allowed`` keys, once each
    (422 ``invalid_params`` naming the key)."""
    args = request.args
    for key in args:
        if key not in allowed:
            raise errors.InvalidParams(key[:SHOWN], "unknown",
                                       f"unknown query parameter {key[:SHOWN]!r}")
        if len(args.getlist(key)) > 1:
            raise errors.InvalidParams(key, "unique", f"query parameter {key!r} is given twice")
    return {k: args[k] for k in args}


def _body(raw: bytes) -> Any:
    """An invoke body: one that is not JSON (or breaks the JSON bounds) is a
    transport-envelope violation, 422 ``invalid_params`` with ``param: "body"`` and the
    shared API's code as the ``rule`` (the router's table has no other code for it)."""
    try:
        return decode_json(raw)
    except errors.BadRequest as exc:
        raise errors.InvalidParams("body", exc.code, exc.message) from None


def _key(value: str, code: str) -> str:
    """A target from the path: one that cannot be a key names nothing (404 ``code``)."""
    try:
        return check_key(value, "target")
    except errors.InvalidInput:
        raise errors.NotFound(f"no such target {value[:SHOWN]!r}", code=code,
                              target=value[:SHOWN]) from None


#: unmatched paths under a router prefix answer that prefix's not-found code
NOT_FOUND_CODES = (("/models/", "model_not_found"), ("/aliases/", "alias_unresolved"),
                   ("/scratch-sessions/", "scratch_not_found"))
#: the routes whose errors leave in the ``router`` dialect
INVOKE_ENDPOINTS = ("router_invoke", "router_scratch_invoke")


def unrouted(exc: Exception, path: str) -> Exception:
    """Quart's 404 for a path under a router prefix is that prefix's not-found code."""
    if isinstance(exc, NotFound):
        for prefix, code in NOT_FOUND_CODES:
            if path.startswith(prefix):
                return errors.NotFound("no such target", code=code)
    return exc


def mount(app: QuartTrio, auth: Authenticator, router: RouterService | None) -> None:
    def principal(action: str) -> Principal:
        p = auth.authenticate(request.headers.get("Authorization"))
        p.require(action)
        return p

    def service() -> RouterService:
        if router is None:
            raise errors.NotReady("this gateway has no model registry (set store in "
                                  "gateway.json)", missing=["store"])
        return router

    async def invoke(run: Callable[[RouterService, Any, Caller], Awaitable[dict[str, Any]]],
                     ) -> Response:
        p = principal("models_invoke")
        svc = service()
        raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
        return json_response(await run(svc, _body(raw), Caller(p.name, p.actions)), 200)

    @app.get("/models", endpoint="router_models")
    async def _models() -> Response:
        principal("models_read")
        q = query(("model_type", "state_filter"))
        return json_response(service().list_models(q.get("model_type"),
                                                   q.get("state_filter")), 200)

    @app.get("/models/<path:target>", endpoint="router_model")
    async def _model(target: str) -> Response:
        principal("models_read")
        query(())
        return json_response(await service().detail(_key(target, "model_not_found")), 200)

    @app.post("/models/<path:target>/invoke", endpoint="router_invoke")
    async def _invoke(target: str) -> Response:
        return await invoke(lambda svc, body, caller: svc.invoke(
            _key(target, "model_not_found"), body, caller))

    @app.get("/aliases/<path:name>", endpoint="router_alias")
    async def _alias(name: str) -> Response:
        principal("models_read")
        query(())
        return json_response(await service().alias(_key(name, "alias_unresolved")), 200)

    @app.get("/scratch-sessions", endpoint="router_sessions")
    async def _sessions() -> Response:
        principal("models_read")
        active = query(("active",)).get("active", "true")
        if active not in ("true", "false"):
            raise errors.InvalidParams("active", "enum", "active must be true or false")
        return json_response(await service().sessions(active == "true"), 200)

    @app.get("/scratch-sessions/<session_id>", endpoint="router_session")
    async def _session(session_id: str) -> Response:
        principal("models_read")
        query(())
        return json_response(await service().session(_key(session_id, "scratch_not_found")),
                             200)

    @app.post("/scratch-sessions/<session_id>/invoke", endpoint="router_scratch_invoke")
    async def _scratch_invoke(session_id: str) -> Response:
        return await invoke(lambda svc, body, caller: svc.scratch_invoke(
            _key(session_id, "scratch_not_found"), body, caller))
