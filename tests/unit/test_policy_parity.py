"""Parity: the in-process engine and the OPA engine decide alike on the same inputs.

The OPA side goes through OpaEngine's HTTP path to a FAKE OPA server
(tests/fixtures/fake_opa.py) whose decisions are OPA's own Go evaluator's:
this checks OPA's semantics against regorus's and the transport (input
serialisation, exact nanosecond integers, result checks, errors) on
generated inputs. Both engines must give the same reasons per chunk, or both
refuse the input with a PolicyError.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.config import default_policy_dir
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.integrity import canonical_sha256
from sidecar.core.policy import PolicyError
from sidecar.rego.opa_engine import OpaEngine, OpaRequestPolicy, OpaServer
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.request_policy import RequestPolicy
from tests.fixtures.fake_opa import FakeOpa

NOW = 1_767_225_600_000_000_000
HOUR = 3_600_000_000_000
TENANTS = ["acme", "globex", "initech", "", "ACME"]
PRINCIPALS = ["user:alice", "user:bob", "group:qa", "group:hr", "role:admin", ""]
STATUSES = ["approved", "draft", "superseded", "revoked", "quarantined", "Approved", "", "x"]
# A Chroma collection described by its id.
CHROMA_ID = "0b8e5c1e-93a4-4b7a-9d3e-2f6c1a7b8c9d"
DATA: dict[str, Any] = {
    "retrieval_gate": {
        "collections": {
            "sops": {"tenants": ["acme", "initech"]},
            "finance": {"tenants": ["globex"]},
            "broken": {"tenants": "acme"},
            CHROMA_ID: {"tenants": ["globex"]},
        }
    }
}
PARITY = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpa]:
    opa = FakeOpa(data=DATA).start()
    yield opa
    opa.stop()


@pytest.fixture(scope="module")
def engines(fake: FakeOpa) -> tuple[RegorusEngine, OpaEngine]:
    regorus = RegorusEngine.from_directory(default_policy_dir(), data=DATA)
    return regorus, OpaEngine(OpaServer(fake.url, timeout_seconds=5))


@pytest.fixture(scope="module")
def request_policies(fake: FakeOpa) -> tuple[RequestPolicy, OpaRequestPolicy]:
    local = RequestPolicy.from_directory(default_policy_dir(), data=DATA)
    return local, OpaRequestPolicy(OpaServer(fake.url, timeout_seconds=5))


_MISSING = object()
# Near the decision time, boundaries included, and far from it.
times = st.one_of(
    st.sampled_from([NOW - HOUR, NOW - 1, NOW, NOW + 1, NOW + HOUR]),
    st.integers(min_value=0, max_value=2**62),
)


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``values``, or now and then something malformed or absent (which must deny alike)."""
    malformed = st.sampled_from([None, "", "2026-01-01T00:00:00Z", 1.5, True, [], {}, _MISSING])
    return st.one_of(values, values, values, malformed)


@st.composite
def chunk(draw: st.DrawFn, chunk_id: str) -> dict[str, Any]:
    fields = {
        "tenant_id": draw(maybe(st.sampled_from(TENANTS))),
        "allowed_principals": draw(maybe(st.lists(st.sampled_from(PRINCIPALS), max_size=3))),
        "status": draw(maybe(st.sampled_from(STATUSES))),
        "effective_at_ns": draw(maybe(times)),
        "expires_at_ns": draw(st.one_of(st.none(), maybe(times))),
        "doc_id": "doc",
        "version": draw(st.sampled_from(["1", "2"])),
        "requires_signature": draw(st.booleans()),
        "source_uri": "https://docs.example/x",
    }
    return {"id": chunk_id, **{k: v for k, v in fields.items() if v is not _MISSING}}


@st.composite
def policy_inputs(draw: st.DrawFn) -> dict[str, Any]:
    ids = draw(st.lists(st.text(min_size=1, max_size=8), max_size=6, unique=True))
    if ids and draw(st.integers(0, 20)) == 0:
        ids.append(ids[0])  # a duplicate id: both engines must refuse it
    caller = {
        "tenant": draw(maybe(st.sampled_from(TENANTS))),
        "principals": draw(maybe(st.lists(st.sampled_from(PRINCIPALS), max_size=3))),
        "drafts_allowed": draw(maybe(st.sampled_from([True, False, "true", 1]))),
    }
    document: dict[str, Any] = {
        "caller": {k: v for k, v in caller.items() if v is not _MISSING},
        "chunks": [draw(chunk(chunk_id)) for chunk_id in ids],
    }
    now = draw(maybe(st.just(NOW)))
    if now is not _MISSING:
        document["now_ns"] = now
    return document


def outcome(evaluate: Callable[[Any], Any], document: Any) -> Any:
    """The engine's answer, or the fact that it refused the input."""
    try:
        return evaluate(document)
    except PolicyError:
        return PolicyError


@PARITY
@given(document=policy_inputs())
def test_both_engines_give_the_same_reasons(
    engines: tuple[RegorusEngine, OpaEngine], document: dict[str, Any]
) -> None:
    regorus, opa = engines
    assert outcome(opa.evaluate, document) == outcome(regorus.evaluate, document)


@st.composite
def records(draw: st.DrawFn) -> dict[str, ChunkRecord]:
    base = datetime(2026, 1, 1, tzinfo=UTC)
    found: dict[str, ChunkRecord] = {}
    for index in range(draw(st.integers(1, 6))):
        chunk_id = f"c{index}"
        effective = base + timedelta(hours=draw(st.integers(-48, 48)))
        lasts = draw(st.one_of(st.none(), st.integers(0, 96)))
        status = draw(st.sampled_from(list(Status)))
        found[chunk_id] = ChunkRecord(
            chunk_id=chunk_id,
            doc_id=f"doc-{index % 2}",
            version=str(index),
            tenant_id=draw(st.sampled_from(TENANTS[:3])),
            allowed_principals=tuple(draw(st.lists(st.sampled_from(PRINCIPALS[:5]), max_size=3))),
            status=status,
            effective_at=effective,
            expires_at=None if lasts is None else effective + timedelta(hours=lasts),
            sha256=canonical_sha256(f"text {chunk_id}"),
            superseded_by=f"c{index + 1}" if status is Status.SUPERSEDED else None,
        )
    return found


@PARITY
@given(
    found=records(),
    tenant=st.sampled_from(TENANTS[:3]),
    principals=st.frozensets(st.sampled_from(PRINCIPALS[:5]), max_size=3),
    drafts=st.booleans(),
    hours=st.integers(-72, 72),
)
def test_gates_over_both_engines_decide_alike(
    engines: tuple[RegorusEngine, OpaEngine],
    found: dict[str, ChunkRecord],
    tenant: str,
    principals: frozenset[str],
    drafts: bool,
    hours: int,
) -> None:
    regorus, opa = engines
    caller = Caller(tenant, principals, drafts)
    candidates = [Candidate(i, cid, f"text {cid}") for i, cid in enumerate(found)]
    now = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=hours)
    over_opa = DecisionCore(opa).decide(caller, candidates, found, (), now)
    over_regorus = DecisionCore(regorus, verdict_cache_size=0).decide(
        caller, candidates, found, (), now
    )
    assert not over_opa.policy_failed
    assert [d.reasons for d in over_opa.decisions] == [d.reasons for d in over_regorus.decisions]


COLLECTIONS = ["sops", "finance", "broken", "public", "*", "fin*", "logs-*", CHROMA_ID, 7, None]
# Ids whose name the gate has not learned: one described, one not, and malformed ones.
UNNAMED = [CHROMA_ID, "11111111-2222-4333-8444-555555555555", 7, None]


@st.composite
def request_inputs(draw: st.DrawFn) -> dict[str, Any]:
    document = {
        "caller": {
            "tenant": draw(maybe(st.sampled_from(TENANTS))),
            "principals": ["user:alice"],
            "drafts_allowed": False,
        },
        "method": draw(st.sampled_from(["GET", "POST", "PUT", "DELETE"])),
        "path": "/collections/x/points",
        "collections": draw(maybe(st.lists(st.sampled_from(COLLECTIONS), max_size=3))),
        "unnamed_collections": draw(maybe(st.lists(st.sampled_from(UNNAMED), max_size=2))),
        "route_kind": draw(maybe(st.sampled_from(["filtered", "read", "content", "write", None]))),
    }
    return {k: v for k, v in document.items() if v is not _MISSING}


@PARITY
@given(document=request_inputs())
def test_both_request_policies_give_the_same_denials(
    request_policies: tuple[RequestPolicy, OpaRequestPolicy], document: dict[str, Any]
) -> None:
    local, opa = request_policies
    assert outcome(opa.evaluate, document) == outcome(local.evaluate, document)
