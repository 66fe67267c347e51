"""The interface every metadata store backend implements, and its errors."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import RecordError


class StoreUnavailable(Exception):
    """The store could not answer; affected chunks get METADATA_UNAVAILABLE."""


class SchemaMismatch(StoreUnavailable):
    """The store's schema is missing, older or newer than this build; the message says
    what to run."""


class StoreNotCreated(SchemaMismatch):
    """The store named does not exist (a SQLite file that is not there); only
    ``store migrate`` creates one, and the message says so."""


class LifecycleError(RecordError):
    """A status change was refused; ``str()`` names the chunk and the field at fault.

    Nothing was changed.
    """


class ChunkNotFound(LifecycleError):
    """The chunk to change has no record."""


class VersionOverlap(RecordError):
    """A write was refused: it would make two approved versions of one document valid
    at the same instant for a shared principal (``sidecar.store.versions``).

    Nothing was written; ``str()`` names the chunk, the field to change and the
    other version's chunk.
    """


_Refusal = TypeVar("_Refusal", bound=RecordError)


def first_refusal(problems: Sequence[_Refusal]) -> _Refusal:
    """The first of ``problems`` (not empty), its message saying how many records more
    are refused: what a refused write raises, while a preview lists them all."""
    first = problems[0]
    if len(problems) == 1:
        return first
    more = len(problems) - 1
    return type(first)(
        f"{first.message} (and {more} more record{'s' if more > 1 else ''})",
        line=first.line,
        chunk_id=first.chunk_id,
        field=first.field,
        source=first.source,
    )


@dataclass(frozen=True, slots=True)
class LoadPreview:
    """What loading a batch of records would do, found without writing anything.

    ``added``: ids the store has no record of; ``changed``: (id, names of the
    fields that would change) for the others that differ; ``unchanged``: how
    many are stored exactly as given. ``refused``: why the load would be
    refused (empty: it would succeed), one error per record at fault.
    """

    added: tuple[str, ...]
    changed: tuple[tuple[str, tuple[str, ...]], ...]
    unchanged: int
    refused: tuple[RecordError, ...]


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
        written (``sidecar.store.lifecycle.check_no_reinstatement``). An
        approved record whose validity overlaps another approved version of its
        document, stored or in the batch, for a shared principal is refused
        with VersionOverlap, nothing written (``sidecar.store.versions``).

        ``signature_valid`` of the given records is ignored. Raises ValueError
        when a record cannot be stored and StoreUnavailable when the store
        cannot be reached; in both cases nothing is written.
        """
        ...

    def preview(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> LoadPreview:
        """What ``upsert(records, reinstate=reinstate)`` would do, read in one transaction
        that writes nothing (``sidecar.store.preview``); raises StoreUnavailable."""
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
        tenant and be neither superseded nor revoked. APPROVED is refused when
        it would overlap another approved version of the document
        (VersionOverlap). Raises ChunkNotFound, LifecycleError or
        VersionOverlap (nothing changed) and StoreUnavailable.
        """
        ...

    def close(self) -> None:
        """Release what the synchronous operations hold."""
        ...

    async def aclose(self) -> None:
        """Release everything, including what ``fetch`` holds (call from the event loop
        that fetched)."""
        ...
