"""The interface every metadata store backend implements, and its errors."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import RecordError


class StoreUnavailable(Exception):
    """The store could not answer; affected chunks get METADATA_UNAVAILABLE."""


class SchemaMismatch(StoreUnavailable):
    """The store's schema is missing, older or newer than this build; the message says
    what to run."""


class LifecycleError(RecordError):
    """A status change was refused; ``str()`` names the chunk and the field at fault.

    Nothing was changed.
    """


class ChunkNotFound(LifecycleError):
    """The chunk to change has no record."""


@dataclass(frozen=True, slots=True)
class StoreEndpoint:
    """Where a store's lookups go, as a trace names it: the database system
    (``postgresql``, ``sqlite``) and, for a server, its host (or socket
    directory) and port. Never a URL: that may carry a password."""

    system: str
    host: str | None = None
    port: int | None = None


class MetadataStore(Protocol):
    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up many chunks in one round trip.

        Returns the records found, keyed by chunk id, with ``signature_valid``
        filled in; ids with no record are absent. Raises StoreUnavailable when
        the store cannot answer.
        """
        ...

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        """Insert or replace records atomically (all or none); return the count.

        A record stored as revoked, quarantined or superseded is not made
        approved or draft again unless ``reinstate``: LifecycleError, nothing
        written (``sidecar.store.lifecycle.check_no_reinstatement``).

        ``signature_valid`` of the given records is ignored. Raises ValueError
        when a record cannot be stored and StoreUnavailable when the store
        cannot be reached; in both cases nothing is written.
        """
        ...

    def get(self, chunk_id: str) -> ChunkRecord | None:
        """The record of one chunk (text included), or None; raises StoreUnavailable."""
        ...

    def set_status(
        self, chunk_id: str, status: Status, superseded_by: str | None = None
    ) -> ChunkRecord:
        """Set a chunk's status and successor in one transaction; return the new record.

        ``superseded_by`` is required with SUPERSEDED and refused otherwise
        (other statuses clear it); the successor must exist, belong to the same
        tenant and be neither superseded nor revoked. Raises ChunkNotFound or
        LifecycleError (nothing changed) and StoreUnavailable.
        """
        ...

    def close(self) -> None:
        """Release what the synchronous operations hold."""
        ...

    async def aclose(self) -> None:
        """Release everything, including what ``fetch`` holds (call from the event loop
        that fetched)."""
        ...
