"""What the adversarial cases run against: tenants, their chunk records, and a hostile database.

Every tenant in ``TENANTS`` owns two chunks in the metadata store (one for
``group:qa``, one for ``group:hr``). Many tenant ids are confusable with
another one (Cyrillic ``\\u0430`` for Latin ``a``, fullwidth forms, NFKC and NFC
equivalents, case, invisible and control characters, a 4,096-character id
and its near miss): each is a tenant of its own, so any normalisation in the
gate would hand one the other's chunks.

The database (``World.search_body``) ignores the tenant filter the gate pushes
down and answers every search with every point it holds: all tenants' chunks,
points of other tenants that reuse a stored chunk id (with their own text, or
with the owner's text under a confusable id), points with missing, null or
mistyped id and text fields, and points of a tenant the store does not know.
Every point carries a ``secret`` payload field that no configuration releases.

Whether a hit may reach a caller follows the record contract
(docs/architecture.md, "The chunk record"): a record with exactly the hit's
chunk id, of the caller's tenant, naming one of its principals, whose
``sha256`` is the canonical hash of the hit's text. ``admissible`` computes
that independently of the gate, and ``owns`` says whether content belongs to
a set of tenants, which is what a cross-tenant release is judged by.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from sidecar.core.integrity import canonical_sha256
from tests.fixtures.records import record_dict

QA = "group:qa"
HR = "group:hr"

# label -> tenant id; every one owns records in the store.
TENANTS: Mapping[str, str] = {
    "acme": "acme",
    "globex": "globex",
    "cyrillic-a": "\u0430cme",
    "fullwidth": "\uff41\uff43\uff4d\uff45",  # NFKC: acme
    "upper": "ACME",
    "title": "Acme",
    "zero-width-space": "acme\u200b",
    "trailing-space": "acme ",
    "nfc": "caf\u00e9",
    "nfd": "cafe\u0301",  # NFC: café
    "ligature": "\ufb01rm",  # NFKC: firm
    "firm": "firm",
    "kelvin-sign": "\u212aelvin",  # lower(): kelvin
    "latin-k": "Kelvin",
    "nul": "acme\x00",
    "newline": "acme\n",
    "right-to-left": "\u202eemca",
    "comma": "acme,globex",
    "star": "*",
    "dotted-capital-i": "\u0130stanbul",  # lower(): i + combining dot
    "istanbul": "istanbul",
    "long": "t" * 4096,
    "long-near-miss": "t" * 4095 + "u",
}

# label -> tenant id no record carries: a caller of one must get nothing.
GHOSTS: Mapping[str, str] = {
    "zero-width-joiner": "acme\u200d",
    "half-fullwidth": "\uff41cme",
    "tab": "acme\t",
    "greek-omicron-globex": "gl\u03bfbex",
    "soft-hyphen": "ac\u00adme",
    "nul-joined": "acme\x00globex",
    "long-ghost": "t" * 4097,
    "wildcard": "acm*",
}

# A chunk id the store gives to one tenant, and the owner's text for it.
DUP_OWNER = "acme"
DUP_ID = "dup-1"
DUP_TEXT = "Shared id dup-1: acme's own text."
NFC_ID = "dup-2"
NFC_OWNER = "globex"
NFC_TEXT = "Shared id dup-2: globex's caf\u00e9 notes."
# Ids a client might confuse with DUP_ID; points of globex carry DUP_TEXT under them.
CONFUSABLE_IDS = (
    "DUP-1",
    "dup-1 ",
    " dup-1",
    "dup-1\x00",
    "dup\u20111",  # non-breaking hyphen
    "\uff44\uff55\uff50-1",  # fullwidth
    "dup-\u0661",  # Arabic-Indic digit one
    "du\u0440-1",  # Cyrillic er
    "dup-1\u200b",
    "dup-1\n",
    "dup-01",
)
# Two stored ids that differ only by a confusable letter, owned by different tenants.
TWIN_IDS = (("dup-3", "acme"), ("du\u0440-3", "cyrillic-a"))

_DROP = object()  # a payload field the point does not have


@dataclass(frozen=True)
class Point:
    """One point as the database returns it, and the tenant whose data it is."""

    point_id: int
    owner: str
    chunk_id: Any
    text: Any

    def as_json(self) -> dict[str, Any]:
        """The scored point; a field set to the drop marker is left out of the payload."""
        payload = {"chunk_id": self.chunk_id, "text": self.text, "tenant": self.owner}
        payload = {key: value for key, value in payload.items() if value is not _DROP}
        payload["secret"] = f"secret of point {self.point_id}"
        return {"id": self.point_id, "version": 1, "score": 0.5, "payload": payload}


@dataclass(frozen=True)
class Record:
    """The parts of a chunk record the contract decides on."""

    chunk_id: str
    tenant: str
    principals: frozenset[str]
    sha256: str


@dataclass(frozen=True)
class World:
    """The store's records (JSON Lines dicts) and the database's points."""

    records: tuple[dict[str, Any], ...]
    points: tuple[Point, ...]

    def search_body(self) -> bytes:
        """Every point, as a Qdrant search answer: what the hostile database sends."""
        result = [point.as_json() for point in self.points]
        return orjson.dumps({"result": result, "status": "ok", "time": 0.001})

    def by_id(self) -> dict[str, Record]:
        """The stored records by chunk id."""
        return {
            r["chunk_id"]: Record(
                r["chunk_id"], r["tenant_id"], frozenset(r["allowed_principals"]), r["sha256"]
            )
            for r in self.records
        }

    def admissible(self, tenant: str, principals: Collection[str]) -> frozenset[int]:
        """The point ids the record contract admits for this caller."""
        records = self.by_id()
        return frozenset(
            point.point_id
            for point in self.points
            if _admits(records, point.chunk_id, point.text, tenant, principals)
        )

    def point(self, point_id: object) -> Point | None:
        """The database's point with this id."""
        return next((p for p in self.points if p.point_id == point_id), None)


def _admits(
    records: Mapping[str, Record],
    chunk_id: Any,
    text: Any,
    tenant: str,
    principals: Collection[str],
) -> bool:
    if not isinstance(chunk_id, str) or not isinstance(text, str):
        return False
    record = records.get(chunk_id)
    return (
        record is not None
        and record.tenant == tenant
        and not record.principals.isdisjoint(principals)
        and canonical_sha256(text) == record.sha256
    )


def owns(records: Iterable[Record], tenants: Collection[str], chunk_id: Any, text: Any) -> bool:
    """True when ``tenants`` hold a record of exactly this chunk id and (canonical) text.

    Content the caller's own tenant holds is not a cross-tenant release even if
    another tenant's point carried it; anything else is.
    """
    if not isinstance(chunk_id, str) or not isinstance(text, str):
        return False
    digest = canonical_sha256(text)
    return any(
        r.chunk_id == chunk_id and r.tenant in tenants and r.sha256 == digest for r in records
    )


def _record(chunk_id: str, tenant: str, text: str, principals: list[str]) -> dict[str, Any]:
    return record_dict(
        chunk_id, tenant_id=tenant, sha256=canonical_sha256(text), allowed_principals=principals
    )


def build_world() -> World:
    """The same world every run: records and points are fixed, not drawn from the seed."""
    records: list[dict[str, Any]] = []
    points: list[Point] = []

    def add_point(owner: str, chunk_id: Any, text: Any) -> None:
        points.append(Point(len(points) + 1, owner, chunk_id, text))

    for label, tenant in TENANTS.items():
        for index, principal in enumerate((QA, HR)):
            chunk_id = f"{label}-c{index}"
            text = f"Chunk {index} of tenant {label}: private to {principal}."
            records.append(_record(chunk_id, tenant, text, [principal]))
            add_point(tenant, chunk_id, text)

    # One stored id, several tenants' points under it (each with its own text).
    records.append(_record(DUP_ID, TENANTS[DUP_OWNER], DUP_TEXT, [QA]))
    add_point(TENANTS[DUP_OWNER], DUP_ID, DUP_TEXT)
    for label in ("globex", "cyrillic-a", "fullwidth", "upper"):
        add_point(TENANTS[label], DUP_ID, f"Shared id dup-1: {label}'s own text.")
    # A stored text with an accent; another tenant's point has it decomposed (NFD),
    # which the canonical form equates: the owner may receive it, nobody else.
    records.append(_record(NFC_ID, TENANTS[NFC_OWNER], NFC_TEXT, [QA]))
    add_point(TENANTS[NFC_OWNER], NFC_ID, NFC_TEXT)
    add_point(TENANTS["nfd"], NFC_ID, unicodedata.normalize("NFD", NFC_TEXT))
    add_point(TENANTS["acme"], NFC_ID, "Shared id dup-2: acme's own text.")
    # The owner's exact text under ids that only look like the owner's.
    for chunk_id in CONFUSABLE_IDS:
        add_point(TENANTS["globex"], chunk_id, DUP_TEXT)
    for chunk_id, label in TWIN_IDS:
        text = f"Twin id {chunk_id!r} of {label}."
        records.append(_record(chunk_id, TENANTS[label], text, [QA]))
        add_point(TENANTS[label], chunk_id, text)
    # Points whose id or text is missing, null or of the wrong type.
    odd_values: tuple[object, ...] = (_DROP, None, 1, [DUP_ID], {"id": DUP_ID}, True, "")
    for odd in odd_values:
        add_point(TENANTS["globex"], odd, DUP_TEXT)
    for odd in (_DROP, None, 5, [DUP_TEXT], {"text": DUP_TEXT}):
        add_point(TENANTS["globex"], DUP_ID, odd)
    # A tenant the store does not know.
    add_point("ghost-tenant", "ghost-c0", "Chunk of a tenant without records.")
    return World(tuple(records), tuple(points))
