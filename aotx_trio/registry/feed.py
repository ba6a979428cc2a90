"""The event feed: which event each durable change appends, the rescan heal, retention.

Object first, then event; the two are not one transaction.  :func:`append_for`
derives the event from the object's stored bytes (so the same change always has
the same ``operation_id``), :func:`heal` re-derives the event of every object's
latest change and appends the ones the retained feed lacks at its head, with
``at`` = the heal time and ``payload.healed: true``.  docs/formats/registry.md.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio

from aotx_trio.errors import AotxError
from aotx_trio.identity import Doc, canonical, sha256_hex
from aotx_trio.registry.records import (
    Alias,
    Deployment,
    ModelState,
    Published,
    Release,
    ReleaseState,
    Removed,
    parse,
    parse_time,
    rfc3339,
)
from aotx_trio.registry.store import StoreBackend

log = logging.getLogger("aotx.router.feed")

RETENTION_S = 90 * 86400.0
RESCAN_INTERVAL_S = 3600.0

EVENT_TYPES = ("model.published", "model.unpublished", "model.state_changed",
               "release.minted", "release.deployed", "release.state_changed", "alias.moved")



@dataclass(frozen=True)
class Rule:
    """The event a change of one collection's document appends."""

    kind: str
    doc: type[Doc]
    subject: str            # the document field naming the subject
    payload: tuple[str, ...]  # the document fields (or properties) in the payload
    changed: str            # the document field holding the change's own time


RULES: dict[str, Rule] = {
    "published": Rule("model.published", Published, "model_id",
                      ("release", "model_type", "manifest_sha256"), "published_at"),
    "removed": Rule("model.unpublished", Removed, "model_id", ("reason",), "removed_at"),
    "model_states": Rule("model.state_changed", ModelState, "model_id",
                         ("state", "successor_id"), "changed_at"),
    "releases": Rule("release.minted", Release, "name",
                     ("artifact_sha256", "descriptor_sha256", "source_commit"), "minted_at"),
    "deployments": Rule("release.deployed", Deployment, "release", ("runtime",),
                        "deployed_at"),
    "release_states": Rule("release.state_changed", ReleaseState, "name",
                           ("state", "successor"), "changed_at"),
    "aliases": Rule("alias.moved", Alias, "name", ("target", "level"), "set_at"),
}


def operation_id(kind: str, subject: str, object_sha256: str) -> str:
    """Deterministic for the same state change (docs/formats/registry.md)."""
    return "op_" + sha256_hex(f"{kind}\n{subject}\n{object_sha256}".encode())[:32]


def _event(coll: str, key: str, body: bytes, at: float, healed: bool,
           ) -> tuple[bytes, str, float]:
    """(event bytes without seq, operation id, the change's own time)."""
    rule = RULES[coll]
    doc: Doc = parse(rule.doc, body, f"{coll}/{key}")
    obj = sha256_hex(body)
    subject = str(getattr(doc, rule.subject))
    op = operation_id(rule.kind, subject, obj)
    pay: dict[str, Any] = {name: getattr(doc, name) for name in rule.payload}
    if healed:
        pay["healed"] = True
    event = {"type": rule.kind, "subject": subject, "at": rfc3339(at), "object_sha256": obj,
             "operation_id": op, "payload": pay}
    return canonical(event), op, parse_time(str(getattr(doc, rule.changed)))


def append_for(store: StoreBackend, coll: str, key: str, body: bytes, now: float,
               ) -> int | None:
    """Append the event of the change that just wrote ``body`` to ``coll/key``."""
    event, op, _ = _event(coll, key, body, now, healed=False)
    return store.feed_append(event, op, now)


def heal(store: StoreBackend, now: float, retention_s: float = RETENTION_S) -> list[int]:
    """Re-emit every missing event of a retained change; the seqs appended."""
    held = store.feed_ops()
    out: list[int] = []
    for coll in RULES:
        for key in store.keys(coll):
            body = store.get(coll, key)
            if body is None:
                continue
            try:
                event, op, changed = _event(coll, key, body, now, healed=True)
            except AotxError as exc:   # a corrupt object: reads report it; nothing to emit
                log.warning("rescan: %s", exc.message)
                continue
            if op in held or changed < now - retention_s:
                continue
            seq = store.feed_append(event, op, now)
            if seq is not None:
                log.warning("rescan: re-emitted %s for %s/%s as seq %d",
                            json.loads(event)["type"], coll, key, seq)
                out.append(seq)
    return out


def trim(store: StoreBackend, now: float, retention_s: float = RETENTION_S) -> int:
    return store.feed_trim(now - retention_s)


async def run_rescan(store: StoreBackend, *, interval_s: float = RESCAN_INTERVAL_S,
                     retention_s: float = RETENTION_S, now: Callable[[], float] | None = None,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Supervised task: heal and trim the feed every ``interval_s`` (first run at start)."""
    clock = now or time.time
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError("rescan interval must be a positive number of seconds")
    task_status.started()
    while True:
        t = clock()
        await trio.to_thread.run_sync(heal, store, t, retention_s)
        await trio.to_thread.run_sync(trim, store, t, retention_s)
        await trio.sleep(interval_s)
