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
from collections.abc import Callable
from typing import Any

import trio

from aotx_trio.errors import AotxError
from aotx_trio.router.records import (
    Alias,
    Deployment,
    Doc,
    ModelState,
    Published,
    Release,
    ReleaseState,
    Removed,
    canonical,
    parse,
    parse_time,
    rfc3339,
    sha256_hex,
)
from aotx_trio.router.store import StoreBackend

log = logging.getLogger("aotx.router.feed")

RETENTION_S = 90 * 86400.0
RESCAN_INTERVAL_S = 3600.0

EVENT_TYPES = ("model.published", "model.unpublished", "model.state_changed",
               "release.minted", "release.deployed", "release.state_changed", "alias.moved")

# collection -> (event type, document class, subject, payload, the change's own time)
_Rule = tuple[str, type[Doc], Callable[[Any], str], Callable[[Any], dict[str, Any]],
              Callable[[Any], str]]
RULES: dict[str, _Rule] = {
    "published": ("model.published", Published, lambda d: d.model_id,
                  lambda d: {"release": d.release, "model_type": d.model_type,
                             "manifest_sha256": d.manifest_sha256},
                  lambda d: d.published_at),
    "removed": ("model.unpublished", Removed, lambda d: d.model_id,
                lambda d: {"reason": d.reason}, lambda d: d.removed_at),
    "model_states": ("model.state_changed", ModelState, lambda d: d.model_id,
                     lambda d: {"state": d.state, "successor_id": d.successor_id},
                     lambda d: d.changed_at),
    "releases": ("release.minted", Release, lambda d: d.name,
                 lambda d: {"artifact_sha256": d.artifact.sha256,
                            "descriptor_sha256": d.descriptor_sha256,
                            "source_commit": d.source_commit},
                 lambda d: d.minted_at),
    "deployments": ("release.deployed", Deployment, lambda d: d.release,
                    lambda d: {"runtime": d.runtime}, lambda d: d.deployed_at),
    "release_states": ("release.state_changed", ReleaseState, lambda d: d.name,
                       lambda d: {"state": d.state, "successor": d.successor},
                       lambda d: d.changed_at),
    "aliases": ("alias.moved", Alias, lambda d: d.name,
                lambda d: {"target": d.target, "level": d.level}, lambda d: d.set_at),
}


def operation_id(kind: str, subject: str, object_sha256: str) -> str:
    """Deterministic for the same state change (docs/formats/registry.md)."""
    return "op_" + sha256_hex(f"{kind}\n{subject}\n{object_sha256}".encode())[:32]


def _event(coll: str, key: str, body: bytes, at: float, healed: bool,
           ) -> tuple[bytes, str, float]:
    """(event bytes without seq, operation id, the change's own time)."""
    kind, cls, subject, payload, changed = RULES[coll]
    doc = parse(cls, body, f"{coll}/{key}")
    obj = sha256_hex(body)
    op = operation_id(kind, subject(doc), obj)
    pay = payload(doc)
    if healed:
        pay["healed"] = True
    event = {"type": kind, "subject": subject(doc), "at": rfc3339(at), "object_sha256": obj,
             "operation_id": op, "payload": pay}
    return canonical(event), op, parse_time(changed(doc))


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
    import time

    clock = now or time.time
    if not (interval_s > 0 and math.isfinite(interval_s)):
        raise ValueError("rescan interval must be a positive number of seconds")
    task_status.started()
    while True:
        t = clock()
        await trio.to_thread.run_sync(heal, store, t, retention_s)
        await trio.to_thread.run_sync(trim, store, t, retention_s)
        await trio.sleep(interval_s)
