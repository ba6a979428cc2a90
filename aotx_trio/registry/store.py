"""The one store interface of the registry (``backends.open_store`` picks one).

:class:`StoreBackend` is the protocol both backends implement
(``store_folder.FolderStore``, ``store_pg.PostgresStore``): keyed documents in
named collections, content-addressed blobs, the ordered event feed and the
webhook subscriptions with their delivery leases (``aotx_trio.webhooks``).  Its
calls block; the registry (``registry.py``) runs each through
``trio.to_thread.run_sync`` and holds every rule above it, so the backends are
storage only.  Layouts and schema: docs/formats/registry.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

COLLECTIONS = ("manifests", "published", "removed", "model_states", "releases",
               "release_states", "deployments", "aliases", "sessions", "revisions")

#: read-modify-write: the current bytes (None when absent) -> the new bytes
Updater = Callable[[bytes | None], bytes]


class StoreBackend(Protocol):
    """Storage primitives of the registry; every call is blocking and atomic."""

    def get(self, coll: str, key: str) -> bytes | None:
        """The document's bytes, or None."""

    def put(self, coll: str, key: str, body: bytes) -> None:
        """Replace the document whole (readers see the old or the new bytes)."""

    def create(self, coll: str, key: str, body: bytes) -> bytes | None:
        """Write-once: create the document if absent and return None, else return
        the bytes already there (never overwritten)."""

    def update(self, coll: str, key: str, fn: Updater) -> bytes:
        """Under a lock: read, ``fn`` (which may raise to change nothing), write.
        Returns the new bytes."""

    def keys(self, coll: str, prefix: str = "") -> list[str]:
        """The keys of a collection that start with ``prefix``, sorted."""

    def blob_put(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Store a blob from its chunks; (sha256, size).  Write-once by address."""

    def blob_size(self, sha256: str) -> int | None:
        """The blob's size, or None when absent."""

    def blob_read(self, sha256: str) -> Iterator[bytes]:
        """The blob's bytes in chunks (KeyError when absent)."""

    def feed_append(self, event: bytes, operation_id: str, at: float) -> int | None:
        """Append one event (canonical JSON without ``seq``, which the store adds);
        its seq, or None when the feed already holds ``operation_id``."""

    def feed_read(self, after: int, limit: int) -> list[bytes]:
        """Up to ``limit`` events with seq > ``after``, in order (each with ``seq``)."""

    def feed_ops(self) -> set[str]:
        """Every operation_id the retained feed holds."""

    def feed_trim(self, before: float) -> int:
        """Drop events older than ``before`` (never the newest); how many."""

    def feed_head(self) -> int:
        """The newest event's seq (0 when the feed never held one)."""

    # webhook subscriptions (aotx_trio.webhooks): one canonical JSON document each,
    # keyed by its uuid, and one delivery lease each (holder id, expiry)

    def hook_create(self, uuid: str, body: bytes,
                    admit: Callable[[list[bytes]], None] | None = None) -> bytes | None:
        """Write-once: create the subscription if absent (None), else the bytes there.
        ``admit`` gets every subscription under the lock that serializes creations
        and may raise to create nothing (a bound that holds across routers)."""

    def hook_get(self, uuid: str) -> bytes | None:
        """The subscription's bytes, or None."""

    def hook_list(self) -> list[bytes]:
        """Every subscription (active and disabled), by uuid."""

    def hook_delete(self, uuid: str) -> None:
        """Drop the subscription and its lease (absent: nothing)."""

    def hook_update(self, uuid: str, fn: Updater, *, holder: str | None = None,
                    now: float = 0.0) -> bytes | None:
        """Locked read-modify-write of an existing subscription (``fn`` gets its bytes;
        KeyError when absent).  With ``holder``: only while ``holder`` holds its
        unexpired lease at ``now``, else nothing is written and None is returned."""

    def hook_lease(self, uuid: str, holder: str, now: float, ttl_s: float) -> bool:
        """Take or renew the delivery lease until ``now + ttl_s``: True when it is
        free, expired or ``holder``'s own; False while another holder's is unexpired."""

    def hook_release(self, uuid: str, holder: str) -> None:
        """Drop the lease if ``holder`` holds it (a clean stop; a crash lets it expire)."""

    def close(self) -> None:
        """Release connections / descriptors."""
