"""Record cases for the loader, and chunk ids loaded for two tenants one after the other."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from tests.adversarial.model import Draw, RecordCase, StoreCase, pick_other, pick_tenant
from tests.fixtures.records import record_dict, text_for

# The record contract's fields (docs/architecture.md, "The chunk record"): which must be
# there, which may be null, which may be left out but not be null.
REQUIRED = (
    "chunk_id",
    "doc_id",
    "tenant_id",
    "allowed_principals",
    "status",
    "effective_at",
    "sha256",
)
NULLABLE = ("expires_at", "superseded_by", "text", "payload_sha256", "payload")
OPTIONAL = ("version", "source_uri", "requires_signature")
_WRONG_TYPES: tuple[Any, ...] = (7, 1.5, True, [], ["x"], {}, {"v": 1})
_TYPE_OK: dict[str, Callable[[Any], bool]] = {
    "allowed_principals": lambda v: False,  # every wrong type above is wrong here
    "requires_signature": lambda v: isinstance(v, bool),
    "payload": lambda v: isinstance(v, dict),
}


def records(draw: Draw) -> RecordCase:
    """A record file: one chunk id for two tenants (one case in ten), else one odd record."""
    return _duplicate_ids(draw) if draw.rng.random() < 0.1 else _one_record(draw)


def _one_record(draw: Draw) -> RecordCase:
    """One bad (or contract-valid) record among valid ones, at a known line."""
    rng = draw.rng
    size = rng.randint(1, 4)
    bad_line = rng.randint(1, size)
    chunk_id = rng.choice(("r-1", "\u0440-1", "r\x01", "r" * 5000, "\uff52-1", "r-1\x00"))
    record = record_dict(
        chunk_id, tenant_id=pick_tenant(rng), doc_id=f"doc-{draw.number}", text=text_for(chunk_id)
    )
    lines = [
        json.dumps(record_dict(f"filler-{n}", doc_id=f"filler-doc-{n}")).encode()
        for n in range(1, size + 1)
    ]
    what, expect, field_name, lines[bad_line - 1] = _record_mutation(rng, record, chunk_id)
    if expect == "accept":
        return RecordCase(draw.case_id(), draw.kind, what, tuple(lines), expect)
    return RecordCase(
        draw.case_id(),
        draw.kind,
        what,
        tuple(lines),
        expect,
        bad_line,
        field_name,
        _usable(record, field_name),
    )


def _usable(record: dict[str, Any], field_name: str | None) -> str | None:
    """The chunk id an error about ``field_name`` must name (None: none it could).

    A line that is no object (``field_name`` None) names no chunk, nor does an
    error about the chunk id itself.
    """
    chunk_id = record.get("chunk_id")
    if field_name in (None, "chunk_id") or not isinstance(chunk_id, str) or not chunk_id.strip():
        return None
    return chunk_id


def _record_mutation(
    rng: random.Random, record: dict[str, Any], chunk_id: str
) -> tuple[str, str, str | None, bytes]:
    """(what, expect, the field an error must name, the line)."""
    name = rng.choice((*REQUIRED, *NULLABLE, *OPTIONAL))
    kind = rng.choice(
        (
            "missing",
            "null",
            "wrong type",
            "blank",
            "unknown field",
            "duplicate key",
            "odd value",
            "not an object",
        )
    )
    if kind == "missing":
        record.pop(name, None)
        expect = "reject" if name in REQUIRED else "accept"
        return f"{name} missing", expect, name, json.dumps(record).encode()
    if kind == "null":
        record[name] = None
        expect = "accept" if name in NULLABLE else "reject"
        return f"{name} null", expect, name, json.dumps(record).encode()
    if kind == "wrong type":
        value = rng.choice([v for v in _WRONG_TYPES if not _TYPE_OK.get(name, lambda _: False)(v)])
        record[name] = value
        return f"{name} = {value!r}", "reject", name, json.dumps(record).encode()
    if kind == "blank":
        field_name = rng.choice(
            ("chunk_id", "doc_id", "tenant_id", "superseded_by", "allowed_principals")
        )
        value = rng.choice(("", "  ", "\t"))
        record[field_name] = [value] if field_name == "allowed_principals" else value
        return f"{field_name} blank {value!r}", "reject", field_name, json.dumps(record).encode()
    if kind == "unknown field":
        unknown = rng.choice(
            ("tenant", "Tenant_id", "tenant_id ", "signature_valid", "\u0442enant_id", "owner")
        )
        record[unknown] = "globex"
        return f"unknown field {unknown!r}", "reject", unknown, json.dumps(record).encode()
    if kind == "duplicate key":
        repeated = rng.choice(("tenant_id", "status", "allowed_principals"))
        again = {"tenant_id": "globex", "status": "approved", "allowed_principals": ["group:hr"]}[
            repeated
        ]
        text = json.dumps(record)
        raw = f"{text[:-1]}, {json.dumps(repeated)}: {json.dumps(again)}}}".encode()
        return f"{repeated} twice in one object", "reject", repeated, raw
    if kind == "odd value":
        field_name, value, expect = rng.choice(
            (
                ("status", "Approved", "reject"),
                ("status", "approved ", "reject"),
                ("status", "\u0430pproved", "reject"),
                ("sha256", record["sha256"].upper(), "reject"),
                ("effective_at", "2025-01-01T00:00:00", "reject"),
                ("expires_at", "2024-01-01T00:00:00Z", "reject"),
                ("superseded_by", chunk_id, "reject"),
                ("tenant_id", "acme\x00", "accept"),
                ("tenant_id", "\u0430cme", "accept"),
                ("tenant_id", "t" * 100_000, "accept"),
                ("allowed_principals", ["group:qa\x00"], "accept"),
                ("text", text_for(chunk_id) + " ", "reject"),
            )
        )
        record[field_name] = value
        shown = (
            f"{len(value)} characters"
            if isinstance(value, str) and len(value) > 40
            else repr(value)
        )
        return f"{field_name} = {shown}", expect, field_name, json.dumps(record).encode()
    raw = rng.choice((b"null", b"[]", b'"record"', b"1", b"{", b"\xff\xfe"))
    return f"line {raw!r}", "reject", None, raw


def _duplicate_ids(draw: Draw) -> RecordCase:
    """The same chunk id for two tenants in one file."""
    rng = draw.rng
    chunk_id = rng.choice(("shared", "dup-1", "\u0430", "x" * 300))
    first, second = pick_tenant(rng), pick_tenant(rng)
    lines = [
        json.dumps(record_dict(chunk_id, tenant_id=first, doc_id="d-first")).encode(),
        json.dumps(record_dict(chunk_id, tenant_id=second, doc_id="d-second")).encode(),
    ]
    what = "one chunk id for two tenants in one file"
    return RecordCase(
        draw.case_id(), draw.kind, what, tuple(lines), "reject", 2, "chunk_id", chunk_id
    )


def store_collisions(draw: Draw) -> StoreCase:
    """Two tenants' records with one chunk id, loaded one after the other."""
    rng = draw.rng
    first = pick_tenant(rng)
    second = pick_other(rng, first)
    base = rng.choice(("shared", "dup", "\u0430", "id with spaces", "x" * 300, "n\x00"))
    chunk_id = f"{base}-{draw.number}"
    return StoreCase(
        draw.case_id(), draw.kind, f"{first!r} then {second!r}", chunk_id, first, second
    )
