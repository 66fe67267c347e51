"""Rules for changing a chunk's status, shared by every store backend.

Backends read the chunk and its would-be successor inside the transaction that
changes the status (rows locked), call ``check_status_change`` and write only if
it passes, so two concurrent changes cannot together break a rule.
"""

from __future__ import annotations

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import quote_for_message
from sidecar.store.store import ChunkNotFound, LifecycleError, first_refusal

# A successor in one of these states cannot be the authority that replaces a
# chunk: a chain must end in a chunk that may still be served.
_DEAD_ENDS = frozenset({Status.SUPERSEDED, Status.REVOKED})


def check_status_change(
    chunk_id: str,
    status: Status,
    superseded_by: str | None,
    *,
    current: ChunkRecord | None,
    successor: ChunkRecord | None,
) -> None:
    """Raise ChunkNotFound or LifecycleError unless the change may be written.

    ``current`` is the chunk's record and ``successor`` the record of
    ``superseded_by`` (None when either has no record).
    """
    if current is None:
        raise ChunkNotFound("no such record", chunk_id=chunk_id)

    def refuse(message: str) -> LifecycleError:
        return LifecycleError(message, chunk_id=chunk_id, field="superseded_by")

    if status is not Status.SUPERSEDED:
        if superseded_by is not None:
            raise refuse(f"only a superseded chunk names a successor (new status is {status})")
        return
    if superseded_by is None:
        raise refuse("status superseded needs the id of the chunk that replaces it")
    if superseded_by == chunk_id:
        raise refuse("a chunk cannot supersede itself")
    quoted = quote_for_message(superseded_by)
    if successor is None:
        raise refuse(f"successor chunk {quoted} has no record; load it first")
    if successor.status in _DEAD_ENDS:
        raise refuse(f"successor chunk {quoted} is itself {successor.status}")
    if successor.tenant_id != current.tenant_id:
        raise refuse(f"successor chunk {quoted} belongs to another tenant")


# Statuses a record is taken out of service with; loading it again as
# approved or draft would put it back without anyone having decided so.
_WITHDRAWN = frozenset({Status.REVOKED, Status.QUARANTINED, Status.SUPERSEDED})
_SERVED = frozenset({Status.APPROVED, Status.DRAFT})


def loosening_ids(loaded: dict[str, Status]) -> list[str]:
    """The ids of ``loaded`` (id -> new status) that a load could put back in service."""
    return sorted(chunk_id for chunk_id, status in loaded.items() if status in _SERVED)


def reinstatement_problems(
    loaded: dict[str, Status], current: dict[str, Status]
) -> list[LifecycleError]:
    """One LifecycleError per record a load would turn from withdrawn back into served.

    ``loaded`` and ``current`` map chunk ids to the new and the stored status.
    A record that was revoked, quarantined or superseded is reinstated only on
    purpose (``store load --reinstate``, ``store reinstate``), never by loading
    a file again.
    """
    return [
        LifecycleError(
            f"is {current[chunk_id]} in the store and the file would make it "
            f"{loaded[chunk_id]}; reinstate on purpose with `store load --reinstate` or "
            "`store reinstate`",
            chunk_id=chunk_id,
            field="status",
        )
        for chunk_id in sorted(loaded)
        if loaded[chunk_id] in _SERVED and current.get(chunk_id) in _WITHDRAWN
    ]


def check_no_reinstatement(loaded: dict[str, Status], current: dict[str, Status]) -> None:
    """Raise LifecycleError (the first of ``reinstatement_problems``) when a load would
    turn a withdrawn record back into a served one."""
    problems = reinstatement_problems(loaded, current)
    if problems:
        raise first_refusal(problems)
