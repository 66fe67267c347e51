"""Trusted-headers identity and the ext_authz servicer (called directly over gRPC)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from sidecar.core.caller import Caller, IdentityError
from sidecar.core.hits import Route
from sidecar.envoy.ext_authz import AuthorizationServicer
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.registry import path_collections
from sidecar.identity import AuthRequest
from sidecar.identity.headers import TrustedHeaders
from sidecar.request.admission import RequestAdmission
from sidecar.wire import ext_authz_pb2 as authz
from sidecar.wire import ext_authz_pb2_grpc as authz_grpc


def identify(headers: dict[str, str]) -> Caller:
    request = AuthRequest(method="POST", path="/collections/c/points/search", headers=headers)
    return asyncio.run(TrustedHeaders().identify(request))


def test_trusted_headers_make_a_caller() -> None:
    caller = identify({"x-gate-tenant": " acme ", "x-gate-principals": "user:alice, group:qa,,"})
    assert caller == Caller("acme", frozenset({"user:alice", "group:qa"}))


@pytest.mark.parametrize(
    "headers",
    [{}, {"x-gate-tenant": "acme"}, {"x-gate-principals": "user:a"}, {"x-gate-tenant": " "}],
)
def test_incomplete_trusted_headers_are_refused(headers: dict[str, str]) -> None:
    with pytest.raises(IdentityError) as raised:
        identify(headers)
    assert raised.value.code == "identity_missing"


def test_metadata_round_trip_and_defects() -> None:
    caller = Caller("acme", frozenset({"user:alice"}))
    assert Caller.from_document(caller.to_document()) == caller
    for broken in (
        {},
        {"tenant": "acme"},
        {"tenant": "", "principals": ["a"]},
        {"tenant": "acme", "principals": "user:alice"},
    ):
        with pytest.raises(IdentityError):
            Caller.from_document(broken)


def test_principals_digest_ignores_order_and_hides_names() -> None:
    a = Caller("t", frozenset({"user:alice", "group:qa"}))
    b = Caller("t", frozenset({"group:qa", "user:alice"}))
    assert a.principals_digest() == b.principals_digest()
    assert "alice" not in a.principals_digest()


async def _check_async(
    headers: dict[str, str], refused: list[int] | None = None
) -> authz.CheckResponse:
    server = grpc.aio.server()
    access = RequestAdmission(
        TrustedHeaders(),
        request_policy=None,
        route_kind=QdrantFormat().route_kind,
        count_refusal=(refused if refused is not None else []).append,
    )
    servicer = AuthorizationServicer(access)
    authz_grpc.add_AuthorizationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            request = authz.CheckRequest()
            request.attributes.request.http.method = "POST"
            request.attributes.request.http.path = "/collections/docs/points/search?wait=true"
            request.attributes.request.http.headers.update(headers)
            response: authz.CheckResponse = await authz_grpc.AuthorizationStub(channel).Check(
                request
            )
            return response
    finally:
        await server.stop(0)


def check(headers: dict[str, str], refused: list[int] | None = None) -> authz.CheckResponse:
    """Call Check on a real grpc.aio server hosting the servicer; ``refused`` collects
    the statuses it counts as refusals."""
    return asyncio.run(_check_async(headers, refused))


def test_check_counts_a_refusal_by_its_status() -> None:
    refused: list[int] = []
    check({"x-gate-tenant": "acme"}, refused)  # no principals: 401
    check({"x-gate-tenant": "acme", "x-gate-principals": "user:alice"}, refused)
    assert refused == [401]


def test_check_allows_and_carries_identity_as_dynamic_metadata() -> None:
    response = check({"x-gate-tenant": "acme", "x-gate-principals": "user:alice,group:qa"})
    assert response.status.code == 0
    assert json_format.MessageToDict(response.dynamic_metadata) == {
        "tenant": "acme",
        "principals": ["group:qa", "user:alice"],
        "drafts_allowed": False,
    }
    assert set(response.ok_response.headers_to_remove) == {"x-gate-tenant", "x-gate-principals"}


def test_every_client_sent_gate_header_is_stripped() -> None:
    response = check(
        {"x-gate-tenant": "acme", "x-gate-principals": "user:a", "x-gate-admin": "yes"}
    )
    assert "x-gate-admin" in response.ok_response.headers_to_remove


class RecordingPolicy:
    """Allows everything and keeps the inputs it was asked about."""

    version = "recording"
    time_pure = False
    remote = False

    def __init__(self) -> None:
        self.inputs: list[Mapping[str, Any]] = []

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        self.inputs.append(request_input)
        return []


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("POST", "/collections/sops/points/search", "filtered"),
        ("POST", "/collections/sops/points/count", "content"),
        ("GET", "/collections/sops/snapshots", "content"),
        ("PUT", "/collections/sops/points", "write"),
        ("GET", "/healthz", None),
    ],
)
def test_the_request_policy_learns_what_the_route_does(
    method: str, path: str, kind: str | None
) -> None:
    policy = RecordingPolicy()
    access = RequestAdmission(TrustedHeaders(), policy, route_kind=QdrantFormat().route_kind)
    request = AuthRequest(method, path, {"x-gate-tenant": "acme", "x-gate-principals": "user:a"})
    asyncio.run(access.admit(request))
    assert policy.inputs[0]["route_kind"] == kind
    assert policy.inputs[0]["method"] == method


def test_path_collections() -> None:
    assert path_collections(Route("POST", "/collections/sops/points/search")) == ["sops"]
    assert path_collections(Route("GET", "/collections/sops")) == ["sops"]
    assert path_collections(Route("GET", "/cluster")) == []


def test_the_request_policy_sees_every_collection_of_the_route_and_body() -> None:
    policy = RecordingPolicy()
    access = RequestAdmission(
        TrustedHeaders(), policy, route_kind=QdrantFormat().route_kind, collections=lambda r: ["a"]
    )
    request = AuthRequest(
        "POST", "/x/points/search", {"x-gate-tenant": "acme", "x-gate-principals": "user:a"}
    )
    admission = asyncio.run(access.admit(request))
    assert admission.caller is not None
    route = Route("POST", "/x/points/search")
    asyncio.run(access.check_collections(admission.caller, route, ["b", "a", "c"]))
    assert [document["collections"] for document in policy.inputs] == [["a"], ["a", "b", "c"]]


def test_check_denies_401_without_identity() -> None:
    response = check({"x-gate-tenant": "acme"})
    assert response.status.code == 16
    assert response.WhichOneof("http_response") == "denied_response"
    assert response.denied_response.status.code == 401
    assert response.denied_response.body == '{"error":"identity_missing"}'
    assert not response.HasField("dynamic_metadata")
