"""The interface every metadata store backend implements."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Protocol

from sidecar.records import ChunkRecord


class StoreUnavailable(Exception):
    """The store could not answer; affected chunks get METADATA_UNAVAILABLE."""


class MetadataStore(Protocol):
    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up many chunks in one round trip.

        Returns the records found, keyed by chunk id; ids with no record are
        absent. Raises StoreUnavailable when the store cannot answer.
        """
        ...

    def upsert(self, records: Iterable[ChunkRecord]) -> int:
        """Insert or replace records atomically (all or none); return the count."""
        ...

    def close(self) -> None: ...
