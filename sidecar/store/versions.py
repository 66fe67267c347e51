"""Approved versions of one document valid at once, checked against the store.

The loader refuses two approved versions of a document that are valid at the
same instant for a shared principal within one file
(``loader.versions_overlap``): the gate could not tell which one is the
authority. A write must not create such a pair with what the store already
holds either. Backends read the stored approved records of the documents a
write touches inside the write transaction (rows a load replaces do not count:
the load's version of that chunk is what will be stored), call these checks
and write only if they pass.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import format_timestamp, quote_for_message, versions_overlap
from sidecar.store.store import VersionOverlap, first_refusal

# What makes two records of one document overlap or not, besides their document:
# a version's many chunks usually share it, so each shape is compared once.
_Shape = tuple[str, frozenset[str], datetime, datetime | None]


def touched_documents(records: Iterable[ChunkRecord]) -> list[str]:
    """The doc_ids of the approved ``records``: whose stored approved records to read."""
    return sorted({record.doc_id for record in records if record.status is Status.APPROVED})


def overlap_problems(
    loaded: Iterable[ChunkRecord], stored: Iterable[ChunkRecord]
) -> list[VersionOverlap]:
    """One VersionOverlap per loaded record that would overlap another approved version.

    ``loaded`` is the batch to write (the last record of an id wins, as in
    ``upsert``); ``stored`` holds at least the stored approved records of the
    documents it touches (``touched_documents``). A stored record whose id the
    batch also holds is replaced, so it is not compared; two loaded records
    that overlap are reported once, on the later one in the batch.
    """
    batch = {record.chunk_id: record for record in loaded}
    others: dict[tuple[str, str], dict[_Shape, tuple[ChunkRecord, bool]]] = defaultdict(dict)
    for record in stored:
        if record.chunk_id not in batch and record.status is Status.APPROVED:
            others[(record.tenant_id, record.doc_id)].setdefault(_shape(record), (record, True))
    problems = []
    for record in batch.values():
        if record.status is not Status.APPROVED:
            continue
        known = others[(record.tenant_id, record.doc_id)]
        conflict = next(
            (found for found in known.values() if versions_overlap(found[0], record)), None
        )
        if conflict is not None:
            problems.append(_overlap(record, *conflict))
        known.setdefault(_shape(record), (record, False))
    return problems


def check_no_version_overlap(loaded: Iterable[ChunkRecord], stored: Iterable[ChunkRecord]) -> None:
    """Raise VersionOverlap (the first of ``overlap_problems``) when the write would
    make two approved versions of a document valid at once for a shared principal."""
    problems = overlap_problems(loaded, stored)
    if problems:
        raise first_refusal(problems)


def check_approval(record: ChunkRecord, stored: Iterable[ChunkRecord]) -> None:
    """Raise VersionOverlap when approving ``record`` (a status change) would make it
    valid at the same time as another approved version of its document in ``stored``."""
    approved = dataclasses.replace(record, status=Status.APPROVED)
    for other in stored:
        if other.chunk_id != record.chunk_id and versions_overlap(other, approved):
            raise VersionOverlap(
                f"approving it would make version {quote_for_message(record.version)} of "
                f"document {quote_for_message(record.doc_id)} valid at the same time as "
                f"approved version {quote_for_message(other.version)} (chunk "
                f"{quote_for_message(other.chunk_id)}) for an overlapping audience; supersede "
                "or revoke that chunk first",
                chunk_id=record.chunk_id,
                field="status",
            )


def _shape(record: ChunkRecord) -> _Shape:
    return (
        record.version,
        frozenset(record.allowed_principals),
        record.effective_at,
        record.expires_at,
    )


def _overlap(record: ChunkRecord, other: ChunkRecord, in_store: bool) -> VersionOverlap:
    where = "in the store" if in_store else "in the same load"
    clash = (
        f"approved version {quote_for_message(record.version)} of document "
        f"{quote_for_message(record.doc_id)} is valid at the same time as approved version "
        f"{quote_for_message(other.version)} {where} (chunk "
        f"{quote_for_message(other.chunk_id)}) for an overlapping audience"
    )
    if record.effective_at >= other.effective_at:
        # The other version came first: it has to end where this one begins.
        return VersionOverlap(
            f"{clash}; that version must expire at or before this effective_at (give it an "
            "expires_at, or supersede or revoke it), or narrow the audience",
            chunk_id=record.chunk_id,
            field="effective_at",
        )
    return VersionOverlap(
        f"{clash}; set expires_at to at most {format_timestamp(other.effective_at)}, when "
        "that version takes effect, or narrow the audience",
        chunk_id=record.chunk_id,
        field="expires_at",
    )
