"""The typed audit record and its JSON form (field names are part of the interface)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
from hypothesis import given
from hypothesis import strategies as st

from sidecar.audit.record import (
    UPSTREAM_TEXT_BYTES,
    AuditRecord,
    Release,
    Substitution,
    UpstreamError,
    upstream_text,
)
from sidecar.core.decision import ChunkDecision, Verdict
from sidecar.core.modes import Mode
from sidecar.core.outcome import Outcome

TIME = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def _record(
    verdict: Verdict | None = None, release: Release | None = None, error: str | None = None
) -> AuditRecord:
    return AuditRecord(
        decision_id="d1",
        request_id="r1",
        time=TIME,
        tenant="acme",
        principals_sha256="ab" * 32,
        format="qdrant",
        mode=Mode.ENFORCE,
        outcome=Outcome.FILTERED,
        latency_ms=0.5,
        verdict=verdict,
        release=release,
        error=error,
    )


def _verdict(*decisions: ChunkDecision) -> Verdict:
    return Verdict(decisions=decisions, policy_version="v1", policy_failed=False)


def test_a_decided_record_in_its_json_form() -> None:
    verdict = _verdict(
        ChunkDecision(0, "a", ()),
        ChunkDecision(1, "b", ("EXPIRED",)),
        ChunkDecision(2, None, ("MALFORMED_CHUNK",), "no payload"),
    )
    release = Release(["a"], tenant_filter=True, overfetched=False)
    assert orjson.loads(orjson.dumps(_record(verdict, release).to_dict())) == {
        "decision_id": "d1",
        "request_id": "r1",
        "time": "2026-06-01T12:00:00.000000+00:00",
        "tenant": "acme",
        "principals_sha256": "ab" * 32,
        "format": "qdrant",
        "mode": "enforce",
        "policy_version": "v1",
        "candidates": ["a", "b", None],
        "rejected": [
            {"position": 1, "chunk_id": "b", "reasons": ["EXPIRED"]},
            {
                "position": 2,
                "chunk_id": None,
                "reasons": ["MALFORMED_CHUNK"],
                "detail": "no payload",
            },
        ],
        "admitted": ["a"],
        "latency_ms": 0.5,
        "tenant_filter": True,
        "overfetched": False,
        "released": ["a"],
        "outcome": "filtered",
    }


def test_substitutes_replace_the_admitted_list_and_are_listed() -> None:
    verdict = _verdict(ChunkDecision(0, "old", ("STATUS_SUPERSEDED",)))
    release = Release(
        ["new"],
        tenant_filter=False,
        overfetched=False,
        admitted=["new"],
        substituted=[Substitution(0, "old", "new")],
    )
    out = _record(verdict, release).to_dict()
    assert out["admitted"] == ["new"]
    assert out["substituted"] == [{"position": 0, "chunk_id": "old", "substitute": "new"}]
    assert "refusal" not in out


def test_a_refused_response_names_its_refusal() -> None:
    verdict = _verdict(ChunkDecision(0, "a", ("EXPIRED",)))
    release = Release([], tenant_filter=False, overfetched=False, refusal="rejected_chunks")
    out = _record(verdict, release).to_dict()
    assert out["refusal"] == "rejected_chunks"
    assert out["released"] == []


def test_an_unreadable_body_has_an_error_and_no_decision_fields() -> None:
    out = _record(error="upstream_body_malformed").to_dict()
    assert out["error"] == "upstream_body_malformed"
    assert not {"candidates", "rejected", "admitted", "released", "refusal"} & out.keys()


def test_an_upstream_error_keeps_its_status_and_text_and_no_decision_fields() -> None:
    record = _record(error="upstream_error")
    record.upstream = UpstreamError.from_body(503, b'{"error":"shard failed"}')
    out = record.to_dict()
    assert out["error"] == "upstream_error"
    assert (out["upstream_status"], out["upstream_code"], out["upstream_text"]) == (
        503,
        "http:503",
        '{"error":"shard failed"}',
    )
    assert not {"candidates", "rejected", "admitted", "released", "refusal"} & out.keys()
    assert "upstream_status" not in _record(error="upstream_body_malformed").to_dict()


def test_an_error_reported_inside_an_answer_keeps_the_databases_code() -> None:
    record = _record(error="upstream_error")
    record.upstream = UpstreamError.from_text(200, "milvus:1100", "field tenant not exist")
    out = record.to_dict()
    assert (out["upstream_status"], out["upstream_code"], out["upstream_text"]) == (
        200,
        "milvus:1100",
        "field tenant not exist",
    )


def test_an_error_text_is_bounded_to_its_first_kib_as_utf8() -> None:
    # A three-byte character cut at the bound: 341 whole ones, then U+FFFD.
    upstream = UpstreamError.from_text(200, "milvus:1100", "€" * 1000)
    assert upstream.text == "€" * 341 + "\ufffd"
    assert len(upstream.text.encode()) <= UPSTREAM_TEXT_BYTES + 2


@given(st.binary(max_size=3 * UPSTREAM_TEXT_BYTES))
def test_upstream_text_is_the_first_kib_as_valid_text(body: bytes) -> None:
    text = upstream_text(body)
    assert text == body[:UPSTREAM_TEXT_BYTES].decode("utf-8", "replace")
    assert len(text) <= UPSTREAM_TEXT_BYTES
    orjson.dumps(text)  # always serialisable: no lone surrogates


def test_a_character_cut_at_the_bound_becomes_a_replacement_character() -> None:
    body = b"x" * (UPSTREAM_TEXT_BYTES - 1) + "é".encode() + b"tail"
    assert upstream_text(body) == "x" * (UPSTREAM_TEXT_BYTES - 1) + "\ufffd"
