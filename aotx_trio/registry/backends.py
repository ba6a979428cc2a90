"""Choosing the registry store: ``--data DIR`` (folder) or ``--store postgresql://...``."""

from __future__ import annotations

from pathlib import Path

from aotx_trio.registry.store import StoreBackend


def open_store(*, data: str | Path | None = None, url: str | None = None,
               ) -> StoreBackend:
    """The folder store at ``<data>/registry`` or the PostgreSQL store at ``url``."""
    if (data is None) == (url is None):
        raise ValueError("open_store takes exactly one of data= or url=")
    if url is not None:
        from aotx_trio.registry.postgres import PostgresStore
        return PostgresStore(url)
    from aotx_trio.registry.folder import FolderStore
    assert data is not None
    return FolderStore(Path(data) / "registry")
