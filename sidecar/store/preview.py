"""What a load would do (``store load --dry-run``), from what the store holds.

Backends read, in one transaction that writes nothing, the stored records of
the batch's ids and the stored approved records of the documents it touches,
and hand them to ``preview_load``; the refusals are found by the same checks
``upsert`` runs before it writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sidecar.core.chunk_record import CONTRACT_FIELDS, ChunkRecord
from sidecar.store.lifecycle import reinstatement_problems
from sidecar.store.loader import RecordError
from sidecar.store.store import LoadPreview
from sidecar.store.versions import overlap_problems


def preview_load(
    records: Iterable[ChunkRecord],
    *,
    stored: Mapping[str, ChunkRecord],
    approved: Iterable[ChunkRecord],
    reinstate: bool,
) -> LoadPreview:
    """The preview of loading ``records`` (the last record of an id wins).

    ``stored``: the store's records of the batch's ids, by id; ``approved``: its
    approved records of the documents the batch touches
    (``versions.touched_documents``).
    """
    batch = {record.chunk_id: record for record in records}
    added = []
    changed = []
    for chunk_id, record in batch.items():
        before = stored.get(chunk_id)
        if before is None:
            added.append(chunk_id)
            continue
        fields = changed_fields(before, record)
        if fields:
            changed.append((chunk_id, fields))
    refused: list[RecordError] = []
    if not reinstate:
        refused += reinstatement_problems(
            {chunk_id: record.status for chunk_id, record in batch.items()},
            {chunk_id: record.status for chunk_id, record in stored.items()},
        )
    refused += overlap_problems(batch.values(), approved)
    return LoadPreview(
        added=tuple(added),
        changed=tuple(changed),
        unchanged=len(batch) - len(added) - len(changed),
        refused=tuple(refused),
    )


def changed_fields(before: ChunkRecord, after: ChunkRecord) -> tuple[str, ...]:
    """The names of the record contract's fields whose values differ, in contract order
    (``signature_valid`` is derived, never loaded, so never compared)."""
    return tuple(name for name in CONTRACT_FIELDS if getattr(before, name) != getattr(after, name))
