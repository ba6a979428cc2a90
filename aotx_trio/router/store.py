"""The one store interface of the registry (``backends.open_store`` picks one).

:class:`StoreBackend` is the protocol both backends implement
(``store_folder.FolderStore``, ``store_pg.PostgresStore``): keyed documents in
named collections, content-addressed blobs and the ordered event feed.  Its
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

    def close(self) -> None:
        """Release connections / descriptors."""
