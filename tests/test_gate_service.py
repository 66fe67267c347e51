"""The gate's own gRPC service, `retrieval_gate.v1.Gate/Filter`, on a real `retrieval-gate serve`.

The caller comes from the JWT in the call's metadata only; the decisions, the
audit record and the metrics are those of the Envoy path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.integrations.client import GateClient, GateError
from sidecar.wire import gate_pb2, gate_pb2_grpc
from tests.fixtures import tokens
from tests.fixtures.gate_service import (
    ADMITTED_IDS,
    COLLECTION,
    INDEX,
    gate_client,
    jwt,
    start_gate,
)
from tests.harness import GateStack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    yield from start_gate(Path(tmp_path_factory.mktemp("gate-service")))


@pytest.fixture(scope="module")
def client(stack: GateStack) -> Iterator[GateClient]:
    gate = gate_client(stack)
    yield gate
    gate.close()


def _raw_filter(stack: GateStack, metadata: tuple[tuple[str, str], ...]) -> gate_pb2.FilterResponse:
    with grpc.insecure_channel(f"unix:{stack.socket}") as channel:
        request = gate_pb2.FilterRequest(
            candidates=[gate_pb2.Candidate(id=cid, text=text) for cid, text in INDEX],
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
    assert "TENANT_MISMATCH" in reasons["other-tenant"]
    assert "HASH_MISMATCH" in reasons["tampered"]
    assert reasons["draft"] != ()
    assert len(decisions.decision_id) == 32


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
