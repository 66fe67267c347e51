"""Chunk records in their JSON Lines form: parsing and validation.

Every malformed record is rejected with its line, its chunk id (when it has
one) and the field named (docs/architecture.md, "The chunk record").
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import TypeVar

from sidecar.core.chunk_record import CONTRACT_FIELDS, ChunkRecord, Status
from sidecar.core.integrity import canonical_fields, canonical_sha256, fields_sha256

# ``payload`` is input only: the loader hashes it into ``payload_sha256``.
RECORD_FIELDS: frozenset[str] = frozenset({*CONTRACT_FIELDS, "payload"})

# Ids and field names come from the file; cap them so one absurd value cannot
# flood an operator's terminal or a log line.
_MAX_QUOTED_CHARS = 80
# A file with thousands of bad lines is usually one systematic mistake; the
# full list stays available on RecordsInvalid.errors.
_MAX_LISTED_ERRORS = 100

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})"
    r"(?:\.([0-9]+))?([Zz]|[+-][0-9]{2}:[0-9]{2})?"
)
_STATUS_VALUES = frozenset(status.value for status in Status)
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
_ANY_CASE_HEX = re.compile(r"[0-9a-fA-F]{64}")

_T = TypeVar("_T")

# Stands in for a missing or invalid effective_at in a record that is rejected anyway.
_NO_TIME = datetime.min.replace(tzinfo=UTC)


def quote_for_message(value: str) -> str:
    """``value`` as a JSON string for an operator's message, cut to 80 characters."""
    if len(value) > _MAX_QUOTED_CHARS:
        value = value[:_MAX_QUOTED_CHARS] + "…"
    # json.dumps escapes control characters, so a value cannot forge extra lines.
    return json.dumps(value, ensure_ascii=False)


class RecordError(ValueError):
    """One problem with one chunk record, located as precisely as is known.

    ``str()`` reads like ``chunks.jsonl line 7 (chunk "c-12"), field "expires_at":
    timestamp has no zone offset``; parts that are unknown are left out. Messages
    never contain chunk text.
    """

    def __init__(
        self,
        message: str,
        *,
        line: int | None = None,
        chunk_id: str | None = None,
        field: str | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.chunk_id = chunk_id
        self.field = field
        self.source = source  # file name, when the record came from a file

    def __str__(self) -> str:
        parts = [self.source] if self.source else []
        if self.line is not None:
            parts.append(f"line {self.line}")
        where = " ".join(parts)
        if self.chunk_id is not None:
            chunk = f"chunk {quote_for_message(self.chunk_id)}"
            where = f"{where} ({chunk})" if where else chunk
        if self.field is not None:
            field = f"field {quote_for_message(self.field)}"
            where = f"{where}, {field}" if where else field
        return f"{where}: {self.message}" if where else self.message


class RecordsInvalid(ValueError):
    """A set of records has problems; none of them may be loaded.

    ``errors`` holds every problem found, ordered by line.
    """

    def __init__(self, errors: list[RecordError]) -> None:
        self.errors = errors
        lines = [f"{len(errors)} problem(s) in chunk records; nothing was loaded:"]
        lines += [f"  {error}" for error in errors[:_MAX_LISTED_ERRORS]]
        if len(errors) > _MAX_LISTED_ERRORS:
            lines.append(f"  ... and {len(errors) - _MAX_LISTED_ERRORS} more")
        super().__init__("\n".join(lines))


def parse_timestamp(value: str) -> datetime:
    """Parse an RFC 3339 timestamp that carries a zone into an aware UTC datetime.

    The zone is ``Z`` or ``±hh:mm``; a timestamp without one is an error, never
    local time. Fractional digits beyond microseconds are truncated. Raises
    ValueError with a message fit for an operator.
    """
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise ValueError("not an RFC 3339 timestamp (expected e.g. 2024-05-01T00:00:00Z)")
    year, month, day, hour, minute, second, fraction, zone = match.groups()
    if zone is None:
        raise ValueError("timestamp has no zone offset (add Z or ±hh:mm)")
    if zone in ("Z", "z"):
        tz = UTC
    else:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError("zone offset out of range")
        offset = timedelta(hours=hours, minutes=minutes)
        tz = timezone(-offset if zone[0] == "-" else offset)
    micro = int((fraction or "")[:6].ljust(6, "0"))
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, tzinfo=tz
        )
        return moment.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError("not a valid date and time (leap seconds are not supported)") from None


def format_timestamp(moment: datetime) -> str:
    """An aware datetime as RFC 3339 in UTC with zone ``Z`` (``parse_timestamp`` reads it back).

    Raises ValueError for a naive datetime: its zone would be a guess.
    """
    if moment.utcoffset() is None:
        raise ValueError("timestamp has no time zone; refusing to guess one")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def record_to_json(record: ChunkRecord, *, with_text: bool = True) -> dict[str, object]:
    """The record in its JSON Lines form, which ``parse_record`` accepts again.

    Only contract fields are included (not ``signature_valid``, nor the
    ``payload`` that ``payload_sha256`` may have been computed from). With
    ``with_text=False`` the ``text`` field is left out, so that the chunk's
    content does not end up on a terminal or in a log.
    """
    obj: dict[str, object] = {
        "chunk_id": record.chunk_id,
        "doc_id": record.doc_id,
        "version": record.version,
        "tenant_id": record.tenant_id,
        "allowed_principals": list(record.allowed_principals),
        "status": Status(record.status).value,
        "effective_at": format_timestamp(record.effective_at),
        "expires_at": None if record.expires_at is None else format_timestamp(record.expires_at),
        "sha256": record.sha256,
        "source_uri": record.source_uri,
        "superseded_by": record.superseded_by,
        "requires_signature": record.requires_signature,
    }
    if with_text:
        obj["text"] = record.text
    obj["payload_sha256"] = record.payload_sha256
    return obj


def parse_record(obj: object, *, line: int | None = None, source: str | None = None) -> ChunkRecord:
    """Validate one decoded JSON value against the record contract.

    Raises RecordError for the first problem found (``load_jsonl`` reports all of
    them). Timestamps come back in UTC; absent optional fields get their defaults.
    When ``text`` is present its canonical hash must equal ``sha256``; a mismatch
    is reported on the field ``text``. ``payload`` (field path -> value) gives
    ``payload_sha256`` its value, or must agree with it when both are present.
    """
    result = _validate(obj, line, source)
    if isinstance(result, ChunkRecord):
        return result
    raise result[0]


def load_jsonl(path: Path) -> list[ChunkRecord]:
    """Read and validate a JSON Lines file of chunk records, all or nothing.

    Blank lines are allowed; a UTF-8 byte order mark is ignored. Every problem in
    the file is collected, including duplicate chunk ids and approved versions
    of one document that are valid at the same time for an overlapping audience;
    if there is any, RecordsInvalid is raised and no record is returned.
    """
    source = path.name
    loaded: list[tuple[int, ChunkRecord]] = []
    errors: list[RecordError] = []
    with path.open("rb") as lines:
        for line, raw in enumerate(lines, start=1):
            if line == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            if not raw.strip():
                continue
            try:
                obj = _decode_line(raw)
            except _DuplicateKey as exc:
                chunk_id = _chunk_id_of(raw)
                errors.append(
                    RecordError(
                        "key appears twice",
                        line=line,
                        chunk_id=chunk_id,
                        field=exc.key,
                        source=source,
                    )
                )
                continue
            except ValueError as exc:
                errors.append(RecordError(str(exc), line=line, source=source))
                continue
            result = _validate(obj, line, source)
            if isinstance(result, ChunkRecord):
                loaded.append((line, result))
            else:
                errors.extend(result)
    errors.extend(_duplicate_ids(loaded, source))
    errors.extend(_overlapping_versions(loaded, source))
    if errors:
        errors.sort(key=lambda error: error.line or 0)
        raise RecordsInvalid(errors)
    return [record for _, record in loaded]


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _reject_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    # The stdlib keeps the last of two equal keys silently; in an authoritative
    # record ("status": "revoked", ..., "status": "approved") that is a trap.
    obj: dict[str, object] = {}
    for key, value in pairs:
        if key in obj:
            raise _DuplicateKey(key)
        obj[key] = value
    return obj


def _chunk_id_of(raw: bytes) -> str | None:
    """The chunk id of a line whose object repeats a key, when it names exactly one."""
    try:
        pairs = json.loads(raw, object_pairs_hook=lambda found: found)
    except (ValueError, RecursionError):  # the name is a courtesy; the line is refused anyway
        return None
    if not isinstance(pairs, list) or not all(isinstance(p, tuple) for p in pairs):
        return None
    ids = [value for key, value in pairs if key == "chunk_id"]
    if len(ids) == 1 and isinstance(ids[0], str) and ids[0].strip():
        return str(ids[0])
    return None


def _decode_line(raw: bytes) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not valid UTF-8 (byte {exc.start + 1} of the line)") from None
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError("not valid JSON: nested too deeply") from None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_json_type(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("contains a lone surrogate (not valid Unicode)") from None
    return value


def _identifier(value: object) -> str:
    text = _string(value)
    if not text.strip():
        raise ValueError("must not be empty or blank")
    return text


def _or_null(parse: Callable[[object], _T]) -> Callable[[object], _T | None]:
    def parse_or_null(value: object) -> _T | None:
        return None if value is None else parse(value)

    return parse_or_null


def _principals(value: object) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise ValueError(f"expected a non-empty array of strings, got {_json_type(value)}")
    if not value:
        raise ValueError("must not be empty")
    principals = []
    for index, item in enumerate(value):
        try:
            principals.append(_identifier(item))
        except ValueError as exc:
            raise ValueError(f"item {index}: {exc}") from None
    return tuple(principals)


def _status(value: object) -> Status:
    if isinstance(value, str) and value in _STATUS_VALUES:
        return Status(value)
    got = quote_for_message(value) if isinstance(value, str) else _json_type(value)
    raise ValueError(f"must be one of {', '.join(Status)}; got {got}")


def _timestamp(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError(f"expected an RFC 3339 timestamp string, got {_json_type(value)}")
    return parse_timestamp(value)


def _sha256(value: object) -> str:
    digest = _string(value)
    if _SHA256_HEX.fullmatch(digest):
        return digest
    if _ANY_CASE_HEX.fullmatch(digest):
        raise ValueError("hex digits must be lowercase")
    raise ValueError("must be 64 lowercase hexadecimal digits")


def _payload(value: object) -> str:
    """The canonical JSON (integrity.canonical_fields) of a record's ``payload``."""
    if not isinstance(value, Mapping):
        raise ValueError(f"expected an object of field path -> value, got {_json_type(value)}")
    if any(not str(path).strip() for path in value):
        raise ValueError("a field path is empty or blank")
    return canonical_fields(value)


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_json_type(value)}")
    return value


def _validate(obj: object, line: int | None, source: str | None) -> ChunkRecord | list[RecordError]:
    """The record, or every problem found in it (in field order)."""
    if not isinstance(obj, Mapping):
        message = f"expected a JSON object, got {_json_type(obj)}"
        return [RecordError(message, line=line, source=source)]
    raw_id = obj.get("chunk_id")
    context_id = raw_id if isinstance(raw_id, str) and raw_id.strip() else None
    errors: list[RecordError] = []

    def fail(field: str, message: str) -> None:
        errors.append(
            RecordError(message, line=line, chunk_id=context_id, field=field, source=source)
        )

    def field(name: str, parse: Callable[[object], _T], absent: _T, *, required: bool) -> _T:
        # ``absent`` is the default for an optional field; for a required one it
        # is a placeholder that never escapes, because an error is recorded.
        if name not in obj:
            if required:
                fail(name, "required field is missing")
            return absent
        try:
            return parse(obj[name])
        except ValueError as exc:
            fail(name, str(exc))
            return absent

    for name in obj:
        if name not in RECORD_FIELDS:
            fail(str(name), "unknown field")
    record = ChunkRecord(
        chunk_id=field("chunk_id", _identifier, "", required=True),
        doc_id=field("doc_id", _identifier, "", required=True),
        version=field("version", _string, "", required=False),
        tenant_id=field("tenant_id", _identifier, "", required=True),
        allowed_principals=field("allowed_principals", _principals, (), required=True),
        status=field("status", _status, Status.DRAFT, required=True),
        effective_at=field("effective_at", _timestamp, _NO_TIME, required=True),
        expires_at=field("expires_at", _or_null(_timestamp), None, required=False),
        sha256=field("sha256", _sha256, "", required=True),
        source_uri=field("source_uri", _string, "", required=False),
        superseded_by=field("superseded_by", _or_null(_identifier), None, required=False),
        requires_signature=field("requires_signature", _flag, False, required=False),
        text=field("text", _or_null(_string), None, required=False),
        payload_sha256=field("payload_sha256", _or_null(_sha256), None, required=False),
    )
    payload = field("payload", _or_null(_payload), None, required=False)
    # Checks across fields; a placeholder (empty, _NO_TIME) never fails one.
    effective_at, expires_at = record.effective_at, record.expires_at
    if effective_at is not _NO_TIME and expires_at is not None and expires_at <= effective_at:
        fail("expires_at", "must be after effective_at")
    if record.superseded_by is not None and record.superseded_by == record.chunk_id:
        fail("superseded_by", "a chunk cannot supersede itself")
    if record.text is not None and record.sha256:
        actual = canonical_sha256(record.text)
        if actual != record.sha256:
            fail("text", f"canonical SHA-256 of text is {actual}, which does not match sha256")
    if payload is not None:
        computed = fields_sha256(payload)
        if record.payload_sha256 is None:
            record = dataclasses.replace(record, payload_sha256=computed)
        elif computed != record.payload_sha256:
            fail(
                "payload",
                f"SHA-256 of the canonical payload is {computed}, "
                "which does not match payload_sha256",
            )
    return errors or record


def _duplicate_ids(loaded: Iterable[tuple[int, ChunkRecord]], source: str) -> list[RecordError]:
    errors = []
    first_line: dict[str, int] = {}
    for line, record in loaded:
        first = first_line.setdefault(record.chunk_id, line)
        if first != line:
            errors.append(
                RecordError(
                    f"chunk_id already defined on line {first}",
                    line=line,
                    chunk_id=record.chunk_id,
                    field="chunk_id",
                    source=source,
                )
            )
    return errors


def _overlapping_versions(
    loaded: Iterable[tuple[int, ChunkRecord]], source: str
) -> list[RecordError]:
    """Approved records of one document whose versions are valid at once.

    Two different approved versions of a document must not both be valid for the
    same reader at the same instant: the gate could not tell which one is the
    authority. Each conflict is reported once, on the record that starts later.
    """
    groups: dict[tuple[str, str], list[tuple[int, ChunkRecord]]] = defaultdict(list)
    for line, record in loaded:
        if record.status is Status.APPROVED:
            groups[(record.tenant_id, record.doc_id)].append((line, record))
    errors = []
    for members in groups.values():
        if len({record.version for _, record in members}) < 2:
            continue
        members.sort(key=lambda member: (member[1].effective_at, member[0]))
        # Sweep in order of start: earlier records still valid at this start,
        # kept per version so that a document's many chunks of one version are
        # never compared with each other.
        active: dict[str, list[tuple[int, ChunkRecord]]] = defaultdict(list)
        for line, record in members:
            conflict = None
            for version, others in active.items():
                if version == record.version:
                    continue
                # Those no longer valid at this start cannot overlap any later one.
                others[:] = [o for o in others if _valid_at(o[1], record.effective_at)]
                conflict = next((o for o in others if versions_overlap(o[1], record)), None)
                if conflict is not None:
                    break
            if conflict is not None:
                other_line, other = conflict
                version = quote_for_message(record.version)
                document = quote_for_message(record.doc_id)
                other_version = quote_for_message(other.version)
                errors.append(
                    RecordError(
                        f"approved version {version} of document {document} is valid at the "
                        f"same time as approved version {other_version} on line {other_line} "
                        f"for an overlapping "
                        f"audience; set expires_at on line {other_line} to at most this "
                        f"effective_at, or narrow the audience",
                        line=line,
                        chunk_id=record.chunk_id,
                        field="effective_at",
                        source=source,
                    )
                )
            active[record.version].append((line, record))
    return errors


def versions_overlap(one: ChunkRecord, other: ChunkRecord) -> bool:
    """True when ``one`` and ``other`` are approved records of different versions of one
    document (tenant and doc_id) that are valid at the same instant for a shared
    principal: the gate could not tell which version is the authority.

    Records of the same version never overlap (a version has many chunks).
    """
    return (
        one.status is Status.APPROVED
        and other.status is Status.APPROVED
        and one.version != other.version
        and one.doc_id == other.doc_id
        and one.tenant_id == other.tenant_id
        and one.effective_at < _end(other)
        and other.effective_at < _end(one)
        and not frozenset(one.allowed_principals).isdisjoint(other.allowed_principals)
    )


def _end(record: ChunkRecord) -> datetime:
    return datetime.max.replace(tzinfo=UTC) if record.expires_at is None else record.expires_at


def _valid_at(record: ChunkRecord, moment: datetime) -> bool:
    return record.effective_at <= moment and (
        record.expires_at is None or moment < record.expires_at
    )
