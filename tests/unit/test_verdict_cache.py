"""The verdict cache: Rego reasons per (caller, record, policy version) and validity interval.

What it must never do: outlive a revocation or any other change of a record,
answer across a validity boundary, share an answer between callers or policy
versions, or cache anything that depends on the returned text. The property
test at the end checks the whole contract at once: a gate with the cache
decides exactly as a gate without it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.config import default_policy_dir
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.decision_core import DEFAULT_VERDICT_CACHE_SIZE, DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.policy import PolicyError, to_epoch_ns
from sidecar.core.reasons import Reason
from sidecar.core.verdict_cache import VerdictCache
from sidecar.rego.purity import time_pure_rule
from sidecar.rego.regorus_engine import RegorusEngine, read_rego_sources
from sidecar.store.loader import parse_record
from tests.fixtures.records import EFFECTIVE, record_dict, text_for

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))
TICK = timedelta(microseconds=1)
REAL = RegorusEngine.from_directory(default_policy_dir())


class Counting:
    """A real policy engine that counts the chunks it is asked to evaluate."""

    def __init__(self, engine: Any = REAL, version: str | None = None) -> None:
        self._engine = engine
        self.version = version or engine.version
        self.time_pure = engine.time_pure
        self.remote = False
        self.evaluated: list[list[str]] = []
        self.fail = False

    def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
        self.evaluated.append([c["id"] for c in policy_input["chunks"]])
        if self.fail:
            raise PolicyError("engine down")
        result: Mapping[str, list[str]] = self._engine.evaluate(policy_input)
        return result


def record(chunk_id: str = "c1", **overrides: Any) -> ChunkRecord:
    return parse_record(record_dict(chunk_id, **overrides))


def candidate(chunk_id: str, position: int = 0, text: str | None = None) -> Candidate:
    return Candidate(position, chunk_id, text_for(chunk_id) if text is None else text)


def decide(
    gate: DecisionCore,
    *records: ChunkRecord,
    caller: Caller = ALICE,
    now: datetime = NOW,
    texts: Mapping[str, str] | None = None,
) -> list[tuple[str, ...]]:
    texts = texts or {}
    candidates = [candidate(r.chunk_id, i, texts.get(r.chunk_id)) for i, r in enumerate(records)]
    verdict = gate.decide(caller, candidates, {r.chunk_id: r for r in records}, frozenset(), now)
    return [d.reasons for d in verdict.decisions]


@pytest.fixture
def engine() -> Counting:
    return Counting()


@pytest.fixture
def gate(engine: Counting) -> DecisionCore:
    return DecisionCore(engine)


# The declaration


def test_the_bundled_policy_declares_itself_time_pure() -> None:
    assert REAL.time_pure is True
    cache = DecisionCore(REAL).verdict_cache
    assert cache is not None
    assert cache.maxsize == DEFAULT_VERDICT_CACHE_SIZE


def without_declaration() -> dict[str, str]:
    sources = read_rego_sources(default_policy_dir(), include_tests=False)
    text = sources["chunks.rego"]
    assert "time_pure := true\n" in text
    return {**sources, "chunks.rego": text.replace("time_pure := true\n", "")}


def test_a_policy_without_the_declaration_gets_no_cache() -> None:
    engine = Counting(RegorusEngine(without_declaration()))
    assert engine.time_pure is False
    gate = DecisionCore(engine)
    assert gate.verdict_cache is None
    decide(gate, record())
    decide(gate, record())
    assert engine.evaluated == [["c1"], ["c1"]]


def test_an_engine_that_declares_itself_not_time_pure_gets_no_cache() -> None:
    class Plain:
        version = "plain"
        time_pure = False
        remote = False

        def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
            return {c["id"]: [] for c in policy_input["chunks"]}

    assert DecisionCore(Plain()).verdict_cache is None


@pytest.mark.parametrize(
    ("declaration", "expected"),
    [("time_pure := false", False), ("time_pure := true", True), ("", False)],
)
def test_only_exactly_true_declares(declaration: str, expected: bool) -> None:
    sources = without_declaration()
    sources["chunks.rego"] += f"\n{declaration}\n"
    assert RegorusEngine(sources).time_pure is expected


@pytest.mark.parametrize("value", ['"true"', "1", "{}"])
def test_a_declaration_that_is_not_a_boolean_fails_the_load(value: str) -> None:
    sources = without_declaration()
    sources["chunks.rego"] += f"\ntime_pure := {value}\n"
    with pytest.raises(PolicyError, match=r"time_pure must be true or false"):
        RegorusEngine(sources)


@pytest.mark.parametrize(
    "impure",
    [
        "time.now_ns()",
        'time.weekday(input.now_ns) == "Monday"',
        'rand.intn("x", 10) > 3',
        'uuid.rfc4122("x") != ""',
    ],
)
def test_a_declaration_the_sources_contradict_fails_the_load(impure: str) -> None:
    sources = read_rego_sources(default_policy_dir(), include_tests=False)
    sources["extra.rego"] = (
        f"package retrieval_gate.extra\nimport rego.v1\nsuspicious if {impure}\n"
    )
    with pytest.raises(PolicyError, match="time_pure is true, but the policy calls"):
        RegorusEngine(sources)


def test_the_declaration_sits_next_to_a_custom_reasons_rule() -> None:
    assert time_pure_rule("data.retrieval_gate.chunks.reasons") == (
        "data.retrieval_gate.chunks.time_pure"
    )
    assert time_pure_rule('data.a["b-c"].verdicts') == 'data.a["b-c"].time_pure'
    assert time_pure_rule('data.a["reasons"]') is None
    custom = {
        "mine.rego": "package mine\nimport rego.v1\n"
        "verdicts := {c.id: [] | some c in input.chunks}\ntime_pure := true\n"
    }
    assert RegorusEngine(custom, query="data.mine.verdicts").time_pure is True
    # The bundled package's declaration says nothing about another package's rule.
    assert RegorusEngine(custom | without_declaration(), query="data.mine.verdicts").time_pure


def test_a_negative_size_is_refused_and_zero_turns_the_cache_off(engine: Counting) -> None:
    with pytest.raises(ValueError, match="negative"):
        DecisionCore(engine, verdict_cache_size=-1)
    gate = DecisionCore(engine, verdict_cache_size=0)
    assert gate.verdict_cache is None
    decide(gate, record())
    decide(gate, record())
    assert len(engine.evaluated) == 2


# Hits and misses


def test_a_second_response_is_decided_without_rego(gate: DecisionCore, engine: Counting) -> None:
    records = [record("c1"), record("c2", status="revoked")]
    first = decide(gate, *records)
    second = decide(gate, *records)
    assert first == second == [(), (Reason.STATUS_REVOKED,)]
    assert engine.evaluated == [["c1", "c2"]]


def test_only_uncached_chunks_are_evaluated_in_one_call(
    gate: DecisionCore, engine: Counting
) -> None:
    decide(gate, record("c1"))
    decide(gate, record("c1"), record("c2"), record("c3", tenant_id="globex"))
    assert engine.evaluated == [["c1"], ["c2", "c3"]]


def test_the_verdict_says_how_many_verdicts_came_from_the_cache(gate: DecisionCore) -> None:
    cands = [candidate("c1", 0), candidate("c2", 1), candidate("c1", 2)]
    records = {"c1": record("c1"), "c2": record("c2")}
    first = gate.decide(ALICE, cands, records, frozenset(), NOW)
    assert (first.verdicts_cached, first.verdicts_evaluated) == (0, 2)
    second = gate.decide(ALICE, cands, records, frozenset(), NOW)
    assert (second.verdicts_cached, second.verdicts_evaluated) == (2, 0)


# Never outliving a change of the record


def test_a_record_revoked_after_a_cached_admission_is_rejected(
    gate: DecisionCore, engine: Counting
) -> None:
    admitted = record("c1")
    assert decide(gate, admitted) == [()]
    assert decide(gate, admitted) == [()]
    revoked = dataclasses.replace(admitted, status=Status.REVOKED)
    assert decide(gate, revoked) == [(Reason.STATUS_REVOKED,)]
    assert engine.evaluated == [["c1"], ["c1"]]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"status": Status.QUARANTINED}, Reason.STATUS_QUARANTINED),
        ({"status": Status.DRAFT}, Reason.STATUS_DRAFT),
        ({"tenant_id": "globex"}, Reason.TENANT_MISMATCH),
        ({"allowed_principals": ("group:hr",)}, Reason.PRINCIPAL_MISMATCH),
        ({"expires_at": NOW - timedelta(days=1)}, Reason.EXPIRED),
        ({"effective_at": NOW + timedelta(days=1)}, Reason.NOT_YET_EFFECTIVE),
    ],
)
def test_any_change_of_a_cached_record_is_decided_afresh(
    gate: DecisionCore, change: dict[str, Any], expected: Reason
) -> None:
    admitted = record("c1")
    decide(gate, admitted)
    assert decide(gate, dataclasses.replace(admitted, **change)) == [(expected,)]


def test_the_record_as_it_was_still_hits_after_the_change_is_undone(
    gate: DecisionCore, engine: Counting
) -> None:
    # Equal content, new object (as a store lookup returns it): a hit.
    decide(gate, record("c1"))
    decide(gate, record("c1"))
    assert engine.evaluated == [["c1"]]


# Validity boundaries


def test_a_cached_admission_ends_exactly_at_expires_at(
    gate: DecisionCore, engine: Counting
) -> None:
    expiring = record("c1", expires_at="2026-06-01T12:00:00Z")
    assert decide(gate, expiring, now=NOW - timedelta(hours=1)) == [()]
    assert decide(gate, expiring, now=NOW - TICK) == [()]
    assert len(engine.evaluated) == 1  # both answered by one evaluation
    assert decide(gate, expiring, now=NOW + TICK) == [(Reason.EXPIRED,)]
    assert decide(gate, expiring, now=NOW + timedelta(days=300)) == [(Reason.EXPIRED,)]
    assert len(engine.evaluated) == 2


def test_a_verdict_decided_exactly_at_a_boundary_is_not_cached(
    gate: DecisionCore, engine: Counting
) -> None:
    # Whether "now == expires_at" is inside depends on the policy's < or <=;
    # caching it for the interval after would stretch a policy's off-by-one
    # at the boundary into an answer for ever.
    expiring = record("c1", expires_at="2026-06-01T12:00:00Z")
    decide(gate, expiring, now=NOW)
    decide(gate, expiring, now=NOW + timedelta(days=300))
    assert len(engine.evaluated) == 2


def test_a_cached_rejection_ends_exactly_at_effective_at(
    gate: DecisionCore, engine: Counting
) -> None:
    future = record("c1", effective_at="2026-06-01T12:00:00Z")
    assert decide(gate, future, now=NOW - timedelta(days=3)) == [(Reason.NOT_YET_EFFECTIVE,)]
    assert decide(gate, future, now=NOW - TICK) == [(Reason.NOT_YET_EFFECTIVE,)]
    assert len(engine.evaluated) == 1
    assert decide(gate, future, now=NOW + TICK) == [()]
    assert len(engine.evaluated) == 2


def test_a_record_with_both_boundaries_has_three_intervals(
    gate: DecisionCore, engine: Counting
) -> None:
    window = record("c1", effective_at="2026-06-01T12:00:00Z", expires_at="2026-06-02T12:00:00Z")
    timeline = [
        (NOW - TICK, (Reason.NOT_YET_EFFECTIVE,)),
        (NOW + TICK, ()),
        (NOW + timedelta(hours=23), ()),
        (NOW + timedelta(days=1) - TICK, ()),
        (NOW + timedelta(days=1) + TICK, (Reason.EXPIRED,)),
        (NOW + timedelta(days=2), (Reason.EXPIRED,)),
    ]
    for moment, expected in timeline:
        assert decide(gate, window, now=moment) == [expected], moment
    assert len(engine.evaluated) == 3


def test_a_clock_that_steps_back_leaves_the_interval(gate: DecisionCore) -> None:
    expiring = record("c1", expires_at="2026-06-01T12:00:00Z")
    assert decide(gate, expiring, now=NOW) == [(Reason.EXPIRED,)]
    assert decide(gate, expiring, now=NOW - TICK) == [()]


# Keys: caller and policy version


def test_each_principal_set_has_its_own_entry(gate: DecisionCore, engine: Counting) -> None:
    shared = record("c1")
    hr = Caller("acme", frozenset({"user:bob", "group:hr"}))
    assert decide(gate, shared) == [()]
    assert decide(gate, shared, caller=hr) == [(Reason.PRINCIPAL_MISMATCH,)]
    assert decide(gate, shared) == [()]
    assert decide(gate, shared, caller=hr) == [(Reason.PRINCIPAL_MISMATCH,)]
    assert len(engine.evaluated) == 2


def test_a_principal_added_to_the_set_is_a_new_entry(gate: DecisionCore) -> None:
    hr_only = record("c1", allowed_principals=["group:hr"])
    assert decide(gate, hr_only) == [(Reason.PRINCIPAL_MISMATCH,)]
    promoted = Caller("acme", ALICE.principals | {"group:hr"})
    assert decide(gate, hr_only, caller=promoted) == [()]
    assert decide(gate, hr_only) == [(Reason.PRINCIPAL_MISMATCH,)]


def test_tenant_and_drafts_scope_are_part_of_the_key(gate: DecisionCore) -> None:
    draft = record("c1", status="draft")
    assert decide(gate, draft) == [(Reason.STATUS_DRAFT,)]
    editor = dataclasses.replace(ALICE, drafts_allowed=True)
    assert decide(gate, draft, caller=editor) == [()]
    assert decide(gate, draft) == [(Reason.STATUS_DRAFT,)]
    other_tenant = dataclasses.replace(ALICE, tenant="globex")
    assert decide(gate, draft, caller=other_tenant) == [
        (Reason.TENANT_MISMATCH, Reason.STATUS_DRAFT)
    ]


def test_a_new_policy_version_misses() -> None:
    cache = VerdictCache(10)
    rec = record("c1")
    now_ns = to_epoch_ns(NOW)
    v1 = ("sha256:1", "acme", ALICE.principals, False)
    v2 = ("sha256:2", "acme", ALICE.principals, False)
    cache.put(v1, rec, now_ns, (to_epoch_ns(EFFECTIVE), None), ())
    assert cache.get(v1, rec, now_ns) == ()
    assert cache.get(v2, rec, now_ns) is None


def test_a_gate_whose_engine_reports_a_new_version_evaluates_again() -> None:
    engine = Counting()
    gate = DecisionCore(engine)
    decide(gate, record("c1"))
    engine.version = "sha256:reloaded"
    decide(gate, record("c1"))
    decide(gate, record("c1"))
    assert len(engine.evaluated) == 2


# What is never cached


def test_integrity_is_checked_on_every_response(gate: DecisionCore, engine: Counting) -> None:
    rec = record("c1")
    assert decide(gate, rec) == [()]
    edited = text_for("c1") + " (edited in the index)"
    assert decide(gate, rec, texts={"c1": edited}) == [(Reason.HASH_MISMATCH,)]
    assert decide(gate, rec) == [()]
    assert engine.evaluated == [["c1"]]


def test_a_cached_rejection_still_gets_the_hash_mismatch(gate: DecisionCore) -> None:
    revoked = record("c1", status="revoked")
    decide(gate, revoked)
    assert decide(gate, revoked, texts={"c1": "other"}) == [
        (Reason.STATUS_REVOKED, Reason.HASH_MISMATCH)
    ]


def test_a_withdrawn_signature_rejects_a_cached_admission(gate: DecisionCore) -> None:
    signed = dataclasses.replace(record("c1", requires_signature=True), signature_valid=True)
    assert decide(gate, signed) == [()]
    assert decide(gate, dataclasses.replace(signed, signature_valid=False)) == [
        (Reason.SIGNATURE_MISSING,)
    ]


def test_a_policy_failure_fails_cached_chunks_too_and_caches_nothing(
    gate: DecisionCore, engine: Counting
) -> None:
    decide(gate, record("c1"))
    engine.fail = True
    verdict = gate.decide(
        ALICE,
        [candidate("c1", 0), candidate("c2", 1)],
        {"c1": record("c1"), "c2": record("c2")},
        frozenset(),
        NOW,
    )
    assert verdict.policy_failed
    assert [d.reasons for d in verdict.decisions] == [(Reason.POLICY_ERROR,)] * 2
    engine.fail = False
    assert decide(gate, record("c2")) == [()]
    assert engine.evaluated[-1] == ["c2"]


def test_a_chunk_the_policy_says_nothing_about_is_not_cached() -> None:
    class Silent(Counting):
        def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
            self.evaluated.append([c["id"] for c in policy_input["chunks"]])
            return {}

    engine = Silent()
    gate = DecisionCore(engine)
    assert decide(gate, record("c1")) == [(Reason.POLICY_ERROR,)]
    assert decide(gate, record("c1")) == [(Reason.POLICY_ERROR,)]
    assert len(engine.evaluated) == 2


def test_unavailable_ids_never_reach_the_cache(gate: DecisionCore) -> None:
    verdict = gate.decide(ALICE, [candidate("c1", 0)], {}, frozenset({"c1"}), NOW)
    assert [d.reasons for d in verdict.decisions] == [(Reason.METADATA_UNAVAILABLE,)]
    assert len(gate.verdict_cache or ()) == 0


def test_a_missing_ids_decoy_is_cached_but_never_answers_for_its_record(
    engine: Counting,
) -> None:
    # An id without a record is evaluated against a decoy, like a record, so that
    # both take the same work (test_decision_work.py); the decoy's cached verdict
    # must not answer once the record exists.
    gate = DecisionCore(engine)
    missing = gate.decide(ALICE, [candidate("c2")], {}, frozenset(), NOW)
    assert [d.reasons for d in missing.decisions] == [(Reason.MISSING_METADATA,)]
    assert len(gate.verdict_cache or ()) == 1
    engine.evaluated.clear()
    assert decide(gate, record("c2")) == [()]
    assert engine.evaluated == [["c2"]]


# Size bound


def test_the_cache_is_bounded_and_drops_the_least_recently_used(engine: Counting) -> None:
    gate = DecisionCore(engine, verdict_cache_size=3)
    for name in ("c1", "c2", "c3"):
        decide(gate, record(name))
    decide(gate, record("c1"))  # c1 is now the most recently used
    decide(gate, record("c4"))  # makes room by dropping c2
    assert len(gate.verdict_cache or ()) == 3
    engine.evaluated.clear()
    decide(gate, record("c1"))
    decide(gate, record("c3"))
    assert engine.evaluated == []
    decide(gate, record("c2"))
    assert engine.evaluated == [["c2"]]


def test_clear_forgets_everything(gate: DecisionCore, engine: Counting) -> None:
    decide(gate, record("c1"))
    gate.clear_verdict_cache()
    decide(gate, record("c1"))
    assert len(engine.evaluated) == 2


def test_an_equal_record_built_anew_is_a_hit(gate: DecisionCore, engine: Counting) -> None:
    # A store read without the metadata cache returns a new object each time:
    # equal field for field, it is the record the entry was decided for.
    assert decide(gate, record("c1")) == [()]
    assert decide(gate, record("c1")) == [()]
    assert len(engine.evaluated) == 1


def test_an_unhashable_record_is_decided_and_cached(gate: DecisionCore, engine: Counting) -> None:
    # Entries are found by chunk id and compared field by field: nothing is hashed.
    odd = dataclasses.replace(record("c1"), allowed_principals=["group:qa"])  # type: ignore[arg-type]
    assert decide(gate, odd) == [()]
    assert decide(gate, dataclasses.replace(odd)) == [()]
    assert len(engine.evaluated) == 1
    changed = dataclasses.replace(odd, allowed_principals=["group:hr"])  # type: ignore[arg-type]
    assert decide(gate, changed) == [(Reason.PRINCIPAL_MISMATCH,)]
    assert len(engine.evaluated) == 2


# The whole contract: the cache never changes a decision.

_BOUNDARY = NOW
_TIMES = [NOW + offset for offset in (-timedelta(days=1), -TICK, timedelta(0), TICK)] + [
    NOW + timedelta(days=1) + offset for offset in (-TICK, timedelta(0), TICK)
]
# Pairs that differ in one fact only: principals, drafts scope, tenant.
_CALLERS = [
    ALICE,
    Caller("acme", frozenset({"user:alice", "group:hr"})),
    dataclasses.replace(ALICE, drafts_allowed=True),
    Caller("acme", frozenset({"group:qa"})),
    Caller("globex", frozenset({"group:qa"})),
]


@st.composite
def records_strategy(draw: st.DrawFn) -> ChunkRecord:
    chunk_id = draw(st.sampled_from(["c1", "c2", "c3"]))
    effective = draw(st.sampled_from([EFFECTIVE, _BOUNDARY, _BOUNDARY + timedelta(days=1)]))
    expires = draw(
        st.sampled_from([None, _BOUNDARY, _BOUNDARY + timedelta(days=1), _BOUNDARY + TICK])
    )
    if expires is not None and expires <= effective:
        expires = None
    return dataclasses.replace(
        record(chunk_id),
        status=draw(st.sampled_from(list(Status))),
        tenant_id=draw(st.sampled_from(["acme", "globex"])),
        allowed_principals=draw(st.sampled_from([("group:qa",), ("group:hr",), ("user:bob",)])),
        effective_at=effective,
        expires_at=expires,
        requires_signature=draw(st.booleans()),
        signature_valid=draw(st.booleans()),
    )


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_cache_never_changes_a_decision(data: st.DataObject) -> None:
    # A small pool of record versions, so that the same record comes back for
    # other callers, at other times, and after other versions of it.
    pool = data.draw(st.lists(records_strategy(), min_size=1, max_size=5))
    cached = DecisionCore(REAL, verdict_cache_size=4)
    uncached = DecisionCore(REAL, verdict_cache_size=0)
    for _ in range(data.draw(st.integers(1, 12))):
        picked = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
        caller = data.draw(st.sampled_from(_CALLERS))
        now = data.draw(st.sampled_from(_TIMES))
        tampered = data.draw(st.booleans())
        by_id = {r.chunk_id: r for r in picked}  # the store has one record per id
        cands = [
            Candidate(i, r.chunk_id, "tampered" if tampered and i == 0 else text_for(r.chunk_id))
            for i, r in enumerate(picked)
        ]
        expected = uncached.decide(caller, cands, by_id, frozenset(), now)
        actual = cached.decide(caller, cands, by_id, frozenset(), now)
        assert actual.decisions == expected.decisions
