"""Rows of the ``chunks`` table to records and back, for every store backend.

A row holds the record contract's fields in declaration order
(``CONTRACT_FIELDS``, the table's column order); a looked-up row adds the
derived ``signature_valid`` last. Backends differ only in how they store
principals and timestamps: a backend subclasses ``RowCodec`` and overrides the
hooks it needs; encoding, decoding and checking against the contract are here.

A row that breaks the contract can only come from someone bypassing the table's
constraints. ``decode_or_log`` logs it (chunk id and column, never values) and
treats it as absent, so only that chunk is rejected (as MISSING_METADATA) rather
than every chunk of every response that touches it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from functools import cached_property

from sidecar.core.chunk_record import ChunkRecord, Status

_log = logging.getLogger(__name__)

# Decoded, never returned (RowCodec.decode_rows): shaped like a typical record.
_DECOY_RECORD = ChunkRecord(
    chunk_id="decoy-0000000000000000",
    doc_id="decoy-document",
    version="1",
    tenant_id="decoy-tenant",
    allowed_principals=("group:decoy",),
    status=Status.APPROVED,
    effective_at=datetime(2025, 1, 1, tzinfo=UTC),
    expires_at=None,
    sha256="0" * 64,
    source_uri="https://decoy.invalid/document",
)


class UndecodableColumn(ValueError):
    """A stored value the record contract does not allow; ``column`` names where."""

    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


class RowCodec:
    """Turns records into rows and rows into records.

    The hooks store principals and timestamps as the database driver adapts
    them itself (a list, an aware datetime); a backend that stores them
    otherwise overrides them. An ``*_in`` hook may raise ValueError or
    TypeError for a value it cannot read; the result is checked here.
    """

    def principals_out(self, principals: tuple[str, ...]) -> object:
        """The stored form of ``allowed_principals``."""
        return list(principals)

    def timestamp_out(self, moment: datetime) -> object:
        """The stored form of an aware timestamp."""
        return moment

    def principals_in(self, stored: object) -> object:
        """``allowed_principals`` as read back, to be checked as a list of strings."""
        return stored

    def timestamp_in(self, stored: object) -> object:
        """A timestamp as read back, to be checked as an aware datetime."""
        return stored

    def encode(self, record: ChunkRecord) -> tuple[object, ...]:
        """The row that stores ``record`` (``signature_valid`` is never stored).

        Raises ValueError for a timestamp without a zone: storing it would be a guess.
        """
        for moment in (record.effective_at, record.expires_at):
            if moment is not None and moment.utcoffset() is None:
                raise ValueError("a record timestamp has no time zone; refusing to guess one")
        return (
            record.chunk_id,
            record.doc_id,
            record.version,
            record.tenant_id,
            self.principals_out(record.allowed_principals),
            Status(record.status).value,
            self.timestamp_out(record.effective_at),
            None if record.expires_at is None else self.timestamp_out(record.expires_at),
            record.sha256,
            record.source_uri,
            record.superseded_by,
            record.requires_signature,
            record.text,
            record.payload_sha256,
        )

    def decode(self, row: Sequence[object]) -> ChunkRecord:
        """The record in a looked-up row; raises UndecodableColumn for the first bad column."""
        (
            chunk_id,
            doc_id,
            version,
            tenant_id,
            principals,
            status,
            effective_at,
            expires_at,
            sha256,
            source_uri,
            superseded_by,
            requires_signature,
            text,
            payload_sha256,
            signature_valid,
        ) = row
        return ChunkRecord(
            chunk_id=_text(chunk_id, "chunk_id"),
            doc_id=_text(doc_id, "doc_id"),
            version=_text(version, "version"),
            tenant_id=_text(tenant_id, "tenant_id"),
            allowed_principals=self._principals(principals),
            status=_status(status),
            effective_at=self._timestamp(effective_at, "effective_at"),
            expires_at=None if expires_at is None else self._timestamp(expires_at, "expires_at"),
            sha256=_text(sha256, "sha256"),
            source_uri=_text(source_uri, "source_uri"),
            superseded_by=_text_or_null(superseded_by, "superseded_by"),
            requires_signature=_flag(requires_signature),
            text=_text_or_null(text, "text"),
            payload_sha256=_text_or_null(payload_sha256, "payload_sha256"),
            signature_valid=signature_valid == 1,
        )

    def decode_or_log(self, row: Sequence[object]) -> ChunkRecord | None:
        """The record in a looked-up row, or None (logged) when the row breaks the contract."""
        try:
            return self.decode(row)
        except UndecodableColumn as exc:
            _log.warning(
                "metadata row for chunk %r cannot be decoded (column %s); treated as missing",
                row[0],
                exc.column,
            )
            return None

    def decode_rows(
        self, rows: Iterable[Sequence[object]], asked: int = 0
    ) -> dict[str, ChunkRecord]:
        """The records in looked-up rows by chunk id, leaving out (and logging) bad rows.

        ``asked``: how many ids the lookup asked for. A decoy row is decoded,
        and dropped, for each of them that has no row, so that decoding costs
        what it would if every id had a record: the time of a lookup then says
        less about whether records the caller may not read exist (the database
        still reads the rows it finds: see docs/security.md).
        """
        records = {}
        decoded = 0
        for row in rows:
            decoded += 1
            record = self.decode_or_log(row)
            if record is not None:
                records[record.chunk_id] = record
        if decoded < asked:
            decoy = self._decoy_row
            for _ in range(asked - decoded):
                self.decode(decoy)
        return records

    @cached_property
    def _decoy_row(self) -> tuple[object, ...]:
        """A looked-up row in this backend's stored form, of a record no lookup returns."""
        return (*self.encode(_DECOY_RECORD), False)

    def _principals(self, stored: object) -> tuple[str, ...]:
        try:
            principals = self.principals_in(stored)
        except (TypeError, ValueError):
            raise UndecodableColumn("allowed_principals") from None
        if (
            not isinstance(principals, list)
            or not principals
            or not all(isinstance(p, str) and p for p in principals)
        ):
            raise UndecodableColumn("allowed_principals")
        return tuple(principals)

    def _timestamp(self, stored: object, column: str) -> datetime:
        try:
            moment = self.timestamp_in(stored)
        except (TypeError, ValueError):
            raise UndecodableColumn(column) from None
        if not isinstance(moment, datetime) or moment.utcoffset() is None:
            raise UndecodableColumn(column)
        return moment.astimezone(UTC)


def _text(value: object, column: str) -> str:
    if not isinstance(value, str):
        raise UndecodableColumn(column)
    return value


def _text_or_null(value: object, column: str) -> str | None:
    return None if value is None else _text(value, column)


def _status(value: object) -> Status:
    try:
        return Status(_text(value, "status"))
    except ValueError:
        raise UndecodableColumn("status") from None


def _flag(value: object) -> bool:
    # A PostgreSQL boolean arrives as bool, an SQLite one as 0 or 1; bool is an int.
    if not isinstance(value, int) or value not in (0, 1):
        raise UndecodableColumn("requires_signature")
    return value == 1
