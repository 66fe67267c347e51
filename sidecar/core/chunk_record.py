"""The chunk record: authoritative metadata for one chunk.

The contract is in docs/architecture.md, "The chunk record".

The model only; ``sidecar.store.loader`` reads and validates its JSON Lines form.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum


class Status(StrEnum):
    APPROVED = "approved"
    DRAFT = "draft"
    SUPERSEDED = "superseded"
    REVOKED = "revoked"
    QUARANTINED = "quarantined"


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One chunk's authoritative metadata (docs/architecture.md, "The chunk record").

    Every field but the last comes from the record contract. ``signature_valid``
    is not part of it: the store derives it when it looks the record up (a valid
    electronic signature exists for ``doc_id`` at ``version``), so input never
    sets it and ``parse_record`` rejects it as an unknown field.
    """

    chunk_id: str
    doc_id: str
    version: str
    tenant_id: str
    allowed_principals: tuple[str, ...]
    status: Status
    effective_at: datetime  # timezone-aware, inclusive
    expires_at: datetime | None  # timezone-aware, exclusive; None = open-ended
    sha256: str  # 64 lowercase hex of the canonical text (see integrity.py)
    source_uri: str = ""
    superseded_by: str | None = None
    requires_signature: bool = False
    text: str | None = None
    # 64 lowercase hex of the canonical JSON of the declared payload fields
    # (see integrity.py); None: the record vouches for no payload field.
    payload_sha256: str | None = None
    signature_valid: bool = False


# Fields the store fills in on lookup; never read from input, never stored as given.
DERIVED_FIELDS: frozenset[str] = frozenset({"signature_valid"})
# The record contract's fields, in declaration order (the order of store columns).
CONTRACT_FIELDS: tuple[str, ...] = tuple(
    field.name for field in fields(ChunkRecord) if field.name not in DERIVED_FIELDS
)
