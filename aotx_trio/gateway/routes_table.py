"""Every route of the gateway, defined once, and the one admit step before each.

:data:`ROUTES` is the one table: per row the endpoint, method and path (werkzeug
syntax; ``<name>`` is one path segment, ``<path:name>`` may hold slashes), the
gateway actions (any one suffices; none: any valid token), the rate bucket, the body
limit, the error dialect, and for the sequenced mutations of the shared API the
device's operation kind and the body model.  The surfaces:

* the shared-conversations API under :data:`BASE` (reads ``shared_read``;
  registering, creating and retiring ``shared_write``; membership and publications
  ``shared_manage``; ``capabilities`` any valid token; ``POST /media`` its own body
  limit, ``limits.max_media_bytes``);
* the OpenAI-compatible ``/v1`` routes (the ``v1`` bucket, ``limits.v1_*``, and
  OpenAI's error shape);
* ``GET /metrics`` (``metrics_read``);
* the serving router (``/models``, ``/aliases``, ``/scratch-sessions``: reads
  ``models_read``, invokes ``models_invoke`` with the router's ``"ok": false``
  envelope) and the webhook routes (``webhooks_manage``).

Every request of a row runs :class:`Admission` first, once (the Quart app's
``before_request``; the ASGI fast path itself): the bearer token (401), the
principal's rate in the row's bucket (429 ``over_quota``,
:mod:`aotx_trio.gateway.quota`), a declared ``Content-Length`` over the row's body
limit (413), the row's action (403); then the handler, whose view the app
registers from this table by endpoint (one ``VIEWS`` map per handler module).  A
request under :data:`BASE` that matches no row is admitted too (no action), so a
bad token is 401 before a 404 or 405.  Errors are rendered once, at the edge, in
the row's dialect (:func:`aotx_trio.gateway.errors.render`); a path under a router
prefix that matches no row answers that prefix's not-found code (:func:`unrouted`).

Both ways a mutation can be answered run the same functions, in the same order:
the Quart views generated from the rows with a kind
(:mod:`aotx_trio.gateway.shared_routes`), and the ASGI fast path
(:mod:`aotx_trio.gateway.fast`), which finds the row with :func:`match` (a matcher
compiled from the same rows).  After admission: the body read by the caller's own
transport, then :func:`submit` (strict UTF-8 and JSON: 400; ``schema``: 400; the
model: 422; submit and wait for the save: 202, or 200 for an exact retry) and
:func:`encode` for the bytes out (``application/json``, ``Cache-Control:
no-store``, ``Location`` of the operation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from werkzeug.exceptions import NotFound

from aotx_trio import errors
from aotx_trio.errors import BadRequest, BodyTooLarge
from aotx_trio.gateway import bodies
from aotx_trio.gateway.auth import Authenticator, Principal
from aotx_trio.gateway.errors import Dialect, dumps
from aotx_trio.gateway.quota import Holdings, RateLimiter
from aotx_trio.service.client import DeviceClient
from aotx_trio.vocab import BASE_PATH, SCHEMA

BASE = BASE_PATH
V1 = "/v1"      # the OpenAI-compatible routes (all in the ``openai`` dialect)
Bucket = Literal["requests", "v1"]     # limits.requests_per_second / v1_requests_per_second
BodyLimit = Literal["body", "media"]   # limits.max_body_bytes / max_media_bytes


@dataclass(frozen=True, slots=True)
class Route:
    """One row of the route table (see the module doc)."""

    endpoint: str                    # the Quart endpoint name (and the view's key)
    method: str
    path: str                        # werkzeug rule, the whole path
    actions: tuple[str, ...]         # any one suffices; (): any valid token
    bucket: Bucket = "requests"
    body: BodyLimit = "body"
    dialect: Dialect = "shared"
    kind: str | None = None          # a sequenced mutation: the device's operation kind
    model: type[bodies.Mutation] | None = None   # ... and its body


def _read(endpoint: str, rule: str, action: str | None = "shared_read") -> Route:
    return Route(endpoint, "GET", BASE + rule, (action,) if action else ())


def _mutation(endpoint: str, rule: str, kind: str, action: str,
              model: type[bodies.Mutation]) -> Route:
    return Route(endpoint, "POST", BASE + rule, (action,), kind=kind, model=model)


def _router(endpoint: str, method: str, path: str) -> Route:
    invoke = method == "POST"
    return Route(endpoint, method, path, ("models_invoke" if invoke else "models_read",),
                 dialect="router" if invoke else "shared")


def _webhooks(endpoint: str, method: str, path: str) -> Route:
    return Route(endpoint, method, path, ("webhooks_manage",))


ROUTES: tuple[Route, ...] = (
    # the shared-conversations API: reads
    _read("capabilities", "/capabilities", None),
    _read("participant_get", "/participant"),
    _read("spaces_list", "/spaces"),
    _read("space_get", "/spaces/<space>"),
    _read("members_list", "/spaces/<space>/members"),
    _read("conversations_list", "/spaces/<space>/conversations"),
    _read("conversation_get", "/conversations/<conversation>"),
    _read("memory_list", "/spaces/<space>/memory"),
    _read("memory_get", "/spaces/<space>/memory/<object>"),
    _read("operation_get", "/operations/<operation>"),
    _read("operation_result", "/operations/<operation>/result"),
    _read("conversation_events", "/conversations/<conversation>/events"),
    _read("operation_events", "/operations/<operation>/events"),
    # the shared-conversations API: sequenced mutations (the fast path's rows)
    _mutation("participant_register", "/participant", "participant.register",
              "shared_write", bodies.RegisterParticipant),
    _mutation("space_create", "/spaces", "space.create", "shared_write", bodies.CreateSpace),
    _mutation("member_set", "/spaces/<space>/members", "member.set", "shared_manage",
              bodies.SetMember),
    _mutation("conversation_create", "/spaces/<space>/conversations",
              "conversation.create", "shared_write", bodies.CreateConversation),
    _mutation("participant_retire", "/participant/retirements", "participant.retire",
              "shared_write", bodies.Retirement),
    _mutation("input_create", "/conversations/<conversation>/inputs", "input",
              "shared_write", bodies.CreateInput),
    _mutation("cancellation_create", "/participant/cancellations", "cancellation",
              "shared_write", bodies.Cancellation),
    _mutation("publication_create", "/spaces/<space>/publications", "publication",
              "shared_manage", bodies.Publication),
    Route("media_upload", "POST", BASE + "/media", ("shared_write",), body="media"),
    # OpenAI-compatible
    Route("v1_chat", "POST", "/v1/chat/completions", ("models_invoke",), bucket="v1",
          dialect="openai"),
    Route("v1_embeddings", "POST", "/v1/embeddings", ("models_invoke",), bucket="v1",
          dialect="openai"),
    Route("v1_models", "GET", "/v1/models", ("models_read", "models_invoke"), bucket="v1",
          dialect="openai"),
    Route("v1_model", "GET", "/v1/models/<path:model>", ("models_read", "models_invoke"),
          bucket="v1", dialect="openai"),
    Route("v1_completions", "POST", "/v1/completions", ("models_invoke",), bucket="v1",
          dialect="openai"),
    # metrics
    Route("metrics", "GET", "/metrics", ("metrics_read",)),
    # the serving router
    _router("router_models", "GET", "/models"),
    _router("router_model", "GET", "/models/<path:target>"),
    _router("router_invoke", "POST", "/models/<path:target>/invoke"),
    _router("router_alias", "GET", "/aliases/<path:name>"),
    _router("router_sessions", "GET", "/scratch-sessions"),
    _router("router_session", "GET", "/scratch-sessions/<session_id>"),
    _router("router_scratch_invoke", "POST", "/scratch-sessions/<session_id>/invoke"),
    # webhooks
    _webhooks("webhooks_create", "POST", "/webhooks"),
    _webhooks("webhooks_list", "GET", "/webhooks"),
    _webhooks("webhooks_signing_key", "GET", "/webhooks/signing-key"),
    _webhooks("webhooks_disable", "DELETE", "/webhooks/<uuid>"),
)

BY_ENDPOINT: dict[str, Route] = {r.endpoint: r for r in ROUTES}
#: the rows with their own body limit, by method and (fixed) path
_OWN_LIMIT: dict[tuple[str, str], BodyLimit] = {(r.method, r.path): r.body for r in ROUTES
                                               if r.body != "body"}
assert not any("<" in path for _, path in _OWN_LIMIT), "a body limit by a fixed path"


def body_limit(limits: Mapping[str, int], method: str, path: str) -> int:
    """The body limit (bytes) of a request by its method and path: its row's, out of
    ``limits`` (by :data:`BodyLimit`)."""
    return limits[_OWN_LIMIT.get((method, path), "body")]
MUTATION_ROUTES: tuple[Route, ...] = tuple(r for r in ROUTES if r.kind is not None)

#: a request under BASE that matches no row: admitted (token, rate, body), no action
UNROUTED = Route("", "", BASE, ())

#: unmatched paths under a router prefix answer that prefix's not-found code
NOT_FOUND_CODES = (("/models/", "model_not_found"), ("/aliases/", "alias_unresolved"),
                   ("/scratch-sessions/", "scratch_not_found"))


def route_of(endpoint: str | None, path: str) -> Route | None:
    """The row a routed request matched (``endpoint``), :data:`UNROUTED` for another
    path under :data:`BASE`, else None."""
    if endpoint is not None and endpoint in BY_ENDPOINT:
        return BY_ENDPOINT[endpoint]
    return UNROUTED if path == BASE or path.startswith(BASE + "/") else None


def dialect_of(path: str, method: str | None = None) -> Dialect:
    """The error dialect of a request path before or without routing: its row's
    (:func:`row_of`), ``openai`` for any other path under ``/v1``, else ``shared``."""
    row = row_of(path, method)
    if row is not None:
        return row[0].dialect
    return "openai" if path == V1 or path.startswith(V1 + "/") else "shared"


def unrouted(exc: Exception, path: str) -> Exception:
    """Quart's 404 for a path under a router prefix is that prefix's not-found code."""
    if isinstance(exc, NotFound):
        for prefix, code in NOT_FOUND_CODES:
            if path.startswith(prefix):
                return errors.NotFound("no such target", code=code)
    return exc


# --------------------------------------------------------------------------- matching


class _Matcher:
    """The rows of a route table by request path, as werkzeug would route them: a
    ``<name>`` part is one non-empty segment without ``/``; nothing else matches."""

    def __init__(self, routes: tuple[Route, ...]) -> None:
        self.fixed: dict[str, Route] = {}
        self.param: list[tuple[str, str, str, Route]] = []
        for route in routes:
            path = route.path
            head, lt, rest = path.partition("<")
            if not lt:
                self.fixed[path] = route
                continue
            name, gt, tail = rest.partition(">")
            if not gt or "<" in tail or ":" in name or not head.endswith("/") \
                    or (tail and not tail.startswith("/")):
                raise ValueError(f"unsupported rule {route.path!r}")
            self.param.append((head, name, tail, route))

    def __call__(self, path: str) -> tuple[Route, dict[str, str]] | None:
        route = self.fixed.get(path)
        if route is not None:
            return route, {}
        for head, name, tail, route in self.param:
            if path.startswith(head) and path.endswith(tail):
                value = path[len(head):len(path) - len(tail)]
                if value and "/" not in value:
                    return route, {name: value}
        return None


match = _Matcher(MUTATION_ROUTES)
"""``match(path)``: the mutation row of a request path and its path parameters, or None."""


def _pattern(route: Route) -> tuple[re.Pattern[str], str, Route]:
    """A row's rule as a regex over paths, its label (``<x>`` -> ``{x}``) and the row."""
    regex, label = "", ""
    for literal, name in re.findall(r"([^<]*)(?:<([^>]*)>)?", route.path):
        regex += re.escape(literal)
        label += literal
        if name:
            kind, _, name = name.rpartition(":")
            regex += ".+" if kind == "path" else "[^/]+"
            label += "{" + name + "}"
    return re.compile(regex + r"\Z"), label, route


#: every row, the rows with more literal text first (a router ``.../invoke`` row
#: before the row whose ``<path:...>`` would take its paths too)
_PATTERNS = [_pattern(r) for r in sorted(
    ROUTES, key=lambda r: -len(re.sub(r"<[^>]*>", "", r.path)))]


def row_of(path: str, method: str | None = None) -> tuple[Route, str] | None:
    """The row a request path belongs to, whatever its method (with ``method``: that
    method's row when the path has several) and the row's rule as a label (``{x}``
    for each path parameter); None for a path no row matches.  For labels and error
    dialects before routing (metrics, the framing guard); werkzeug routes requests."""
    found = None
    for pattern, label, route in _PATTERNS:
        if pattern.match(path):
            if method is None or route.method == method:
                return route, label
            found = found or (route, label)
    return found


# --------------------------------------------------------------------------- the steps


@dataclass(frozen=True)
class Admission:
    """The one admit step (see the module doc): the authenticator, a rate limiter per
    bucket (None: no limit) and the byte count of each body limit."""

    auth: Authenticator
    rates: Mapping[str, RateLimiter | None]
    limits: Mapping[str, int]
    holdings: Holdings | None = None

    def __call__(self, route: Route, authorization: str | None,
                 length: int | None, content_type: str | None = None,
                 scope: Any = None) -> Principal:
        """The principal of a request of ``route``: 401, 429 (its rate, then what it
        holds at once: :class:`~aotx_trio.gateway.quota.Holdings`, on the request's ASGI
        ``scope``), 413, 403, then 415 for a JSON row whose body is declared as another
        ``Content-Type`` (none declared: read as JSON), in this order."""
        principal = self.auth.authenticate(authorization)
        rate = self.rates.get(route.bucket)
        if rate is not None:
            rate.take(principal.name)
        if self.holdings is not None:
            self.holdings.enter(principal.name, scope)
        limit = self.limits[route.body]
        if length is not None and length > limit:
            raise BodyTooLarge(f"request body of {length} bytes is over the limit of "
                               f"{limit}", limit=limit)
        if route.actions and not set(route.actions) & set(principal.actions):
            principal.require(route.actions[-1])
        if content_type is not None and route.method == "POST" and route.body == "body" \
                and content_type.partition(";")[0].strip().lower() != "application/json":
            raise errors.UnsupportedMediaType(
                "a JSON body needs Content-Type: application/json",
                content_type=content_type[:80])
        return principal


MAX_DEPTH = 16          # nesting of arrays and objects in a body
MAX_INT_DIGITS = 40     # integers in a body (u64 counters travel as strings)


def _nesting(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside strings (a cheap pre-check: a body
    with few brackets is never scanned)."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits)} digits")
    return int(digits)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key[:80]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (two readers may keep either)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


#: a key of a JSON text without backslashes: in such a text every string is a run of
#: non-quote bytes, so scanning left to right never starts inside one
_KEY = re.compile(rb'"([^"]*)"\s*:')


def keys_unique(raw: bytes) -> bool:
    """Whether no key repeats in ``raw``, a JSON text without backslashes and without
    nested objects (a body :func:`parse_body` took in one pass)."""
    keys = _KEY.findall(raw)
    return len(keys) == len(set(keys))


def decode_json(raw: bytes) -> Any:
    """Strict UTF-8 then JSON; 400 ``invalid_utf8`` / ``malformed_json`` with the offset;
    a key twice in one object is 400 ``malformed_json`` naming it.
    Depth (``MAX_DEPTH``) and integer size (``MAX_INT_DIGITS``) are bounded before
    anything is built, so no body can cost a deep recursion or a huge conversion."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest(f"request body is not valid UTF-8 at byte offset {exc.start}",
                         code="invalid_utf8", offset=exc.start) from exc
    if _nesting(text) > MAX_DEPTH:
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels",
                         code="malformed_json", limit=MAX_DEPTH)
    try:
        return json.loads(text, parse_int=_bounded_int, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc.msg} at character {exc.pos}",
                         code="malformed_json", offset=exc.pos) from exc
    except _DuplicateKey as exc:
        raise BadRequest(f"request body names the key {exc.key!r} twice in one object",
                         code="malformed_json", key=exc.key) from exc
    except ValueError as exc:   # _bounded_int
        raise BadRequest(f"request body holds {exc}: at most {MAX_INT_DIGITS} digits",
                         code="malformed_json", limit=MAX_INT_DIGITS) from exc


def _closed(schema: dict[str, Any]) -> bool:
    """A JSON-schema property that only takes ASCII text of a pattern or a constant
    (or null, or a list of those)."""
    if "anyOf" in schema:
        return all(_closed(s) for s in schema["anyOf"])
    kind = schema.get("type")
    if kind == "null":
        return True
    if kind == "array":
        return _closed(schema.get("items", {}))
    return kind == "string" and any(k in schema for k in ("pattern", "const", "enum"))


def one_pass(model: type[bodies.Mutation]) -> bool:
    """Whether every field of ``model`` is :func:`_closed` (see :func:`parse_body`)."""
    return all(_closed(p) for p in model.model_json_schema()["properties"].values())


def parse_body(model: type[bodies.Mutation], raw: bytes) -> dict[str, Any]:
    """The body bytes as ``model``, dumped by alias.  For a model whose fields all
    take only patterned or constant text (:func:`one_pass`, decided once per model) a
    good body is parsed and validated in one pydantic pass over the bytes; any body
    that pass refuses, and every body of the other models (free text, numbers:
    :func:`decode_json` bounds their depth and integer size first), goes through
    :func:`decode_json` and :func:`validate`, whose errors (and their order: 400
    before 422) are the API's.  The one pass accepts exactly what those two accept:
    a body it takes is ASCII JSON of bounded depth without numbers, which
    ``json.loads`` reads alike; one with a backslash (an escape could spell a key
    twice) or a repeated key (:func:`keys_unique`) goes the long way, which refuses
    repeated keys."""
    fast = _ONE_PASS.get(model)
    if fast is None:
        fast = _ONE_PASS[model] = one_pass(model)
    if fast and b"\\" not in raw:
        try:
            body = model.model_validate_json(raw)
        except ValidationError:
            pass
        else:
            if keys_unique(raw):
                return body.model_dump(by_alias=True)
    return validate(model, decode_json(raw)).model_dump(by_alias=True)


_ONE_PASS: dict[type[bodies.Mutation], bool] = {}


def validate(model: type[bodies.Mutation], data: Any) -> bodies.Mutation:
    """The body as ``model``: 400 for a non-object or a missing or wrong ``schema``,
    422 (naming the field) for anything else."""
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object", code="malformed_json")
    if "schema" not in data:
        raise BadRequest(f"missing field 'schema' (must be {SCHEMA!r})",
                         code="schema_invalid", field="schema", expected=SCHEMA)
    if data["schema"] != SCHEMA:
        raise BadRequest(f"schema must be {SCHEMA!r}", code="schema_invalid",
                         field="schema", expected=SCHEMA)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if first["type"] == "extra_forbidden":
            raise errors.InvalidInput(f"unknown field {field!r}", code="unknown_field",
                                      field=field) from exc
        if first["type"] == "missing":
            raise errors.InvalidInput(f"missing field {field!r}", code="missing_field",
                                      field=field) from exc
        raise errors.InvalidInput(f"field {field!r}: {first['msg']}", field=field) from exc


async def submit(client: DeviceClient, principal: Principal, route: Route,
                 params: dict[str, str], read_body: Callable[[], Awaitable[bytes]],
                 ) -> tuple[int, dict[str, Any] | bytes, dict[str, str]]:
    """A mutation row after :class:`Admission`: the body (read by the caller's
    transport), parsed and validated, submitted, and the wait for its save: (status,
    receipt, headers); 202 for a new (saved) admission, 200 for an exact retry.  The
    receipt is a dict or, from the in-process client, already its JSON bytes
    (:meth:`aotx_trio.service.client.DeviceClient.submit_json`)."""
    assert route.kind is not None and route.model is not None, route.endpoint
    body = parse_body(route.model, await read_body())
    body.update(params)
    receipt, created, operation = await client.submit_json(principal.name, principal.actions,
                                                           route.kind, body)
    return (202 if created else 200, receipt,
            {"Location": f"{BASE}/operations/{operation}"})


def encode(body: Any, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """The bytes and headers of a JSON answer of the mutation routes (as
    :func:`aotx_trio.gateway.errors.json_response` renders every other answer; a
    body given as bytes is JSON already); the transport adds ``Content-Length``."""
    data = body if isinstance(body, bytes) else dumps(body).encode("utf-8")
    return data, {"Content-Type": "application/json", "Cache-Control": "no-store", **headers}
