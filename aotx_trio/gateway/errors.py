"""The gateway's one error renderer: :func:`render` ``(exc, dialect) -> (status, body,
headers)``, applied once, at the edge (the app's error handler, the ASGI fast path,
the body budget), in the dialect of the route (its row of the route table).

Handlers raise; they never build an error body.  A caller's wrong field is
:class:`aotx_trio.errors.InvalidParams` ``(param, rule, message)`` on every surface.
Every error leaves with ``Cache-Control: no-store``; the dialects:

* ``shared`` (the shared API, media, metrics, the router's reads, webhooks):
  ``{"error": {"code": "<snake_case>", "message": "...", ...fields}}``.  Status,
  code and headers of our own errors come from the one map
  :func:`aotx_trio.errors.http_parts` (every 429 and 503 with ``Retry-After`` from
  ``limits.retry_after_s``); werkzeug's own HTTP exceptions (Quart's
  404/405/413/...) are translated by :func:`http_error_parts`; anything else is a
  logged 500 ``internal_error``.
* ``router`` (the serving router's invoke routes): the shared envelope with
  ``"ok": false`` first.
* ``openai`` (every path under ``/v1``, routed or not): every error is OpenAI's
  ``{"error": {"message", "type", "param", "code"}}`` (:func:`openai_body`; the
  ``type`` by status, :data:`OPENAI_TYPES`; the codes in one ``/v1`` vocabulary,
  :data:`OPENAI_CODES`).  A wrong field (``InvalidParams``, or the runtime's
  ``InvalidInput`` naming a ``field``) is 400 with ``param`` the field and ``code``
  the rule (or the runtime's code); an unknown model is 404 ``model_not_found``
  with ``param: "model"``; 401, 404, 405, 413, 429, malformed JSON and invalid
  UTF-8 keep their status, headers and code with ``param: null``.  The official
  ``openai`` client raises its usual exceptions on these.

A stream's error event carries :func:`event_body` (the dialect's body without the
HTTP-only ``retry_after``).
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

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


Dialect = Literal["shared", "router", "openai"]
Parts = tuple[int, dict[str, Any], dict[str, str]]

INTERNAL_ERROR: dict[str, Any] = {"error": {"code": "internal_error",
                                           "message": "internal error; see the gateway log"}}


#: OpenAI's error ``type`` by status (anything else: ``invalid_request_error``)
OPENAI_TYPES: dict[int, str] = {401: "authentication_error", 403: "permission_error",
                                429: "rate_limit_error", 500: "server_error",
                                503: "server_error"}
#: our codes -> the ``/v1`` vocabulary's (the one list is docs/api.md "Errors")
OPENAI_CODES: dict[str, str] = {"invalid_argument": "invalid_parameter",
                                "unknown_model": "model_not_found",
                                "unauthorized": "invalid_api_key"}


def _openai(exc: errors.AotxError) -> tuple[int, dict[str, Any]] | None:
    """The OpenAI status and body of a wrong field or an unknown model (None: the
    shared status, body reshaped by :func:`openai_body`)."""
    if exc.code in ("unknown_model", "model_not_found"):   # the runtime's, or ours
        return 404, openai_body(404, {"code": "model_not_found", "message": exc.message},
                                "model")
    if isinstance(exc, errors.InvalidParams):
        code, param = str(exc.fields["rule"]), str(exc.fields["param"])
    elif isinstance(exc, errors.InvalidInput):
        code, param = exc.code, str(exc.fields.get("field") or "")
    else:
        return None
    extra = {k: v for k, v in exc.fields.items() if k not in ("rule", "param", "field")}
    return 400, openai_body(400, {"code": code, "message": exc.message, **extra}, param)


def openai_body(status: int, error: dict[str, Any], param: str | None = None,
                ) -> dict[str, Any]:
    """OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}`` of a
    shared envelope's ``error`` object: the code in the ``/v1`` vocabulary, ``param``
    null for none, the envelope's other fields (``limit``, ``offset``,
    ``retry_after``...) kept."""
    rest = {k: v for k, v in error.items() if k not in ("code", "message", "param")}
    code = str(error.get("code") or "")
    return {"error": {"message": str(error.get("message") or ""),
                      "type": OPENAI_TYPES.get(status, "invalid_request_error"),
                      "param": param or None, "code": OPENAI_CODES.get(code, code),
                      **rest}}


def render(exc: BaseException, dialect: Dialect = "shared",
           retry_after_s: int = DEFAULT_RETRY_AFTER_S, limit: int | None = None) -> Parts:
    """(status, body, extra headers) of any exception in ``dialect``; ``limit`` is the
    body limit a werkzeug 413 names."""
    own = None
    if isinstance(exc, errors.AotxError):
        own = _openai(exc) if dialect == "openai" else None
        status, body, headers = (*own, {}) if own else errors.http_parts(exc, retry_after_s)
    elif isinstance(exc, HTTPException):
        status, body, headers = http_error_parts(exc, limit)
    else:
        log.error("unhandled error", exc_info=exc)
        if dialect != "openai":
            return 500, INTERNAL_ERROR, {}
        status, body, headers = 500, INTERNAL_ERROR, {}
    if dialect == "router":
        body = {"ok": False, **body}
    elif dialect == "openai" and not own:
        body = openai_body(status, body["error"])
    return status, body, headers


def event_body(exc: errors.AotxError, dialect: Dialect = "shared") -> dict[str, Any]:
    """The error body a stream ends with (no HTTP: no ``retry_after``)."""
    if dialect != "openai":
        return exc.envelope()
    own = _openai(exc)
    return own[1] if own else openai_body(exc.status, exc.envelope()["error"])


def http_error_parts(exc: HTTPException, limit: int | None = None) -> Parts:
    """(status, envelope, extra headers) of a werkzeug HTTP exception; ``limit`` is the
    body limit a 413 names."""
    status = exc.code or 500
    code = _HTTP_CODES.get(status, f"http_{status}")
    message = {
        404: "no such route or resource",
        405: "method not allowed on this route",
        413: "request body is over the configured limit",
    }.get(status, exc.description or exc.name)
    body: dict[str, Any] = {"code": code, "message": message}
    if status == 413 and limit is not None:
        body["limit"] = limit
    headers: dict[str, str] = {}
    if status == 405:
        allow = getattr(exc, "valid_methods", None)
        if allow:
            headers["Allow"] = ", ".join(sorted(allow))
    return status, {"error": body}, headers


def respond(exc: BaseException, dialect: Dialect = "shared") -> Response:
    """:func:`render` as a Quart response, with the app's ``limits.retry_after_s`` and
    body limit."""
    config = current_app.config if has_app_context() else {}
    status, body, headers = render(
        exc, dialect, int(config.get("AOTX_RETRY_AFTER_S", DEFAULT_RETRY_AFTER_S)),
        config.get("MAX_CONTENT_LENGTH"))
    return json_response(body, status, headers)
