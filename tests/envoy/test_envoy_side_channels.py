"""Side channels around the hit list, closed on the request path, through a real Envoy.

The upstream is the fixture server (a fake Qdrant replaying bodies built from
Qdrant's API shapes). Each test shows that a caller learns nothing from a
probe: the answer is the same whether or not the upstream holds another
tenant's document, because the probe never reaches the upstream.

Listing, stats and count routes of every database are refused unless policy
data opts in (``data.retrieval_gate.routes.allow_unfiltered_content``); a
second stack with that opt-in shows the same requests reaching the upstream,
so the refusal is the request policy's. A rejected Qdrant point fetched by
id is answered exactly like a missing one: shown in
tests/envoy/test_envoy_qdrant.py (``test_a_rejected_point_is_answered_like_a_missing_one``)
and tests/envoy/test_envoy_upstream_errors.py, not repeated here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sidecar.demo.upstream import CannedResponse
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.harness import GateStack, HttpResult, search_ids
from tests.fixtures.records import record_dict, text_for

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


LISTING_ROUTES = [
    ("GET", "/vectors/list"),  # Pinecone: every tenant's ids
    ("POST", "/describe_index_stats"),  # Pinecone: counts, with a filter a match oracle
    ("GET", "/describe_index_stats"),
    ("GET", "/namespaces"),  # Pinecone: namespace names and record counts
    ("GET", "/namespaces/acme"),
    ("POST", "/namespaces/acme/documents/list"),
    ("GET", "/api/v2/tenants/t/databases/d/collections/c/count"),  # Chroma
    ("POST", "/v2/vectordb/collections/get_stats"),  # Milvus row counts
    ("POST", "/v2/vectordb/partitions/get_stats"),
    ("GET", "/docs/_count"),  # Elasticsearch: a match oracle
    ("POST", "/docs/_count"),
    ("GET", "/_cat/count/docs"),
    ("GET", "/_cat/indices"),
    ("GET", "/_cat/shards"),
    ("GET", "/_cat/segments"),
    ("GET", "/docs/_stats"),
    ("GET", "/docs/_segments"),
    ("GET", "/_cluster/stats"),
    ("GET", "/_nodes/stats"),
    ("POST", "/docs/_terms_enum"),  # every tenant's terms of a field
    ("POST", "/collections/docs/points/count"),  # Qdrant: a match oracle
    ("POST", "/collections/docs/facet"),  # payload values and their counts
    ("POST", "/collections/docs/points/search/matrix/pairs"),
    ("POST", "/collections/docs/points/search/matrix/offsets"),
    ("GET", "/aliases"),  # Qdrant: other tenants' collection names
    ("GET", "/collections/docs/aliases"),
]


def probe(stack: GateStack, method: str, path: str) -> HttpResult:
    """Ask ``method path`` with an empty JSON body (or none, for a GET)."""
    return stack.search(path, method=method, body=b"{}" if method == "POST" else b"")


@pytest.mark.parametrize(("method", "path"), LISTING_ROUTES)
def test_listing_and_counting_routes_are_refused_before_the_upstream(
    stack: GateStack, method: str, path: str
) -> None:
    stack.upstream.requests.clear()
    response = probe(stack, method, path)
    assert response.status == 403, response.body
    assert response.json() == {"error": "forbidden", "reasons": ["ROUTE_FORBIDDEN"]}
    assert stack.upstream.requests == []


COUNTED = b'{"count": 5}'  # what the upstream answers a listing route with, below


@pytest.fixture(scope="module")
def opted_in(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateStack]:
    """A gate whose policy data allows routes with content it cannot filter."""
    gate = GateStack(
        tmp_path_factory.mktemp("side-channels-opted-in"),
        [record_dict("1")],
        policy_data={"retrieval_gate": {"routes": {"allow_unfiltered_content": True}}},
    ).start()
    for method, path in LISTING_ROUTES:
        gate.upstream.respond(method, path.split("?")[0], CannedResponse(COUNTED))
    yield gate
    gate.stop()


@pytest.mark.parametrize(("method", "path"), LISTING_ROUTES)
def test_control_with_policy_data_opting_in_the_listing_routes_reach_the_upstream(
    opted_in: GateStack, method: str, path: str
) -> None:
    opted_in.upstream.requests.clear()
    response = probe(opted_in, method, path)
    assert (response.status, response.body) == (200, COUNTED)
    assert [seen.path for seen in opted_in.upstream.requests] == [path]


# Routes that count every tenant's records but are classified as metadata reads:
# the request policy lets them through, and the database's counts reach the caller.
COUNTING_READS = [
    # Qdrant's collection cluster info: local_shards[].points_count.
    pytest.param("GET", "/collections/docs/cluster", id="qdrant-cluster-info"),
    # Weaviate's nodes: stats.objectCount and, verbose, shards[].objectCount.
    pytest.param("GET", "/v1/nodes?output=verbose", id="weaviate-nodes"),
    # Elasticsearch's cat nodes: the node stats behind /_nodes/stats, as columns.
    pytest.param("GET", "/_cat/nodes?h=indexing.index_total", id="es-cat-nodes"),
]
COUNTING_BODIES = {
    "/collections/docs/cluster": b'{"result": {"peer_id": 1, "shard_count": 1, "local_shards": '
    b'[{"shard_id": 0, "points_count": 5, "state": "Active"}], "remote_shards": [], '
    b'"shard_transfers": []}, "status": "ok", "time": 0.0}',
    "/v1/nodes": b'{"nodes": [{"name": "n1", "status": "HEALTHY", "stats": {"shardCount": 1, '
    b'"objectCount": 5}, "shards": [{"name": "s1", "class": "Chunk", "objectCount": 5}]}]}',
    "/_cat/nodes": b'[{"indexing.index_total": "5"}]',
}


@pytest.mark.parametrize(("method", "path"), COUNTING_READS)
def test_stats_routes_that_count_every_tenants_records_are_refused(
    stack: GateStack, method: str, path: str
) -> None:
    stack.upstream.respond(
        method, path.split("?")[0], CannedResponse(COUNTING_BODIES[path.split("?")[0]])
    )
    stack.upstream.requests.clear()
    response = probe(stack, method, path)
    assert response.status == 403, response.body
    assert stack.upstream.requests == []
