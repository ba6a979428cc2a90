"""The serving router's routes (docs/router.md), in the gateway app.

``GET /models``, ``GET /models/{id-or-alias}`` (slashes allowed), ``POST
/models/{id-or-alias}/invoke``, ``GET /aliases/{name}``, ``GET
/scratch-sessions[?active=]``, ``GET /scratch-sessions/{uuid}``, ``POST
/scratch-sessions/{uuid}/invoke``: rows of
:data:`aotx_trio.gateway.routes_table.ROUTES`, whose admit step checks the token,
the rate and ``models_read`` for the reads, ``models_invoke`` for the invokes (403
``forbidden`` without it).  What each answers is
:class:`aotx_trio.router.service.RouterService`'s; here only HTTP: query strings
and the body.  Errors leave in the rows' dialects (the invokes' ``router``:
``"ok": false`` added; :mod:`aotx_trio.gateway.errors`).  A gateway without a
``store`` answers every route 503 ``not_ready`` (``missing: ["store"]``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, current_app, request

from aotx_trio import errors
from aotx_trio.gateway.errors import json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.gateway.shared_routes import principal
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


def not_ready() -> errors.NotReady:
    """What the router and webhook routes answer on a gateway without a store."""
    return errors.NotReady("this gateway has no model registry (set store in "
                           "gateway.json)", missing=["store"])


def _key(value: str, code: str) -> str:
    """A target from the path: one that cannot be a key names nothing (404 ``code``)."""
    try:
        return check_key(value, "target")
    except errors.InvalidInput:
        raise errors.NotFound(f"no such target {value[:SHOWN]!r}", code=code,
                              target=value[:SHOWN]) from None


def _service() -> RouterService:
    router: RouterService | None = current_app.config.get("AOTX_ROUTER")
    if router is None:
        raise not_ready()
    return router


async def _invoke(run: Callable[[RouterService, Any, Caller], Awaitable[dict[str, Any]]],
                  ) -> Response:
    p = principal()
    svc = _service()
    raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    # a body that is not UTF-8 JSON: 400 invalid_utf8 / malformed_json, as on every route
    return json_response(await run(svc, decode_json(raw), Caller(p.name, p.actions)), 200)


async def _models() -> Response:
    q = query(("model_type", "state_filter"))
    return json_response(_service().list_models(q.get("model_type"), q.get("state_filter")),
                         200)


async def _model(target: str) -> Response:
    query(())
    return json_response(await _service().detail(_key(target, "model_not_found")), 200)


async def _model_invoke(target: str) -> Response:
    return await _invoke(lambda svc, body, caller: svc.invoke(
        _key(target, "model_not_found"), body, caller))


async def _alias(name: str) -> Response:
    query(())
    return json_response(await _service().alias(_key(name, "alias_unresolved")), 200)


async def _sessions() -> Response:
    active = query(("active",)).get("active", "true")
    if active not in ("true", "false"):
        raise errors.InvalidParams("active", "enum", "active must be true or false")
    return json_response(await _service().sessions(active == "true"), 200)


async def _session(session_id: str) -> Response:
    query(())
    return json_response(await _service().session(_key(session_id, "scratch_not_found")),
                         200)


async def _scratch_invoke(session_id: str) -> Response:
    return await _invoke(lambda svc, body, caller: svc.scratch_invoke(
        _key(session_id, "scratch_not_found"), body, caller))


VIEWS: dict[str, Callable[..., Awaitable[Response]]] = {
    "router_models": _models, "router_model": _model, "router_invoke": _model_invoke,
    "router_alias": _alias, "router_sessions": _sessions, "router_session": _session,
    "router_scratch_invoke": _scratch_invoke,
}
