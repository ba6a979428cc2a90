"""The mutation routes of the shared-conversations API, defined once.

:data:`MUTATION_ROUTES` is the one table of the sequenced mutation routes:
path rule (werkzeug syntax, below :data:`BASE`), device kind, gateway action
and body model.  Both ways a mutation can be answered are generated from it
and run the same functions, in the same order:

* the Quart blueprint (:mod:`aotx_trio.gateway.shared_routes`) registers one
  view per row; the app's ``before_request`` calls :func:`admit`;
* the ASGI fast path (:mod:`aotx_trio.gateway.fast`) finds the row with
  :func:`match` (a matcher compiled from the same rules) and calls
  :func:`admit` itself.

The steps: :func:`admit` (token: 401; ``Content-Length`` over the limit: 413),
the row's action (403), the body read by the caller's own transport, then
:func:`submit` (strict UTF-8 and JSON: 400; ``schema``: 400; the model: 422;
submit and wait for the save: 202, or 200 for an exact retry) and
:func:`encode` for the bytes out (``application/json``, ``Cache-Control:
no-store``, ``Location`` of the operation).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from aotx_trio import errors
from aotx_trio.errors import BadRequest, BodyTooLarge
from aotx_trio.gateway import bodies as models
from aotx_trio.gateway.auth import Authenticator, Principal
from aotx_trio.gateway.errors import dumps
from aotx_trio.gateway.quota import RateLimiter
from aotx_trio.service.client import DeviceClient
from aotx_trio.vocab import BASE_PATH, SCHEMA

BASE = BASE_PATH


@dataclass(frozen=True, slots=True)
class MutationRoute:
    """One sequenced mutation route: ``POST BASE + rule``."""

    endpoint: str                  # the Quart endpoint name
    rule: str                      # below BASE; ``<name>`` is one path segment
    kind: str                      # the device's operation kind
    action: str                    # the gateway action it needs
    model: type[models.Mutation]   # the body


MUTATION_ROUTES: tuple[MutationRoute, ...] = (
    MutationRoute("participant_register", "/participant", "participant.register",
                  "shared_write", models.RegisterParticipant),
    MutationRoute("space_create", "/spaces", "space.create", "shared_write",
                  models.CreateSpace),
    MutationRoute("member_set", "/spaces/<space>/members", "member.set", "shared_manage",
                  models.SetMember),
    MutationRoute("conversation_create", "/spaces/<space>/conversations",
                  "conversation.create", "shared_write", models.CreateConversation),
    MutationRoute("participant_retire", "/participant/retirements", "participant.retire",
                  "shared_write", models.Retirement),
    MutationRoute("input_create", "/conversations/<conversation>/inputs", "input",
                  "shared_write", models.CreateInput),
    MutationRoute("cancellation_create", "/participant/cancellations", "cancellation",
                  "shared_write", models.Cancellation),
    MutationRoute("publication_create", "/spaces/<space>/publications", "publication",
                  "shared_manage", models.Publication),
)


# --------------------------------------------------------------------------- matching


class _Matcher:
    """The rows of a route table by request path, as werkzeug would route them: a
    ``<name>`` part is one non-empty segment without ``/``; nothing else matches."""

    def __init__(self, routes: tuple[MutationRoute, ...]) -> None:
        self.fixed: dict[str, MutationRoute] = {}
        self.param: list[tuple[str, str, str, MutationRoute]] = []
        for route in routes:
            path = BASE + route.rule
            head, lt, rest = path.partition("<")
            if not lt:
                self.fixed[path] = route
                continue
            name, gt, tail = rest.partition(">")
            if not gt or "<" in tail or not head.endswith("/") \
                    or (tail and not tail.startswith("/")):
                raise ValueError(f"unsupported rule {route.rule!r}")
            self.param.append((head, name, tail, route))

    def __call__(self, path: str) -> tuple[MutationRoute, dict[str, str]] | None:
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


# --------------------------------------------------------------------------- the steps


def admit(auth: Authenticator, authorization: str | None, length: int | None,
          max_body_bytes: int, rate: RateLimiter | None = None) -> Principal:
    """The checks before any route of the API: the bearer token (401), the principal's
    request rate (429 ``over_quota``, :mod:`aotx_trio.gateway.quota`), then a declared
    ``Content-Length`` over the limit (413)."""
    principal = auth.authenticate(authorization)
    if rate is not None:
        rate.take(principal.name)
    if length is not None and length > max_body_bytes:
        raise BodyTooLarge(f"request body of {length} bytes is over the limit of "
                           f"{max_body_bytes}", limit=max_body_bytes)
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


def decode_json(raw: bytes) -> Any:
    """Strict UTF-8 then JSON; 400 ``invalid_utf8`` / ``malformed_json`` with the offset.
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
        return json.loads(text, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise BadRequest(f"request body is not JSON: {exc.msg} at character {exc.pos}",
                         code="malformed_json", offset=exc.pos) from exc
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


def one_pass(model: type[models.Mutation]) -> bool:
    """Whether every field of ``model`` is :func:`_closed` (see :func:`parse_body`)."""
    return all(_closed(p) for p in model.model_json_schema()["properties"].values())


def parse_body(model: type[models.Mutation], raw: bytes) -> dict[str, Any]:
    """The body bytes as ``model``, dumped by alias.  For a model whose fields all
    take only patterned or constant text (:func:`one_pass`, decided once per model) a
    good body is parsed and validated in one pydantic pass over the bytes; any body
    that pass refuses, and every body of the other models (free text, numbers:
    :func:`decode_json` bounds their depth and integer size first), goes through
    :func:`decode_json` and :func:`validate`, whose errors (and their order: 400
    before 422) are the API's.  The one pass accepts exactly what those two accept:
    a body it takes is ASCII JSON of bounded depth without numbers, which
    ``json.loads`` reads alike (duplicate keys: the last one wins in both)."""
    fast = _ONE_PASS.get(model)
    if fast is None:
        fast = _ONE_PASS[model] = one_pass(model)
    if fast:
        try:
            return model.model_validate_json(raw).model_dump(by_alias=True)
        except ValidationError:
            pass
    return validate(model, decode_json(raw)).model_dump(by_alias=True)


_ONE_PASS: dict[type[models.Mutation], bool] = {}


def validate(model: type[models.Mutation], data: Any) -> models.Mutation:
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


async def submit(client: DeviceClient, principal: Principal, route: MutationRoute,
                 params: dict[str, str], read_body: Callable[[], Awaitable[bytes]],
                 ) -> tuple[int, dict[str, Any] | bytes, dict[str, str]]:
    """The route after :func:`admit`: its action (403), then the body (read by the
    caller's transport), parsed and validated, submitted, and the wait for its save:
    (status, receipt, headers); 202 for a new (saved) admission, 200 for an exact
    retry.  The receipt is a dict or, from the in-process client, already its JSON
    bytes (:meth:`aotx_trio.service.client.DeviceClient.submit_json`)."""
    principal.require(route.action)
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
