"""Parsing and validation of chunk records (docs/architecture.md, "The chunk record")."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.loader import (
    RecordError,
    RecordsInvalid,
    load_jsonl,
    parse_record,
    parse_timestamp,
    record_to_json,
)
from sidecar.store.sqlite import SqliteStore

# The record's text uses CRLF; its hash is of the canonical (LF) form.
TEXT = "Refunds are issued within 30 days.\r\nSee section 4."
TEXT_SHA = hashlib.sha256(b"Refunds are issued within 30 days.\nSee section 4.").hexdigest()
OTHER_SHA = "0" * 64
# Hashed payload fields; their values must never appear in an error.
PAYLOAD = {"title": "Secret title", "metadata.source": "kb/7", "metadata.page": 4}
PAYLOAD_SHA = hashlib.sha256(
    b'{"metadata.page":4,"metadata.source":"kb/7","title":"Secret title"}'
).hexdigest()


def valid(chunk_id: object = "c-1", **overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "chunk_id": chunk_id,
        "doc_id": "refund-policy",
        "version": "3",
        "tenant_id": "acme",
        "allowed_principals": ["group:support"],
        "status": "approved",
        "effective_at": "2025-01-01T00:00:00Z",
        "expires_at": None,
        "sha256": TEXT_SHA,
        "source_uri": "https://docs.example/refunds#4",
        "superseded_by": None,
        "requires_signature": False,
        "text": TEXT,
    }
    record.update(overrides)
    return record


def without(field: str, **overrides: Any) -> dict[str, Any]:
    record = valid(**overrides)
    del record[field]
    return record


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "chunks.jsonl"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    return path


def jsonl(*records: dict[str, Any]) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def load_into_store(path: Path, store: SqliteStore) -> None:
    """What `retrieval-gate store load` does: validate the whole file, then write."""
    store.upsert(load_jsonl(path))


async def all_ids(store: SqliteStore, ids: list[str]) -> dict[str, ChunkRecord]:
    return dict(await store.fetch(ids))


def assert_rejected(
    tmp_path: Path, store: SqliteStore, bad_line: str, field: str | None, fragment: str
) -> RecordError:
    """Line 1 valid, line 2 blank, line 3 ``bad_line``: the error must name line 3."""
    path = write(tmp_path, jsonl(valid("c-ok")) + "\n" + bad_line + "\n")
    with pytest.raises(RecordsInvalid) as caught:
        load_into_store(path, store)
    errors = caught.value.errors
    assert len(errors) == 1, [str(e) for e in errors]
    error = errors[0]
    assert error.line == 3
    assert error.field == field
    assert fragment in error.message
    rendered = str(caught.value)
    assert "chunks.jsonl line 3" in rendered
    if field is not None:
        assert f'field "{field}"' in rendered
    assert TEXT not in rendered  # chunk text never appears in an error
    assert "Secret title" not in rendered  # nor a payload value
    # Nothing is loaded, not even the valid first line.
    assert asyncio.run(all_ids(store, ["c-ok", "c-1"])) == {}
    return error


MALFORMED = {
    "chunk_id missing": (without("chunk_id"), "chunk_id", "required"),
    "chunk_id empty": (valid(""), "chunk_id", "empty"),
    "chunk_id not a string": (valid(12), "chunk_id", "expected a string, got number"),
    "doc_id blank": (valid(doc_id="   "), "doc_id", "empty or blank"),
    "doc_id missing": (without("doc_id"), "doc_id", "required"),
    "tenant_id missing": (without("tenant_id"), "tenant_id", "required"),
    "tenant_id empty": (valid(tenant_id=""), "tenant_id", "empty"),
    "tenant_id null": (valid(tenant_id=None), "tenant_id", "got null"),
    "version not a string": (valid(version=3), "version", "expected a string"),
    "version null": (valid(version=None), "version", "got null"),
    "principals missing": (without("allowed_principals"), "allowed_principals", "required"),
    "principals empty": (valid(allowed_principals=[]), "allowed_principals", "must not be empty"),
    "principals a string": (
        valid(allowed_principals="group:support"),
        "allowed_principals",
        "array of strings, got string",
    ),
    "principal empty": (valid(allowed_principals=["a", ""]), "allowed_principals", "item 1"),
    "principal a number": (valid(allowed_principals=[7]), "allowed_principals", "item 0"),
    "status missing": (without("status"), "status", "required"),
    "status unknown": (valid(status="published"), "status", "must be one of approved"),
    "status wrong case": (valid(status="Approved"), "status", '"Approved"'),
    "effective_at missing": (without("effective_at"), "effective_at", "required"),
    "effective_at null": (valid(effective_at=None), "effective_at", "got null"),
    "effective_at without zone": (
        valid(effective_at="2025-01-01T00:00:00"),
        "effective_at",
        "timestamp has no zone offset",
    ),
    "effective_at date only": (valid(effective_at="2025-01-01"), "effective_at", "RFC 3339"),
    "effective_at epoch number": (valid(effective_at=1735689600), "effective_at", "got number"),
    "effective_at impossible date": (
        valid(effective_at="2025-02-30T00:00:00Z"),
        "effective_at",
        "not a valid date",
    ),
    "effective_at offset out of range": (
        valid(effective_at="2025-01-01T00:00:00+24:00"),
        "effective_at",
        "offset out of range",
    ),
    "expires_at without zone": (
        valid(expires_at="2026-01-01T00:00:00.5"),
        "expires_at",
        "timestamp has no zone offset",
    ),
    "expires_at equal to effective_at": (
        valid(expires_at="2025-01-01T01:00:00+01:00"),
        "expires_at",
        "must be after effective_at",
    ),
    "expires_at before effective_at": (
        valid(expires_at="2024-12-31T00:00:00Z"),
        "expires_at",
        "must be after effective_at",
    ),
    "sha256 missing": (without("sha256", text=None), "sha256", "required"),
    "sha256 uppercase": (valid(sha256=TEXT_SHA.upper(), text=None), "sha256", "lowercase"),
    "sha256 too short": (valid(sha256=TEXT_SHA[:63], text=None), "sha256", "64 lowercase"),
    "sha256 not hex": (valid(sha256="g" * 64, text=None), "sha256", "64 lowercase"),
    "source_uri not a string": (valid(source_uri=["x"]), "source_uri", "got array"),
    "superseded_by empty": (valid(superseded_by=""), "superseded_by", "empty"),
    "superseded_by itself": (valid(superseded_by="c-1"), "superseded_by", "itself"),
    "requires_signature a string": (
        valid(requires_signature="yes"),
        "requires_signature",
        "expected true or false, got string",
    ),
    "requires_signature a number": (
        valid(requires_signature=1),
        "requires_signature",
        "got number",
    ),
    "text not a string": (valid(text=42), "text", "expected a string"),
    "text does not match sha256": (valid(sha256=OTHER_SHA), "text", "does not match sha256"),
    "text lone surrogate": (valid(text="bad \ud800"), "text", "lone surrogate"),
    "unknown field": (valid(colour="blue"), "colour", "unknown field"),
    "payload_sha256 uppercase": (
        valid(payload_sha256=PAYLOAD_SHA.upper()),
        "payload_sha256",
        "lowercase",
    ),
    "payload_sha256 too short": (
        valid(payload_sha256=PAYLOAD_SHA[:63]),
        "payload_sha256",
        "64 lowercase",
    ),
    "payload_sha256 a number": (valid(payload_sha256=7), "payload_sha256", "got number"),
    "payload not an object": (valid(payload=["Secret title"]), "payload", "got array"),
    "payload empty path": (valid(payload={" ": "Secret title"}), "payload", "empty or blank"),
    "payload does not match payload_sha256": (
        valid(payload=PAYLOAD, payload_sha256=OTHER_SHA),
        "payload",
        "does not match payload_sha256",
    ),
    "payload with colliding keys": (
        valid(payload={"metadata": {"e\u0301": "Secret title", "\u00e9": "x"}}),
        "payload",
        'payload field "metadata": two keys are equal',
    ),
}


@pytest.mark.parametrize(("record", "field", "fragment"), MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_record_is_rejected_with_line_and_field(
    tmp_path: Path, sqlite_store: SqliteStore, record: dict[str, Any], field: str, fragment: str
) -> None:
    assert_rejected(tmp_path, sqlite_store, json.dumps(record), field, fragment)


def test_line_that_is_not_an_object(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    assert_rejected(
        tmp_path, sqlite_store, '["c-1", "acme"]', None, "expected a JSON object, got array"
    )


def test_line_that_is_not_json(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    assert_rejected(tmp_path, sqlite_store, '{"chunk_id": "c-1",', None, "not valid JSON")


def test_line_that_is_not_utf8(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    path = tmp_path / "chunks.jsonl"
    path.write_bytes(jsonl(valid("c-ok")).encode() + b'{"chunk_id": "\xff"}\n')
    with pytest.raises(RecordsInvalid) as caught:
        load_into_store(path, sqlite_store)
    [error] = caught.value.errors
    assert error.line == 2
    assert "not valid UTF-8" in error.message


def test_key_given_twice_is_rejected(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    line = json.dumps(valid(status="revoked"))[:-1] + ', "status": "approved"}'
    assert_rejected(tmp_path, sqlite_store, line, "status", "key appears twice")


def test_lone_surrogate_in_an_id_is_rejected(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    line = json.dumps(valid(tenant_id="acme\ud800"))  # JSON escape, valid UTF-8 file
    assert_rejected(tmp_path, sqlite_store, line, "tenant_id", "lone surrogate")


def test_error_reads_like_the_documented_example(tmp_path: Path) -> None:
    lines = [json.dumps(valid(f"c-{n}")) for n in range(1, 7)]
    lines.append(json.dumps(valid("c-12", expires_at="2026-01-01T00:00:00")))
    path = write(tmp_path, "\n".join(lines) + "\n")
    with pytest.raises(RecordsInvalid) as caught:
        load_jsonl(path)
    [error] = caught.value.errors
    assert str(error) == (
        'chunks.jsonl line 7 (chunk "c-12"), field "expires_at": '
        "timestamp has no zone offset (add Z or ±hh:mm)"
    )
    assert (error.line, error.chunk_id, error.field) == (7, "c-12", "expires_at")
    assert isinstance(error, ValueError)


def test_all_errors_are_collected(tmp_path: Path) -> None:
    text = (
        jsonl(
            valid("c-1", status="published"),
            valid("c-2"),
            valid("c-3", tenant_id="", effective_at="2025-01-01T00:00:00"),
        )
        + "not json\n"
    )
    with pytest.raises(RecordsInvalid) as caught:
        load_jsonl(write(tmp_path, text))
    found = [(e.line, e.field) for e in caught.value.errors]
    assert found == [(1, "status"), (3, "tenant_id"), (3, "effective_at"), (4, None)]
    message = str(caught.value)
    assert message.startswith("4 problem(s) in chunk records; nothing was loaded:\n")
    assert len(message.splitlines()) == 5


def test_long_error_lists_are_shortened_in_the_message(tmp_path: Path) -> None:
    text = "".join(f"{n}\n" for n in range(150))
    with pytest.raises(RecordsInvalid) as caught:
        load_jsonl(write(tmp_path, text))
    assert len(caught.value.errors) == 150
    assert str(caught.value).endswith("... and 50 more")


def test_error_messages_escape_hostile_ids(tmp_path: Path) -> None:
    hostile = "c-1\nchunks.jsonl line 1: all good" + "x" * 200
    with pytest.raises(RecordsInvalid) as caught:
        load_jsonl(write(tmp_path, jsonl(valid(hostile, status="nope"))))
    message = str(caught.value)
    assert len(message.splitlines()) == 2
    assert "x" * 100 not in message


def test_duplicate_chunk_id_names_both_lines(tmp_path: Path, sqlite_store: SqliteStore) -> None:
    text = jsonl(valid("c-1"), valid("c-2"), valid("c-1", version="4"))
    with pytest.raises(RecordsInvalid) as caught:
        load_into_store(write(tmp_path, text), sqlite_store)
    [error] = [e for e in caught.value.errors if e.field == "chunk_id"]
    assert error.line == 3
    assert "line 1" in error.message
    assert 'chunks.jsonl line 3 (chunk "c-1"), field "chunk_id"' in str(caught.value)


OVERLAPPING_VERSIONS = """\
{"chunk_id": "v1-a", "doc_id": "d", "version": "1", "tenant_id": "acme", "allowed_principals": ["group:support", "group:legal"], "status": "approved", "effective_at": "2024-01-01T00:00:00Z", "expires_at": null, "sha256": "0000000000000000000000000000000000000000000000000000000000000000"}
{"chunk_id": "v2-a", "doc_id": "d", "version": "2", "tenant_id": "acme", "allowed_principals": ["group:legal"], "status": "approved", "effective_at": "2025-01-01T00:00:00Z", "sha256": "0000000000000000000000000000000000000000000000000000000000000000"}
"""  # noqa: E501


def test_overlapping_approved_versions_are_rejected(
    tmp_path: Path, sqlite_store: SqliteStore
) -> None:
    with pytest.raises(RecordsInvalid) as caught:
        load_into_store(write(tmp_path, OVERLAPPING_VERSIONS), sqlite_store)
    [error] = caught.value.errors
    assert (error.line, error.chunk_id, error.field) == (2, "v2-a", "effective_at")
    assert "line 1" in error.message
    assert "expires_at" in error.message


def overlap_pair(first: dict[str, Any], second: dict[str, Any]) -> str:
    base: dict[str, Any] = {
        "doc_id": "d",
        "tenant_id": "acme",
        "allowed_principals": ["group:support"],
        "status": "approved",
        "sha256": OTHER_SHA,
    }
    return jsonl(
        {**base, "chunk_id": "v1", "version": "1", "effective_at": "2024-01-01T00:00:00Z"} | first,
        {**base, "chunk_id": "v2", "version": "2", "effective_at": "2025-01-01T00:00:00Z"} | second,
    )


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"expires_at": "2025-01-01T00:00:00Z"}, {}),  # hand-over at the same instant
        ({"expires_at": "2025-01-01T01:00:00+01:00"}, {}),  # same instant, other offset
        ({}, {"tenant_id": "globex"}),
        ({}, {"allowed_principals": ["group:legal"]}),
        ({}, {"status": "draft"}),
        ({"status": "superseded", "superseded_by": "v2"}, {}),
        ({}, {"version": "1"}),  # chunks of one version
        ({}, {"doc_id": "other"}),
    ],
    ids=[
        "handover",
        "handover-offset",
        "other-tenant",
        "disjoint-audience",
        "draft",
        "superseded",
        "same-version",
        "other-doc",
    ],
)
def test_versions_that_do_not_conflict_load(
    tmp_path: Path, first: dict[str, Any], second: dict[str, Any]
) -> None:
    assert len(load_jsonl(write(tmp_path, overlap_pair(first, second)))) == 2


def test_each_conflicting_record_is_reported_once(tmp_path: Path) -> None:
    records = overlap_pair({"expires_at": "2025-06-01T00:00:00Z"}, {})
    later = [
        valid(
            f"v3-{n}",
            doc_id="d",
            version="3",
            effective_at="2025-07-01T00:00:00Z",
            allowed_principals=["group:legal"],
            sha256=OTHER_SHA,
            text=None,
        )
        for n in range(3)
    ]
    later[1]["allowed_principals"] = ["group:legal", "group:support"]
    with pytest.raises(RecordsInvalid) as caught:
        load_jsonl(write(tmp_path, records + jsonl(*later)))
    # v2 (line 2) starts while v1 is valid until June; v3-1 (line 4) shares
    # group:support with the open-ended v2; the other v3 chunks reach only legal.
    assert [(e.line, e.field) for e in caught.value.errors] == [
        (2, "effective_at"),
        (4, "effective_at"),
    ]
    assert "line 2" in caught.value.errors[1].message


def test_valid_file_loads_with_blank_lines_bom_and_crlf(tmp_path: Path) -> None:
    text = "\ufeff" + jsonl(valid("c-1")).replace("\n", "\r\n") + "\n  \n" + jsonl(valid("c-2"))
    records = load_jsonl(write(tmp_path, text))
    assert [r.chunk_id for r in records] == ["c-1", "c-2"]


def test_parse_record_fills_defaults_and_normalises_times_to_utc() -> None:
    record = parse_record(
        {
            "chunk_id": "c-1",
            "doc_id": "d",
            "tenant_id": "acme",
            "allowed_principals": ["user:ann"],
            "status": "draft",
            "effective_at": "2025-03-01t12:30:00.1234567+02:00",
            "sha256": OTHER_SHA,
        }
    )
    assert record == ChunkRecord(
        chunk_id="c-1",
        doc_id="d",
        version="",
        tenant_id="acme",
        allowed_principals=("user:ann",),
        status=Status.DRAFT,
        effective_at=datetime(2025, 3, 1, 10, 30, 0, 123456, tzinfo=UTC),
        expires_at=None,
        sha256=OTHER_SHA,
    )
    assert record.effective_at.utcoffset() == timedelta(0)


def test_parse_record_accepts_matching_text() -> None:
    record = parse_record(valid(requires_signature=True, superseded_by="c-2", status="superseded"))
    assert record.text == TEXT  # stored as given; only the hash check uses the canonical form
    assert record.requires_signature is True
    assert record.status is Status.SUPERSEDED


def test_payload_gives_the_record_its_payload_sha256() -> None:
    record = parse_record(valid(payload=PAYLOAD))
    assert record.payload_sha256 == PAYLOAD_SHA
    assert parse_record(valid(payload=PAYLOAD, payload_sha256=PAYLOAD_SHA)) == record
    assert parse_record(valid(payload_sha256=PAYLOAD_SHA)) == record
    # Any key order; decomposed and CRLF strings hash as their canonical form.
    reordered = {"metadata.page": 4, "title": "Secret title", "metadata.source": "kb/7"}
    assert parse_record(valid(payload=reordered)).payload_sha256 == PAYLOAD_SHA
    accented = parse_record(valid(payload={"title": "Cafe\u0301\r\n"}))
    assert accented == parse_record(valid(payload={"title": "Caf\u00e9\n"}))


def test_payload_sha256_is_optional() -> None:
    assert parse_record(valid()).payload_sha256 is None
    assert parse_record(valid(payload_sha256=None, payload=None)).payload_sha256 is None
    assert parse_record(valid(payload={})).payload_sha256 == hashlib.sha256(b"{}").hexdigest()


def test_payload_with_nan_is_rejected_naming_the_field(
    tmp_path: Path, sqlite_store: SqliteStore
) -> None:
    # Python's JSON reader accepts NaN; it has no canonical form.
    line = json.dumps(valid(payload={"title": "Secret title", "metadata.score": math.nan}))
    error = assert_rejected(
        tmp_path, sqlite_store, line, "payload", 'payload field "metadata.score"'
    )
    assert "NaN" in error.message


def test_record_with_payload_round_trips_through_its_json_form(
    tmp_path: Path, sqlite_store: SqliteStore
) -> None:
    path = write(tmp_path, jsonl(valid("c-1", payload=PAYLOAD), valid("c-2")))
    load_into_store(path, sqlite_store)
    stored = asyncio.run(all_ids(sqlite_store, ["c-1", "c-2"]))
    assert stored["c-1"].payload_sha256 == PAYLOAD_SHA
    assert stored["c-2"].payload_sha256 is None
    shown = record_to_json(stored["c-1"])
    assert shown["payload_sha256"] == PAYLOAD_SHA
    assert "payload" not in shown  # input only: the values are not stored
    assert parse_record(shown) == stored["c-1"]


def test_parse_record_raises_the_first_problem() -> None:
    with pytest.raises(RecordError) as caught:
        parse_record(valid(doc_id="", status="x"), line=4)
    assert (caught.value.line, caught.value.field) == (4, "doc_id")
    assert str(caught.value) == 'line 4 (chunk "c-1"), field "doc_id": must not be empty or blank'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-01-01T00:00:00Z", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-01-01 00:00:00z", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-01-01T05:30:00+05:30", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2024-12-31T19:00:00-05:00", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-01-01T00:00:00-00:00", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-01-01T00:00:00.5Z", datetime(2025, 1, 1, 0, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_parse_timestamp(text: str, expected: datetime) -> None:
    parsed = parse_timestamp(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize(
    "text",
    [
        "2025-01-01T00:00:00",
        "2025-01-01T00:00Z",
        "2025-01-01T00:00:00+0100",
        "2025-01-01T00:00:00 UTC",
        "2025-01-01T00:00:60Z",
        "0001-01-01T00:00:00+01:00",
        "\uff12\uff10\uff12\uff15-01-01T00:00:00Z",  # fullwidth digits
    ],
)
def test_parse_timestamp_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_timestamp(text)
