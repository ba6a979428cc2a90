"""The PostgreSQL backend of the registry store (docs/formats/registry.md, "PostgreSQL").

psycopg 3 with a psycopg-pool connection pool; every call is blocking (the
registry runs it in a worker thread).  The schema is created on first use.  A
server that cannot be reached is 503 ``not_ready`` with ``missing: "store"``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from aotx_trio.errors import FormatError, NotReady
from aotx_trio.identity import canonical
from aotx_trio.registry.store import COLLECTIONS, Updater

CHUNK = 4 << 20
_SCHEMA_LOCK = 0x616F7478_00000001   # advisory lock ids ("aotx")
_FEED_LOCK = 0x616F7478_00000002
_HOOKS_LOCK = 0x616F7478_00000003

_SCHEMA = """
CREATE TABLE IF NOT EXISTS aotx_registry_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS aotx_objects (coll text NOT NULL, key text NOT NULL,
    body bytea NOT NULL, PRIMARY KEY (coll, key));
CREATE TABLE IF NOT EXISTS aotx_blobs (sha256 text PRIMARY KEY, size bigint NOT NULL);
CREATE TABLE IF NOT EXISTS aotx_blob_chunks (sha256 text NOT NULL, idx integer NOT NULL,
    data bytea NOT NULL, PRIMARY KEY (sha256, idx));
CREATE TABLE IF NOT EXISTS aotx_events (seq bigint PRIMARY KEY,
    operation_id text UNIQUE NOT NULL, at timestamptz NOT NULL, body bytea NOT NULL);
CREATE TABLE IF NOT EXISTS aotx_webhooks (uuid text PRIMARY KEY, body bytea NOT NULL,
    lease_holder text, lease_expires double precision);
INSERT INTO aotx_registry_meta VALUES ('format', '1') ON CONFLICT DO NOTHING;
"""


class PostgresStore:
    """:class:`~aotx_trio.registry.store.StoreBackend` on PostgreSQL."""

    def __init__(self, url: str, *, max_size: int = 8, timeout_s: float = 10.0) -> None:
        self.url = url
        self._pool = ConnectionPool(url, min_size=1, max_size=max_size, timeout=timeout_s,
                                    open=False, name="aotx-registry")
        try:
            self._pool.open(wait=True, timeout=timeout_s)
        except PoolTimeout:
            self._pool.close()
            raise NotReady("the PostgreSQL registry store cannot be reached",
                           missing="store") from None
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            cur.execute(_SCHEMA)
            cur.execute("SELECT value FROM aotx_registry_meta WHERE key = 'format'")
            row = cur.fetchone()
        if row is None or row[0] != "1":
            self._pool.close()
            raise FormatError("the PostgreSQL registry is not of format 1",
                              code="unsupported_registry")

    @contextlib.contextmanager
    def _tx(self) -> Iterator[psycopg.Cursor[tuple[Any, ...]]]:
        """A cursor inside one transaction (committed on a clean exit)."""
        try:
            with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                yield cur
        except (psycopg.OperationalError, PoolTimeout) as exc:
            raise NotReady(f"the PostgreSQL registry store failed: {type(exc).__name__}",
                           missing="store") from None

    @staticmethod
    def _check(coll: str) -> None:
        if coll not in COLLECTIONS:
            raise ValueError(f"unknown collection {coll!r}")

    # ------------------------------------------------------------------ documents

    def get(self, coll: str, key: str) -> bytes | None:
        self._check(coll)
        with self._tx() as cur:
            cur.execute("SELECT body FROM aotx_objects WHERE coll = %s AND key = %s",
                        (coll, key))
            row = cur.fetchone()
        return bytes(row[0]) if row else None

    def put(self, coll: str, key: str, body: bytes) -> None:
        self._check(coll)
        with self._tx() as cur:
            cur.execute("INSERT INTO aotx_objects VALUES (%s, %s, %s) ON CONFLICT (coll, key) "
                        "DO UPDATE SET body = EXCLUDED.body", (coll, key, body))

    def create(self, coll: str, key: str, body: bytes) -> bytes | None:
        self._check(coll)
        with self._tx() as cur:
            cur.execute("INSERT INTO aotx_objects VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                        (coll, key, body))
            if cur.rowcount == 1:
                return None
            cur.execute("SELECT body FROM aotx_objects WHERE coll = %s AND key = %s",
                        (coll, key))
            row = cur.fetchone()
        assert row is not None
        return bytes(row[0])

    def update(self, coll: str, key: str, fn: Updater) -> bytes:
        self._check(coll)
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                        (f"{coll}/{key}",))
            cur.execute("SELECT body FROM aotx_objects WHERE coll = %s AND key = %s "
                        "FOR UPDATE", (coll, key))
            row = cur.fetchone()
            body = fn(bytes(row[0]) if row else None)
            cur.execute("INSERT INTO aotx_objects VALUES (%s, %s, %s) ON CONFLICT (coll, key) "
                        "DO UPDATE SET body = EXCLUDED.body", (coll, key, body))
        return body

    def keys(self, coll: str, prefix: str = "") -> list[str]:
        self._check(coll)
        with self._tx() as cur:
            cur.execute("SELECT key FROM aotx_objects WHERE coll = %s AND starts_with(key, %s) "
                        "ORDER BY key COLLATE \"C\"", (coll, prefix))
            return [str(r[0]) for r in cur.fetchall()]

    # ------------------------------------------------------------------ blobs

    def blob_put(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        tmp = f"tmp-{uuid.uuid4().hex}"
        h = hashlib.sha256()
        size = idx = 0
        with self._tx() as cur:
            buf = bytearray()
            for chunk in [*chunks, b""]:
                buf += chunk
                while len(buf) >= CHUNK or (not chunk and buf):
                    part = bytes(buf[:CHUNK])
                    del buf[:CHUNK]
                    h.update(part)
                    size += len(part)
                    cur.execute("INSERT INTO aotx_blob_chunks VALUES (%s, %s, %s)",
                                (tmp, idx, part))
                    idx += 1
            sha = h.hexdigest()
            cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 1))", (sha,))
            cur.execute("SELECT 1 FROM aotx_blobs WHERE sha256 = %s", (sha,))
            if cur.fetchone():
                cur.execute("DELETE FROM aotx_blob_chunks WHERE sha256 = %s", (tmp,))
            else:
                cur.execute("UPDATE aotx_blob_chunks SET sha256 = %s WHERE sha256 = %s",
                            (sha, tmp))
                cur.execute("INSERT INTO aotx_blobs VALUES (%s, %s)", (sha, size))
        return sha, size

    def blob_size(self, sha256: str) -> int | None:
        with self._tx() as cur:
            cur.execute("SELECT size FROM aotx_blobs WHERE sha256 = %s", (sha256,))
            row = cur.fetchone()
        return int(row[0]) if row else None

    def blob_read(self, sha256: str) -> Iterator[bytes]:
        if self.blob_size(sha256) is None:
            raise KeyError(sha256)
        idx = 0
        while True:
            with self._tx() as cur:
                cur.execute("SELECT data FROM aotx_blob_chunks WHERE sha256 = %s AND idx = %s",
                            (sha256, idx))
                row = cur.fetchone()
            if row is None:
                return
            yield bytes(row[0])
            idx += 1

    # ------------------------------------------------------------------ feed

    def feed_append(self, event: bytes, operation_id: str, at: float) -> int | None:
        when = dt.datetime.fromtimestamp(at, tz=dt.UTC)
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_FEED_LOCK,))
            cur.execute("SELECT 1 FROM aotx_events WHERE operation_id = %s", (operation_id,))
            if cur.fetchone():
                return None
            cur.execute("SELECT coalesce(max(seq), 0) + 1 FROM aotx_events")
            row = cur.fetchone()
            assert row is not None
            seq = int(row[0])
            body = canonical({**json.loads(event), "seq": seq})
            cur.execute("INSERT INTO aotx_events VALUES (%s, %s, %s, %s)",
                        (seq, operation_id, when, body))
        return seq

    def feed_read(self, after: int, limit: int) -> list[bytes]:
        with self._tx() as cur:
            cur.execute("SELECT body FROM aotx_events WHERE seq > %s ORDER BY seq LIMIT %s",
                        (after, limit))
            return [bytes(r[0]) for r in cur.fetchall()]

    def feed_ops(self) -> set[str]:
        with self._tx() as cur:
            cur.execute("SELECT operation_id FROM aotx_events")
            return {str(r[0]) for r in cur.fetchall()}

    def feed_trim(self, before: float) -> int:
        when = dt.datetime.fromtimestamp(before, tz=dt.UTC)
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_FEED_LOCK,))
            cur.execute("DELETE FROM aotx_events WHERE at < %s AND seq < "
                        "(SELECT max(seq) FROM aotx_events)", (when,))
            return int(cur.rowcount)

    def feed_head(self) -> int:
        with self._tx() as cur:
            cur.execute("SELECT coalesce(max(seq), 0) FROM aotx_events")
            row = cur.fetchone()
        assert row is not None
        return int(row[0])

    # ------------------------------------------------------------------ webhooks

    def hook_create(self, uuid: str, body: bytes,
                    admit: Callable[[list[bytes]], None] | None = None) -> bytes | None:
        with self._tx() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (_HOOKS_LOCK,))
            if admit is not None:
                cur.execute("SELECT body FROM aotx_webhooks ORDER BY uuid")
                admit([bytes(r[0]) for r in cur.fetchall()])
            cur.execute("INSERT INTO aotx_webhooks (uuid, body) VALUES (%s, %s) "
                        "ON CONFLICT DO NOTHING", (uuid, body))
            if cur.rowcount == 1:
                return None
            cur.execute("SELECT body FROM aotx_webhooks WHERE uuid = %s", (uuid,))
            row = cur.fetchone()
        assert row is not None
        return bytes(row[0])

    def hook_get(self, uuid: str) -> bytes | None:
        with self._tx() as cur:
            cur.execute("SELECT body FROM aotx_webhooks WHERE uuid = %s", (uuid,))
            row = cur.fetchone()
        return bytes(row[0]) if row else None

    def hook_list(self) -> list[bytes]:
        with self._tx() as cur:
            cur.execute("SELECT body FROM aotx_webhooks ORDER BY uuid")
            return [bytes(r[0]) for r in cur.fetchall()]

    def hook_delete(self, uuid: str) -> None:
        with self._tx() as cur:
            cur.execute("DELETE FROM aotx_webhooks WHERE uuid = %s", (uuid,))

    def hook_update(self, uuid: str, fn: Updater, *, holder: str | None = None,
                    now: float = 0.0) -> bytes | None:
        with self._tx() as cur:
            cur.execute("SELECT body, lease_holder, lease_expires FROM aotx_webhooks "
                        "WHERE uuid = %s FOR UPDATE", (uuid,))
            row = cur.fetchone()
            if row is None:
                raise KeyError(uuid)
            if holder is not None and (row[1] != holder or row[2] is None or row[2] < now):
                return None
            body = fn(bytes(row[0]))
            cur.execute("UPDATE aotx_webhooks SET body = %s WHERE uuid = %s", (body, uuid))
        return body

    def hook_lease(self, uuid: str, holder: str, now: float, ttl_s: float) -> bool:
        with self._tx() as cur:
            cur.execute("UPDATE aotx_webhooks SET lease_holder = %s, lease_expires = %s "
                        "WHERE uuid = %s AND (lease_holder IS NULL OR lease_holder = %s "
                        "OR lease_expires < %s)", (holder, now + ttl_s, uuid, holder, now))
            return bool(cur.rowcount == 1)

    def hook_release(self, uuid: str, holder: str) -> None:
        with self._tx() as cur:
            cur.execute("UPDATE aotx_webhooks SET lease_holder = NULL, lease_expires = NULL "
                        "WHERE uuid = %s AND lease_holder = %s", (uuid, holder))

    def close(self) -> None:
        self._pool.close()
