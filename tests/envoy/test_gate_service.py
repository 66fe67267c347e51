"""The gate's own gRPC service, `retrieval_gate.v1.Gate/Filter`, on a real `retrieval-gate serve`.

The caller comes from the JWT in the call's metadata only; the decisions, the
audit record and the metrics are those of the Envoy path. A record the caller
may not read is answered as an id the store does not have.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from sidecar.enforcement.candidates import told_reasons
from sidecar.integrations.client import GateClient, GateError
from sidecar.wire import gate_pb2, gate_pb2_grpc
from tests.fixtures import tokens
from tests.fixtures.gate_service import (
    ADMITTED_IDS,
    COLLECTION,
    INDEX,
    SECRET,
    gate_client,
    jwt,
    start_gate,
)
from tests.fixtures.harness import GateStack
from tests.fixtures.records import text_for

# An id no record of the stack has.
UNKNOWN_ID = "no-such-chunk"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    yield from start_gate(Path(tmp_path_factory.mktemp("gate-service")))


@pytest.fixture(scope="module")
def client(stack: GateStack) -> Iterator[GateClient]:
    gate = gate_client(stack)
    yield gate
    gate.close()


def _raw_filter(
    stack: GateStack,
    metadata: tuple[tuple[str, str], ...],
    candidates: Sequence[tuple[str, str]] = INDEX,
) -> gate_pb2.FilterResponse:
    with grpc.insecure_channel(f"unix:{stack.gate_socket}") as channel:
        request = gate_pb2.FilterRequest(
            candidates=[gate_pb2.Candidate(id=cid, text=text) for cid, text in candidates],
            collection=COLLECTION,
        )
        response: gate_pb2.FilterResponse = gate_pb2_grpc.GateStub(channel).Filter(
            request, metadata=metadata, timeout=10
        )
        return response


def test_decisions_reasons_and_decision_id(client: GateClient) -> None:
    decisions = client.filter(INDEX, jwt(), collection=COLLECTION)
    admitted = [cid for (cid, _), ok in zip(INDEX, decisions.admitted, strict=True) if ok]
    assert admitted == ADMITTED_IDS
    reasons = dict(zip((cid for cid, _ in INDEX), decisions.reasons, strict=True))
    assert reasons["ok-1"] == ()
    # Another tenant's record is answered as an unknown id; the caller's own
    # records with what is wrong with them.
    assert reasons["other-tenant"] == ("MISSING_METADATA",)
    assert reasons["tampered"] == ("HASH_MISMATCH",)
    assert reasons["draft"] == ("STATUS_DRAFT",)
    assert len(decisions.decision_id) == 32


@pytest.mark.parametrize(
    ("claims", "chunk_id", "denial"),
    [
        ({"groups": ["qa"]}, "other-tenant", "TENANT_MISMATCH"),
        ({"tenant": "globex", "groups": ["qa"]}, "draft", "TENANT_MISMATCH"),
        ({"tenant": "globex", "groups": ["qa"]}, "tampered", "TENANT_MISMATCH"),
        ({"groups": ["sales"]}, "ok-1", "PRINCIPAL_MISMATCH"),
        ({"groups": ["sales"]}, "draft", "PRINCIPAL_MISMATCH"),
    ],
    ids=[
        "other-tenants-record",
        "other-tenants-draft",
        "other-tenants-record-holding-its-text",
        "own-tenant-other-principals",
        "own-tenant-other-principals-draft",
    ],
)
def test_a_record_the_caller_may_not_read_is_answered_as_an_unknown_id(
    stack: GateStack, claims: dict[str, Any], chunk_id: str, denial: str
) -> None:
    """No existence or content oracle: a wrong guess, the right text and an unknown id
    get byte-identical answers; the audit record keeps every reason."""
    metadata = (("authorization", f"Bearer {tokens.token(SECRET, tokens.claims(**claims))}"),)
    right = text_for(chunk_id)
    guesses = [(chunk_id, "a wrong guess"), (chunk_id, right), (UNKNOWN_ID, right)]
    answers = []
    decision_ids = []
    for sent_id, text in guesses:
        response = _raw_filter(stack, metadata, [(sent_id, text)])
        assert [d.id for d in response.decisions] == [sent_id]
        decision_ids.append(response.decision_id)
        # What differs by construction: the caller's own id, echoed, and the audit key.
        response.decisions[0].ClearField("id")
        response.ClearField("decision_id")
        answers.append(response.SerializeToString(deterministic=True))
    assert answers[0] == answers[1] == answers[2]
    (answer,) = gate_pb2.FilterResponse.FromString(answers[0]).decisions
    assert (answer.admitted, list(answer.reasons)) == (False, ["MISSING_METADATA"])

    records = {r["decision_id"]: r for r in stack.audit_records()}
    wrong, matching, unknown = (records[i]["rejected"][0]["reasons"] for i in decision_ids)
    assert denial in wrong and "HASH_MISMATCH" in wrong
    assert denial in matching and "HASH_MISMATCH" not in matching
    assert unknown == ["MISSING_METADATA"]


@pytest.mark.parametrize(
    "reasons",
    [
        ("POLICY_ERROR",),
        ("HASH_MISMATCH", "POLICY_ERROR"),
        ("POLICY_DENY",),
        ("CLEARANCE_TOO_LOW",),
        ("TENANT_MISMATCH", "STATUS_DRAFT", "HASH_MISMATCH"),
    ],
)
def test_reasons_that_do_not_prove_the_right_to_read_say_unknown_id(
    reasons: tuple[str, ...],
) -> None:
    """An undecided policy, a bare deny or an operator's reason may hide a denial."""
    assert told_reasons(reasons) == ("MISSING_METADATA",)


@pytest.mark.parametrize(
    "reasons",
    [
        (),
        ("MALFORMED_CHUNK",),
        ("METADATA_UNAVAILABLE",),
        ("STATUS_REVOKED", "HASH_MISMATCH"),
        ("EXPIRED", "SIGNATURE_MISSING"),
    ],
)
def test_reasons_about_the_candidate_or_a_readable_record_are_told(
    reasons: tuple[str, ...],
) -> None:
    assert told_reasons(reasons) == reasons


def test_audit_record_and_metrics(stack: GateStack, client: GateClient) -> None:
    before = stack.metric(
        'retrieval_gate_chunks_total{collection="sops",decision="rejected",'
        'format="gate",reason="HASH_MISMATCH"}'
    )
    decisions = client.filter(INDEX, jwt(), collection=COLLECTION)
    records = {r["decision_id"]: r for r in stack.audit_records()}
    record = records[decisions.decision_id]
    assert record["tenant"] == "acme"
    assert record["format"] == "gate"
    assert record["outcome"] == "filtered"
    assert record["released"] == ADMITTED_IDS
    assert record["candidates"] == [cid for cid, _ in INDEX]
    drift = {entry["chunk_id"]: entry.get("drift") for entry in record["rejected"]}
    assert drift["tampered"] == "injection"
    # The record keeps the reason the caller is not told.
    kept = {entry["chunk_id"]: entry["reasons"] for entry in record["rejected"]}
    assert kept["other-tenant"] == ["TENANT_MISMATCH"]
    after = stack.metric(
        'retrieval_gate_chunks_total{collection="sops",decision="rejected",'
        'format="gate",reason="HASH_MISMATCH"}'
    )
    assert after == before + 1
    assert (
        stack.metric(
            'retrieval_gate_chunks_total{collection="sops",decision="admitted",'
            'format="gate",reason="NONE"}'
        )
        >= 2
    )


def test_the_caller_comes_from_the_token_only(stack: GateStack) -> None:
    """Trusted-headers claims in the metadata change nothing: the token's tenant decides."""
    response = _raw_filter(
        stack,
        (
            ("authorization", f"Bearer {jwt()}"),
            ("x-gate-tenant", "globex"),
            ("x-gate-principals", "group:everyone"),
        ),
    )
    admitted = [d.id for d in response.decisions if d.admitted]
    assert admitted == ADMITTED_IDS


def test_another_tenants_token_gets_nothing_of_acme(client: GateClient) -> None:
    decisions = client.filter(INDEX, jwt(tenant="globex"), collection=COLLECTION)
    admitted = [cid for (cid, _), ok in zip(INDEX, decisions.admitted, strict=True) if ok]
    assert admitted == ["other-tenant"]


@pytest.mark.parametrize(
    "metadata",
    [
        (),
        (("authorization", "Bearer not-a-jwt"),),
        (("authorization", f"Bearer {tokens.token(tokens.hmac_secret(), tokens.claims())}"),),
        (("authorization", f"Bearer {jwt(exp=1)}"),),
    ],
    ids=["missing", "garbage", "wrong-key", "expired"],
)
def test_a_missing_or_bad_credential_is_unauthenticated(
    stack: GateStack, metadata: tuple[tuple[str, str], ...]
) -> None:
    before = stack.metric('retrieval_gate_request_refusals_total{status="401"}')
    with pytest.raises(grpc.RpcError) as raised:
        _raw_filter(stack, metadata)
    call = raised.value
    assert isinstance(call, grpc.Call)
    assert call.code() is grpc.StatusCode.UNAUTHENTICATED
    assert stack.metric('retrieval_gate_request_refusals_total{status="401"}') == before + 1


def test_the_client_fails_closed(stack: GateStack, client: GateClient) -> None:
    with pytest.raises(GateError) as refused:
        client.filter(INDEX, "not-a-jwt")
    assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(GateError):
        client.filter(INDEX, "")
    down = GateClient(f"unix:{stack.workdir / 'no-such.sock'}", timeout_seconds=2)
    with pytest.raises(GateError) as unreachable:
        down.filter(INDEX, jwt())
    assert unreachable.value.code is grpc.StatusCode.UNAVAILABLE
    down.close()


def test_a_candidate_without_an_id_is_rejected(client: GateClient) -> None:
    decisions = client.filter([("", "some text"), ("ok-1", INDEX[0][1])], jwt())
    assert decisions.admitted == (False, True)
    assert decisions.reasons[0] == ("MALFORMED_CHUNK",)
