"""The serving router's routes (``serving-router.txt``), in the gateway app.

``GET /models``, ``GET /models/{id-or-alias}`` (slashes allowed), ``POST
/models/{id-or-alias}/invoke``, ``GET /aliases/{name}``, ``GET
/scratch-sessions[?active=]``, ``GET /scratch-sessions/{uuid}``, ``POST
/scratch-sessions/{uuid}/invoke``.  Bearer auth on every route: ``models_read``
for the reads, ``models_invoke`` for the invokes (403 ``forbidden`` without
it).  What each answers is :class:`aotx_trio.router.service.RouterService`'s;
here only HTTP: query strings, the body, and the one error envelope, with
``"ok": false`` added on the invoke routes.  A gateway without a ``store``
answers every route 503 ``not_ready`` (``missing: ["store"]``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from quart import Response, current_app, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, NotFound

from aotx_trio import errors
from aotx_trio.gateway.auth import Authenticator, Principal
from aotx_trio.gateway.errors import error_parts, handle_any, http_error_parts, json_response
from aotx_trio.gateway.routes_table import decode_json
from aotx_trio.registry.records import check_key
from aotx_trio.router.dispatch import Caller
from aotx_trio.router.service import RouterService

SHOWN = 80


def _bad(message: str, param: str, rule: str) -> errors.InvalidInput:
    return errors.InvalidInput(message, code="invalid_params", param=param, rule=rule)


def _envelope(exc: errors.AotxError) -> errors.InvalidInput:
    """A body that is not JSON (or breaks the JSON bounds) is a transport-envelope
    violation: 422 ``invalid_params`` with ``param: "body"`` and the shared API's code as
    the ``rule`` (the router's table has no other code for it)."""
    return _bad(exc.message, "body", exc.code)


def _query(allowed: tuple[str, ...]) -> dict[str, str]:
    args = request.args
    for key in args:
        if key not in allowed:
            raise _bad(f"unknown query parameter {key[:SHOWN]!r}", key[:SHOWN], "unknown")
        if len(args.getlist(key)) > 1:
            raise _bad(f"query parameter {key!r} is given twice", key, "unique")
    return {k: args[k] for k in args}


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
        try:
            p = principal("models_invoke")
            svc = service()
            raw = await request.get_data(cache=False, as_text=False, parse_form_data=False)
            try:
                parsed = decode_json(raw)
            except (errors.BadRequest, errors.InvalidInput) as exc:
                raise _envelope(exc) from None
            body = await run(svc, parsed, Caller(p.name, p.actions))
            return json_response(body, 200)
        except errors.AotxError as exc:
            status, env, headers = error_parts(
                exc, int(current_app.config.get("AOTX_RETRY_AFTER_S", 1)))
        except HTTPException as exc:
            status, env, headers = http_error_parts(
                exc, (current_app.config.get("MAX_CONTENT_LENGTH"),))
        return json_response({"ok": False, **env}, status, headers)

    async def not_found(exc: Exception) -> Response:
        for prefix, code in NOT_FOUND_CODES:
            if request.path.startswith(prefix):
                return await handle_any(errors.NotFound("no such target", code=code))
        return await handle_any(exc)

    app.register_error_handler(NotFound, not_found)

    @app.get("/models", endpoint="router_models")
    async def _models() -> Response:
        principal("models_read")
        q = _query(("model_type", "state_filter"))
        return json_response(service().list_models(q.get("model_type"),
                                                   q.get("state_filter")), 200)

    @app.get("/models/<path:target>", endpoint="router_model")
    async def _model(target: str) -> Response:
        principal("models_read")
        _query(())
        return json_response(await service().detail(_key(target, "model_not_found")), 200)

    @app.post("/models/<path:target>/invoke", endpoint="router_invoke")
    async def _invoke(target: str) -> Response:
        return await invoke(lambda svc, body, caller: svc.invoke(
            _key(target, "model_not_found"), body, caller))

    @app.get("/aliases/<path:name>", endpoint="router_alias")
    async def _alias(name: str) -> Response:
        principal("models_read")
        _query(())
        return json_response(await service().alias(_key(name, "alias_unresolved")), 200)

    @app.get("/scratch-sessions", endpoint="router_sessions")
    async def _sessions() -> Response:
        principal("models_read")
        active = _query(("active",)).get("active", "true")
        if active not in ("true", "false"):
            raise _bad("active must be true or false", "active", "enum")
        return json_response(await service().sessions(active == "true"), 200)

    @app.get("/scratch-sessions/<session_id>", endpoint="router_session")
    async def _session(session_id: str) -> Response:
        principal("models_read")
        _query(())
        return json_response(await service().session(_key(session_id, "scratch_not_found")),
                             200)

    @app.post("/scratch-sessions/<session_id>/invoke", endpoint="router_scratch_invoke")
    async def _scratch_invoke(session_id: str) -> Response:
        return await invoke(lambda svc, body, caller: svc.scratch_invoke(
            _key(session_id, "scratch_not_found"), body, caller))
