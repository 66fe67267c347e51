"""Side channels around the hit list, closed on the request path, through a real Envoy.

The upstream is the fixture server (a fake Qdrant replaying bodies built from
Qdrant's API shapes). Each test shows that a caller learns nothing from a
probe: the answer is the same whether or not the upstream holds another
tenant's document, because the probe never reaches the upstream.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.records import record_dict, text_for
from tests.harness import GateStack, search_ids

pytestmark = pytest.mark.envoy

SEARCH = "/collections/{}/points/search"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    records = [record_dict("1"), record_dict("2", tenant_id="globex")]
    gate = GateStack(
        tmp_path_factory.mktemp("side-channels"),
        records,
        config={"routes": {"/collections/public": {"mode": "audit"}}},
    ).start()
    body = qb.encode(qb.search_body([qb.point(1, text_for("1")), qb.point(2, text_for("2"))]))
    for collection in ("public", "public-hr", "docs"):
        gate.upstream.respond("POST", SEARCH.format(collection), CannedResponse(body))
    yield gate
    gate.stop()


@pytest.mark.parametrize("method", ["HEAD", "OPTIONS"])
@pytest.mark.parametrize("path", [SEARCH.format("docs"), "/collections/docs/points/2"])
def test_probes_of_chunk_routes_are_refused_before_the_upstream(
    stack: GateStack, method: str, path: str
) -> None:
    stack.upstream.requests.clear()
    response = stack.search(path, method=method, body=b"")
    assert response.status == 405
    if method != "HEAD":  # a HEAD answer has no body
        assert response.json() == {"error": "method_not_allowed"}
    assert stack.upstream.requests == []


def test_a_method_override_header_never_reaches_the_upstream(stack: GateStack) -> None:
    stack.upstream.requests.clear()
    response = stack.search(
        SEARCH.format("docs"),
        headers={"x-http-method-override": "DELETE", "x-http-method": "PUT"},
    )
    assert response.status == 200
    (seen,) = stack.upstream.requests
    assert "x-http-method-override" not in seen.headers
    assert "x-http-method" not in seen.headers


def test_a_route_setting_covers_its_own_segment_only(stack: GateStack) -> None:
    # /collections/public is in audit mode: everything passes, the foreign hit too.
    assert search_ids(stack.search(SEARCH.format("public"))) == [1, 2]
    # /collections/public-hr is not under it: enforced, the foreign hit removed.
    assert search_ids(stack.search(SEARCH.format("public-hr"))) == [1]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/vectors/list"),  # Pinecone: every tenant's ids
        ("POST", "/describe_index_stats"),  # Pinecone: counts, with a filter a match oracle
        ("GET", "/namespaces"),  # Pinecone: namespace names and record counts
        ("POST", "/namespaces/acme/documents/list"),
        ("GET", "/api/v2/tenants/t/databases/d/collections/c/count"),  # Chroma
        ("POST", "/v2/vectordb/collections/get_stats"),  # Milvus row counts
        ("GET", "/docs/_count"),  # Elasticsearch: a match oracle
        ("GET", "/_cat/count/docs"),
        ("GET", "/_cat/indices"),
        ("GET", "/docs/_stats"),
    ],
)
def test_listing_and_counting_routes_are_refused_before_the_upstream(
    stack: GateStack, method: str, path: str
) -> None:
    stack.upstream.requests.clear()
    response = stack.search(path, method=method, body=b"{}" if method == "POST" else b"")
    assert response.status == 403, response.body
    assert stack.upstream.requests == []
