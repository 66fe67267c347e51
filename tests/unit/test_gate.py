"""The decision core: every reason code, their order, and the validity boundaries."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sidecar.config import default_policy_dir
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.integrity import canonical_fields, fields_sha256
from sidecar.core.policy import PolicyError, policy_input, to_epoch_ns
from sidecar.core.reasons import BUILTIN_ORDER, Reason, ReasonOrder
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.store.loader import parse_record
from tests.fixtures.records import EFFECTIVE, record_dict, text_for

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))


@pytest.fixture(scope="module")
def gate() -> DecisionCore:
    return DecisionCore(RegorusEngine.from_directory(default_policy_dir()))


def record(chunk_id: str, **overrides: Any) -> ChunkRecord:
    return parse_record(record_dict(chunk_id, **overrides))


def candidate(chunk_id: str | None, position: int = 0, text: str | None = "") -> Candidate:
    if text == "" and chunk_id is not None:
        text = text_for(chunk_id)
    return Candidate(position=position, chunk_id=chunk_id, text=text)


def decide_one(
    gate: DecisionCore,
    rec: ChunkRecord | None,
    *,
    cand: Candidate | None = None,
    caller: Caller = ALICE,
    now: datetime = NOW,
    unavailable: frozenset[str] = frozenset(),
) -> tuple[str, ...]:
    cand = cand or candidate(rec.chunk_id if rec else "absent")
    records = {rec.chunk_id: rec} if rec else {}
    verdict = gate.decide(caller, [cand], records, unavailable, now)
    assert len(verdict.decisions) == 1
    return verdict.decisions[0].reasons


def test_approved_chunk_for_an_allowed_caller_is_admitted(gate: DecisionCore) -> None:
    assert decide_one(gate, record("c1")) == ()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"tenant_id": "globex"}, Reason.TENANT_MISMATCH),
        ({"allowed_principals": ["group:hr"]}, Reason.PRINCIPAL_MISMATCH),
        ({"status": "draft"}, Reason.STATUS_DRAFT),
        ({"status": "superseded", "superseded_by": "c9"}, Reason.STATUS_SUPERSEDED),
        ({"status": "revoked"}, Reason.STATUS_REVOKED),
        ({"status": "quarantined"}, Reason.STATUS_QUARANTINED),
        ({"effective_at": "2027-01-01T00:00:00Z"}, Reason.NOT_YET_EFFECTIVE),
        ({"expires_at": "2026-01-01T00:00:00+00:00"}, Reason.EXPIRED),
        ({"sha256": "0" * 64}, Reason.HASH_MISMATCH),
    ],
)
def test_each_record_check_yields_its_reason(
    gate: DecisionCore, overrides: dict[str, Any], expected: Reason
) -> None:
    assert decide_one(gate, record("c1", **overrides)) == (expected,)


def test_signature_required_but_not_valid_is_signature_missing(gate: DecisionCore) -> None:
    unsigned = record("c1", requires_signature=True)
    assert decide_one(gate, unsigned) == (Reason.SIGNATURE_MISSING,)
    signed = dataclasses.replace(unsigned, signature_valid=True)
    assert decide_one(gate, signed) == ()
    tampered = dataclasses.replace(unsigned, sha256="0" * 64)
    assert decide_one(gate, tampered) == (Reason.HASH_MISMATCH, Reason.SIGNATURE_MISSING)


def test_chunk_without_id_or_text_is_malformed(gate: DecisionCore) -> None:
    verdict = gate.decide(
        ALICE,
        [
            Candidate(0, None, "text", problem="hit has no id"),
            Candidate(1, "c1", None, problem="payload has no text"),
        ],
        {"c1": record("c1")},
        frozenset(),
        NOW,
    )
    assert [d.reasons for d in verdict.decisions] == [
        (Reason.MALFORMED_CHUNK,),
        (Reason.MALFORMED_CHUNK,),
    ]
    assert verdict.decisions[1].detail == "payload has no text"


def test_chunk_unknown_to_the_store_is_missing_metadata(gate: DecisionCore) -> None:
    assert decide_one(gate, None) == (Reason.MISSING_METADATA,)


def test_chunk_the_store_could_not_answer_for_is_metadata_unavailable(gate: DecisionCore) -> None:
    reasons = decide_one(gate, record("c1"), unavailable=frozenset({"c1"}))
    assert reasons == (Reason.METADATA_UNAVAILABLE,)


def test_all_reasons_are_listed_in_canonical_order(gate: DecisionCore) -> None:
    rec = record(
        "c1",
        tenant_id="globex",
        allowed_principals=["group:hr"],
        status="revoked",
        effective_at="2025-01-01T00:00:00Z",
        expires_at="2026-01-01T00:00:00Z",
        sha256="f" * 64,
    )
    reasons = decide_one(gate, rec)
    assert reasons == (
        Reason.TENANT_MISMATCH,
        Reason.PRINCIPAL_MISMATCH,
        Reason.STATUS_REVOKED,
        Reason.EXPIRED,
        Reason.HASH_MISMATCH,
    )
    assert list(reasons) == sorted(reasons, key=BUILTIN_ORDER.index)


def test_now_equal_to_effective_at_is_admitted(gate: DecisionCore) -> None:
    assert decide_one(gate, record("c1"), now=EFFECTIVE) == ()
    assert decide_one(gate, record("c1"), now=EFFECTIVE - timedelta(microseconds=1)) == (
        Reason.NOT_YET_EFFECTIVE,
    )


def test_validity_boundaries_beyond_the_64_bit_range_keep_their_order(gate: DecisionCore) -> None:
    # Nanoseconds past 2262 do not fit Rego's integers; one such record must not
    # fail the whole batch (POLICY_ERROR for every chunk), nor be misread.
    late = record("c1", expires_at="2999-01-01T00:00:00Z")
    early = record("c2", effective_at="1500-01-01T00:00:00Z")
    future = record("c3", effective_at="2999-01-01T00:00:00Z")
    verdict = gate.decide(
        ALICE,
        [candidate("c1"), candidate("c2", 1), candidate("c3", 2)],
        {r.chunk_id: r for r in (late, early, future)},
        frozenset(),
        NOW,
    )
    assert [d.reasons for d in verdict.decisions] == [(), (), (Reason.NOT_YET_EFFECTIVE,)]
    assert to_epoch_ns(datetime(2999, 1, 1, tzinfo=UTC)) == 2**63 - 1


def test_now_equal_to_expires_at_is_expired(gate: DecisionCore) -> None:
    rec = record("c1", expires_at="2026-06-01T12:00:00Z")
    assert decide_one(gate, rec, now=NOW) == (Reason.EXPIRED,)
    assert decide_one(gate, rec, now=NOW - timedelta(microseconds=1)) == ()


def test_hash_is_checked_on_canonical_text(gate: DecisionCore) -> None:
    crlf = candidate("c1", text=text_for("c1").replace("\n", "\r\n"))
    assert decide_one(gate, record("c1"), cand=crlf) == ()
    edited = candidate("c1", text=text_for("c1") + " ")
    assert decide_one(gate, record("c1"), cand=edited) == (Reason.HASH_MISMATCH,)


def test_lone_surrogate_text_is_a_hash_mismatch_not_a_crash(gate: DecisionCore) -> None:
    odd = candidate("c1", text="broken \ud800 text")
    assert decide_one(gate, record("c1"), cand=odd) == (Reason.HASH_MISMATCH,)


def test_everything_rejected_is_a_valid_empty_result(gate: DecisionCore) -> None:
    verdict = gate.decide(
        ALICE,
        [candidate("c1", 0), candidate("c2", 1)],
        {"c1": record("c1", status="revoked"), "c2": record("c2", tenant_id="globex")},
        frozenset(),
        NOW,
    )
    assert verdict.admitted_positions == frozenset()
    assert [d.admitted for d in verdict.decisions] == [False, False]


def test_repeated_chunk_in_a_batch_is_decided_at_every_position(gate: DecisionCore) -> None:
    verdict = gate.decide(
        ALICE,
        [candidate("c1", 0), candidate("c2", 1), candidate("c1", 2)],
        {"c1": record("c1"), "c2": record("c2", status="draft")},
        frozenset(),
        NOW,
    )
    assert verdict.admitted_positions == frozenset({0, 2})


def test_naive_clock_is_refused(gate: DecisionCore) -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        gate.decide(ALICE, [], {}, frozenset(), datetime(2026, 1, 1))


class _ScriptedEngine:
    """A policy engine whose answer a test dictates (for error and custom-reason paths)."""

    version = "scripted"
    time_pure = False
    remote = False

    def __init__(self, answer: Mapping[str, list[str]] | Exception) -> None:
        self._answer = answer

    def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
        if isinstance(self._answer, Exception):
            raise self._answer
        return self._answer


def test_policy_error_rejects_with_policy_error() -> None:
    gate = DecisionCore(_ScriptedEngine(PolicyError("boom")))
    verdict = gate.decide(ALICE, [candidate("c1")], {"c1": record("c1")}, frozenset(), NOW)
    assert verdict.decisions[0].reasons == (Reason.POLICY_ERROR,)
    assert verdict.policy_failed


def test_policy_silent_about_a_chunk_rejects_it() -> None:
    gate = DecisionCore(_ScriptedEngine({}))
    verdict = gate.decide(ALICE, [candidate("c1")], {"c1": record("c1")}, frozenset(), NOW)
    assert verdict.decisions[0].reasons == (Reason.POLICY_ERROR,)


def test_declared_custom_reason_is_kept_and_undeclared_becomes_policy_deny() -> None:
    answer = {"c1": ["EXPORT_CONTROLLED"], "c2": ["SOMETHING_ELSE"]}
    gate = DecisionCore(_ScriptedEngine(answer), ReasonOrder(["EXPORT_CONTROLLED"]))
    verdict = gate.decide(
        ALICE,
        [candidate("c1", 0), candidate("c2", 1)],
        {"c1": record("c1"), "c2": record("c2")},
        frozenset(),
        NOW,
    )
    assert [d.reasons for d in verdict.decisions] == [("EXPORT_CONTROLLED",), ("POLICY_DENY",)]


def test_custom_reasons_rank_after_signature_and_before_policy_deny() -> None:
    order = ReasonOrder(["EXPORT_CONTROLLED"])
    assert order.sort(["POLICY_DENY", "EXPORT_CONTROLLED", "SIGNATURE_MISSING"]) == (
        "SIGNATURE_MISSING",
        "EXPORT_CONTROLLED",
        "POLICY_DENY",
    )


def test_policy_input_uses_integer_nanoseconds_and_one_entry_per_record() -> None:
    document = policy_input(ALICE, [record("c1", expires_at="2027-01-01T00:00:00Z")], NOW)
    chunk = document["chunks"][0]
    assert document["now_ns"] == to_epoch_ns(NOW) == 1780315200000000000
    assert chunk["effective_at_ns"] == to_epoch_ns(EFFECTIVE)
    assert isinstance(chunk["expires_at_ns"], int)
    assert document["caller"] == {
        "tenant": "acme",
        "principals": ["group:qa", "user:alice"],
        "drafts_allowed": False,
    }


def test_policy_is_evaluated_once_per_response() -> None:
    calls: list[int] = []

    class Counting(_ScriptedEngine):
        def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
            calls.append(len(policy_input["chunks"]))
            return {c["id"]: [] for c in policy_input["chunks"]}

    gate = DecisionCore(Counting({}))
    cands = [candidate(f"c{i % 5}", i) for i in range(20)]
    records = {f"c{i}": record(f"c{i}") for i in range(5)}
    gate.decide(ALICE, cands, records, frozenset(), NOW)
    assert calls == [5]


# --- hashed payload fields -----------------------------------------------------------------

FIELDS = {"title": "Refunds", "metadata.source": "kb/7"}


def with_fields(chunk_id: str, values: Mapping[str, object] = FIELDS) -> Candidate:
    return dataclasses.replace(candidate(chunk_id), fields=canonical_fields(values))


def payload_record(
    chunk_id: str, values: Mapping[str, object] = FIELDS, **overrides: Any
) -> ChunkRecord:
    return record(chunk_id, payload=dict(values), **overrides)


def decide_detail(
    gate: DecisionCore, rec: ChunkRecord, cand: Candidate
) -> tuple[tuple[str, ...], str | None]:
    [decision] = gate.decide(ALICE, [cand], {rec.chunk_id: rec}, frozenset(), NOW).decisions
    return decision.reasons, decision.detail


def test_hashed_fields_matching_the_record_are_admitted(gate: DecisionCore) -> None:
    rec = payload_record("c1")
    assert rec.payload_sha256 == fields_sha256(canonical_fields(FIELDS))
    # Same fields in another order, and decomposed where the record has composed text.
    reordered = {"metadata.source": "kb/7", "title": "Refunds"}
    assert decide_detail(gate, rec, with_fields("c1", reordered)) == ((), None)
    accented = payload_record("c2", {"title": "Caf\u00e9"})
    assert decide_one(gate, accented, cand=with_fields("c2", {"title": "Cafe\u0301"})) == ()


@pytest.mark.parametrize(
    "tampered",
    [
        {"title": "Refunds (edited)", "metadata.source": "kb/7"},
        {"title": "Refunds", "metadata.source": "evil.example"},
        {"title": "Refunds"},  # a declared field removed from the hit
        {"title": "Refunds", "metadata.source": "kb/7", "metadata.author": "x"},
        {"title": "Refunds", "metadata.source": None},
    ],
)
def test_tampered_fields_are_a_payload_hash_mismatch(
    gate: DecisionCore, tampered: dict[str, object]
) -> None:
    reasons, detail = decide_detail(gate, payload_record("c1"), with_fields("c1", tampered))
    assert reasons == (Reason.PAYLOAD_HASH_MISMATCH,)
    assert detail is None


def test_record_without_payload_hash_rejects_hashed_fields(gate: DecisionCore) -> None:
    reasons, detail = decide_detail(gate, record("c1"), with_fields("c1"))
    assert reasons == (Reason.PAYLOAD_HASH_MISMATCH,)
    assert detail == "record has no payload_sha256"
    assert "Refunds" not in detail


def test_candidate_without_fields_is_not_checked(gate: DecisionCore) -> None:
    assert decide_one(gate, payload_record("c1")) == ()  # the format declares no hashed field
    assert decide_one(gate, record("c1")) == ()


def test_payload_mismatch_ranks_between_hash_mismatch_and_signature_missing(
    gate: DecisionCore,
) -> None:
    rec = payload_record("c1", sha256="0" * 64, requires_signature=True, status="revoked")
    cand = with_fields("c1", {"title": "edited"})
    assert decide_one(gate, rec, cand=cand) == (
        Reason.STATUS_REVOKED,
        Reason.HASH_MISMATCH,
        Reason.PAYLOAD_HASH_MISMATCH,
        Reason.SIGNATURE_MISSING,
    )
    order = list(BUILTIN_ORDER)
    assert order.index("PAYLOAD_HASH_MISMATCH") == order.index("HASH_MISMATCH") + 1


def test_unencodable_fields_are_a_mismatch_not_a_crash(gate: DecisionCore) -> None:
    odd = dataclasses.replace(candidate("c1"), fields='{"title":"\ud800"}')
    assert decide_one(gate, payload_record("c1"), cand=odd) == (Reason.PAYLOAD_HASH_MISMATCH,)


def test_payload_check_runs_with_a_warm_verdict_cache() -> None:
    cached = DecisionCore(RegorusEngine.from_directory(default_policy_dir()))
    assert cached.verdict_cache is not None
    rec = payload_record("c1")
    assert decide_one(cached, rec, cand=with_fields("c1")) == ()
    verdict = cached.decide(
        ALICE, [with_fields("c1", {"title": "edited"})], {"c1": rec}, frozenset(), NOW
    )
    assert verdict.verdicts_cached == 1
    assert verdict.decisions[0].reasons == (Reason.PAYLOAD_HASH_MISMATCH,)
