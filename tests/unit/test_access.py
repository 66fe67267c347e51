"""The request path's own refusals, before identity and the request policy.

HEAD and OPTIONS on a route that returns chunks (filtered or not) answer with
the size or the existence of what a GET would return: refused. Headers that
some servers take as the real method never reach the upstream.
"""

from __future__ import annotations

import asyncio

import pytest

from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.registry import FormatTable
from sidecar.identity import AuthRequest
from sidecar.identity.headers import TrustedHeaders
from sidecar.request.admission import RequestAdmission, RequestRefused

IDENTITY = {"x-gate-tenant": "acme", "x-gate-principals": "user:a"}
ROUTES = FormatTable([QdrantFormat(), ElasticsearchFormat()])


def admit(method: str, path: str, headers: dict[str, str] | None = None) -> tuple[str, ...]:
    access = RequestAdmission(TrustedHeaders(), None, route_kind=ROUTES.route_kind)
    request = AuthRequest(method, path, {**IDENTITY, **(headers or {})})
    return asyncio.run(access.admit(request)).strip_headers


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "head"])
@pytest.mark.parametrize(
    "path",
    [
        "/collections/docs/points/search",  # Qdrant search: filtered
        "/collections/docs/points/count",  # Qdrant count: content
        "/docs/_search",  # Elasticsearch search: filtered
        "/docs/_doc/1",  # Elasticsearch document by id: content (existence oracle)
        "/collections/docs",  # Qdrant collection info: filtered (its length counts points)
    ],
)
def test_probes_of_routes_that_return_chunks_are_refused(method: str, path: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        admit(method, path)
    assert refused.value.refusal.http_status == 405
    assert refused.value.refusal.body() == b'{"error":"method_not_allowed"}'


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("HEAD", "/collections/docs/exists"),  # GET: whether the collection exists
        ("HEAD", "/"),
        ("OPTIONS", "/"),
        ("OPTIONS", "/docs/_mapping"),
    ],
)
def test_probes_of_routes_without_chunks_pass(method: str, path: str) -> None:
    admit(method, path)


def test_options_is_refused_where_any_method_returns_chunks() -> None:
    # GET /collections/docs/exists is a read, but a POST there would be content.
    with pytest.raises(RequestRefused):
        admit("OPTIONS", "/collections/docs/exists")


@pytest.mark.parametrize("header", ["x-http-method-override", "x-http-method", "x-method-override"])
def test_method_override_headers_are_stripped(header: str) -> None:
    assert header in admit("POST", "/collections/docs/points/search", {header: "DELETE"})


def test_nothing_is_stripped_that_was_not_sent() -> None:
    assert admit("POST", "/collections/docs/points/search") == (
        "x-gate-principals",
        "x-gate-tenant",
    )


def test_a_header_that_picks_the_database_is_refused() -> None:
    # Milvus' DB-Name header would move collectionName to a database the policy never saw.
    with pytest.raises(RequestRefused) as refused:
        admit("POST", "/v2/vectordb/entities/search", {"db-name": "finance"})
    assert refused.value.refusal.http_status == 400
    assert refused.value.refusal.body() == b'{"error":"request_not_filterable"}'


@pytest.mark.parametrize("database", ["finance", "default2", " x "])
def test_pymilvus_dbname_metadata_naming_a_database_is_refused(database: str) -> None:
    with pytest.raises(RequestRefused) as refused:
        admit("POST", "/milvus.proto.milvus.MilvusService/Search", {"dbname": database})
    assert refused.value.refusal.http_status == 400


@pytest.mark.parametrize("database", ["", "default"])
def test_pymilvus_dbname_metadata_for_the_default_database_passes(database: str) -> None:
    admit("POST", "/milvus.proto.milvus.MilvusService/Search", {"dbname": database})


def test_the_grpc_health_check_needs_no_caller_and_gets_credentials_stripped() -> None:
    # Database clients (the Weaviate v4 client) call it at connect, without credentials.
    access = RequestAdmission(TrustedHeaders(), None, route_kind=ROUTES.route_kind)
    probe = AuthRequest("POST", "/grpc.health.v1.Health/Check", {"x-gate-tenant": "forged"})
    admission = asyncio.run(access.admit(probe))
    assert admission.caller is None
    assert "x-gate-tenant" in admission.strip_headers
    # Only that call: Watch streams, and any other path needs a caller.
    for path in ("/grpc.health.v1.Health/Watch", "/grpc.health.v1.Health/Check/x"):
        with pytest.raises(RequestRefused) as refused:
            asyncio.run(access.admit(AuthRequest("POST", path, {})))
        assert refused.value.refusal.http_status == 401
