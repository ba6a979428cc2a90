"""The one error envelope renderer of the gateway.

Every error on every route, including Quart's own 404/405/413/500, leaves as
``{"error": {"code": "<snake_case>", "message": "...", ...fields}}`` with
``Cache-Control: no-store``.  Status, code and headers of our own errors come
from the one map :func:`aotx_trio.errors.http_parts` (every 429 and 503 with
``Retry-After`` from ``limits.retry_after_s``); werkzeug's own HTTP
exceptions are translated by :func:`http_error_parts`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from quart import Response, current_app, has_app_context
from werkzeug.exceptions import HTTPException

from aotx_trio import errors

log = logging.getLogger("aotx.gateway")

DEFAULT_RETRY_AFTER_S = 1


# Werkzeug HTTP exceptions Quart raises itself -> our codes.
_HTTP_CODES: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 413: "body_too_large", 415: "unsupported_media_type",
    500: "internal_error",
}


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(body: Any) -> str:
    """The gateway's one JSON encoding (compact, UTF-8 text; one prebuilt encoder, the
    same bytes as ``json.dumps`` with these settings)."""
    return _ENCODER.encode(body)


def json_response(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    resp = Response(dumps(body), status=status, content_type="application/json")
    resp.headers["Cache-Control"] = "no-store"
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp


def error_parts(exc: errors.AotxError, retry_after_s: int = DEFAULT_RETRY_AFTER_S,
                ) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, envelope, extra headers) of an error: :func:`aotx_trio.errors.http_parts`
    with the configured ``limits.retry_after_s``; shared by :func:`render` and the ASGI
    fast path (aotx_trio.gateway.fast)."""
    return errors.http_parts(exc, retry_after_s)


def render(exc: errors.AotxError) -> Response:
    retry = current_app.config.get("AOTX_RETRY_AFTER_S", DEFAULT_RETRY_AFTER_S) \
        if has_app_context() else DEFAULT_RETRY_AFTER_S
    status, body, headers = error_parts(exc, retry)
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
