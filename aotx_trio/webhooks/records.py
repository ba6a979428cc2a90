"""The subscription document (docs/formats/registry.md, "Webhook subscriptions")."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from aotx_trio.identity import Doc
from aotx_trio.registry.feed import EVENT_TYPES
from aotx_trio.registry.records import parse

#: the body's ``schema`` (docs/webhooks.md, "What a post looks like")
BODY_SCHEMA = 1
BODY_FIELDS = ("type", "subject", "at", "object_sha256", "operation_id", "payload")


class Subscription(Doc):
    uuid: str
    url: str
    #: ``"*"`` or the event types delivered (the others still advance the cursor)
    events: Literal["*"] | list[str]
    created_at: str
    #: the principal that registered it (None: registered before owners were kept)
    owner: str | None = None
    state: Literal["active", "disabled"] = "active"
    why: str | None = None
    disabled_at: str | None = None
    #: the feed position: every event with seq <= cursor is delivered or skipped
    cursor: int = Field(ge=0)
    #: the ``at`` of the event at the cursor (None: none passed yet)
    cursor_at: str | None = None
    #: when a consumer last answered a post with a 2xx
    last_delivered_at: str | None = None

    def wants(self, event_type: str) -> bool:
        return self.events == "*" or event_type in self.events

    def public(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def load(body: bytes, uuid: str) -> Subscription:
    return parse(Subscription, body, f"webhooks/{uuid}")


def post_body(event: dict[str, Any]) -> dict[str, Any]:
    """The POST body of one feed event: the seed's fields (no ``seq``)."""
    return {"schema": BODY_SCHEMA, **{k: event[k] for k in BODY_FIELDS}}


def check_events(value: Any) -> Literal["*"] | list[str]:
    """``events`` of a registration (422 ``invalid_params`` naming ``events[i]``)."""
    from aotx_trio.errors import InvalidInput

    def bad(param: str, rule: str, message: str) -> InvalidInput:
        return InvalidInput(message, code="invalid_params", param=param, rule=rule)

    if value is None or value == "*":
        return "*"
    if not isinstance(value, list) or not value:
        raise bad("events", "type", 'events must be "*" or a non-empty list of event types')
    out: list[str] = []
    for i, t in enumerate(value):
        if not isinstance(t, str) or t not in EVENT_TYPES:
            raise bad(f"events[{i}]", "enum", f"events[{i}] is not an event type (one of "
                      f"{', '.join(EVENT_TYPES)})")
        if t in out:
            raise bad(f"events[{i}]", "duplicate", f"events[{i}] repeats {t}")
        out.append(t)
    return out
