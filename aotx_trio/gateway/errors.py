"""The one error envelope renderer of the gateway.

Every error on every route, including Quart's own 404/405/413/500, leaves as
``{"error": {"code": "<snake_case>", "message": "...", ...fields}}`` with
``Cache-Control: no-store``.  Status codes come from
:func:`aotx_trio.errors.http_status`, plus the few classes only HTTP knows
(401 unauthorized, 413 body_too_large, 400 invalid_utf8 / malformed_json /
schema_invalid, 503 runtime_unavailable / save_pending).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from quart import Response, current_app, has_app_context
from werkzeug.exceptions import HTTPException

from aotx_trio import errors
from aotx_trio.client import RuntimeUnavailable, SavePending

log = logging.getLogger("aotx.gateway")


class Unauthorized(errors.RequestError):
    default_code = "unauthorized"


class BadRequest(errors.RequestError):
    """400: the body cannot be read as a request at all (codes invalid_utf8,
    malformed_json, schema_invalid, ...)."""

    default_code = "bad_request"


class BodyTooLarge(errors.RequestError):
    default_code = "body_too_large"


class MethodNotAllowed(errors.RequestError):
    default_code = "method_not_allowed"


_GATEWAY_STATUS: dict[type[errors.AotxError], int] = {
    Unauthorized: 401,
    BadRequest: 400,
    BodyTooLarge: 413,
    MethodNotAllowed: 405,
    RuntimeUnavailable: 503,
    SavePending: 503,
}

# Werkzeug HTTP exceptions Quart raises itself -> our codes.
_HTTP_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
    500: "internal_error",
}


def status_for(exc: errors.AotxError) -> int:
    for cls in type(exc).__mro__:
        if cls in _GATEWAY_STATUS:
            return _GATEWAY_STATUS[cls]
    return errors.http_status(exc)


def dumps(body: Any) -> str:
    """The gateway's one JSON encoding (compact, UTF-8 text)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def json_response(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    resp = Response(dumps(body), status=status, content_type="application/json")
    resp.headers["Cache-Control"] = "no-store"
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def error_parts(exc: errors.AotxError) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, envelope, extra headers) of an error: shared by :func:`render` and the
    ASGI fast path (aotx_trio.gateway.fast)."""
    status = status_for(exc)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="aotx"'
    retry_after = exc.fields.get("retry_after")
    if status in (429, 503) and isinstance(retry_after, int | float):
        headers["Retry-After"] = str(max(1, int(retry_after)))
    return status, exc.envelope(), headers


def render(exc: errors.AotxError) -> Response:
    status, body, headers = error_parts(exc)
    return json_response(body, status, headers)


def http_error_parts(exc: HTTPException, limit: tuple[Any] | None = None,
                     ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, envelope, extra headers) of a werkzeug HTTP exception; ``limit``, when
    given, is the 1-tuple of the body limit a 413 names.  Shared by :func:`render_http`
    and the fast path."""
    status = exc.code or 500
    code = _HTTP_CODES.get(status, f"http_{status}")
    message = {
        404: "no such route or resource",
        405: "method not allowed on this route",
        413: "request body is over the configured limit",
    }.get(status, exc.description or exc.name)
    body: dict[str, Any] = {"code": code, "message": message}
    if status == 413 and limit is not None:
        body["limit"] = limit[0]
    headers: dict[str, str] = {}
    if status == 405:
        allow = getattr(exc, "valid_methods", None)
        if allow:
            headers["Allow"] = ", ".join(sorted(allow))
    return status, {"error": body}, headers


def render_http(exc: HTTPException) -> Response:
    limit = (current_app.config.get("MAX_CONTENT_LENGTH"),) if has_app_context() else None
    status, body, headers = http_error_parts(exc, limit)
    return json_response(body, status, headers)


INTERNAL_ERROR: dict[str, Any] = {"error": {"code": "internal_error",
                                           "message": "internal error; see the gateway log"}}


def render_unexpected(exc: BaseException) -> Response:
    log.error("unhandled error", exc_info=exc)
    return json_response(INTERNAL_ERROR, 500)


async def handle_any(exc: Exception) -> Response:
    """The app's single error handler (registered for ``Exception``)."""
    if isinstance(exc, errors.AotxError):
        return render(exc)
    if isinstance(exc, HTTPException):
        return render_http(exc)
    return render_unexpected(exc)
