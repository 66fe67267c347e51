"""Routes that count or name stored objects are content, over REST and gRPC alike (issue 27,
item 4), through a real Envoy.

The REST upstream is ``tests.fixtures.counting_databases``, a FAKE that
answers Milvus' index descriptions and import jobs, Pinecone's bulk imports
and Elasticsearch's field capabilities and points in time from its
documents, every tenant's, as those databases document; searches come from
``documented_databases``. The gRPC upstream is a real Milvus Lite server,
and for Qdrant's Collections service a fake gRPC server answering with
qdrant-client's own messages.

Each case asks the same thing with and without another tenant's data stored
(globex's document, import, field, row) and compares what the caller, of
tenant acme, gets:

- under the default policy the two answers are the same: the refusal, given
  before the database is asked (the upstream sees nothing);
- the control, a gate whose policy data allows unfiltered content
  (``allow_unfiltered_content``), gets two different answers for the same
  requests: the routes are oracles, and the first assertion could fail.

An Elasticsearch point in time opened with an ``index_filter`` is refused
400 under every setting (its control: the fake answers the filter
differently by globex's values, and the same opening without a filter
passes). A search of a point in time is confined like any search.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import grpc
import orjson
import pytest
from milvus_lite.adapter.grpc.server import start_server_in_thread
from pymilvus import DataType, MilvusClient
from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc
from qdrant_client import grpc as q

from sidecar.demo.upstream import SeenRequest
from tests.fixtures.counting_databases import CountingDatabases
from tests.fixtures.documented_databases import Document, DocumentedDatabases, records_for
from tests.fixtures.grpc_upstream import FakeGrpcUpstream
from tests.fixtures.harness import ClientView, GateStack, client_view
from tests.fixtures.records import text_for

pytestmark = pytest.mark.envoy

ACME = [
    Document(1, "acme", text_for("1"), {"salary": 50_000}),
    Document(3, "acme", text_for("3"), {"salary": 60_000}),
]
# Another tenant's document: a field acme's have not, a salary over 100,000.
GLOBEX = [Document(2, "globex", text_for("2"), {"salary": 200_000, "merger_target": "initech"})]
UNCONFINED = "unconfined"  # an index with push_down = false
ALLOWED = {"error": "forbidden", "reasons": ["ROUTE_FORBIDDEN"]}


class Upstream:
    """What is stored, every tenant's: the fakes' documents and Milvus Lite's rows."""

    def __init__(self, milvus_port: int) -> None:
        self.counting = CountingDatabases(ACME)
        self.searching = DocumentedDatabases(ACME)
        self._milvus = MilvusClient(uri=f"http://127.0.0.1:{milvus_port}")
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
        schema.add_field("tenant", DataType.VARCHAR, max_length=32)
        index = self._milvus.prepare_index_params()
        index.add_index("vec", metric_type="L2", index_type="FLAT")
        self._milvus.create_collection("docs", schema=schema, index_params=index)
        self._milvus.insert("docs", [self._row(d) for d in ACME])
        self._milvus.load_collection("docs")

    def add_globex(self) -> None:
        """Store another tenant's data everywhere."""
        self.counting.set_documents(ACME + GLOBEX)
        self.searching.set_documents(ACME + GLOBEX)
        self._milvus.insert("docs", [self._row(d) for d in GLOBEX])

    def remove_globex(self) -> None:
        self.counting.set_documents(ACME)
        self.searching.set_documents(ACME)
        self._milvus.delete("docs", filter='tenant == "globex"')
        self._milvus.flush("docs")

    @staticmethod
    def _row(document: Document) -> dict[str, Any]:
        return {"id": document.id, "vec": [float(document.id), 0.0], "tenant": document.tenant}

    def close(self) -> None:
        self._milvus.close()


@pytest.fixture(scope="module")
def milvus_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    server, db, port = start_server_in_thread(
        str(tmp_path_factory.mktemp("milvus-lite")), "127.0.0.1", 0
    )
    yield port
    server.stop(grace=2)
    db.close()


@pytest.fixture(scope="module")
def upstream(milvus_port: int) -> Iterator[Upstream]:
    stored = Upstream(milvus_port)
    yield stored
    stored.close()


# Qdrant's gates: the collection finance is reserved to tenant globex. (The
# others describe no collection: a search of a point in time names every index.)
OWNERS = {"collections": {"finance": {"tenants": ["globex"]}}}


def _gate(
    workdir: Any,
    upstream: Upstream,
    grpc_upstream: str,
    *,
    allow: bool = False,
    owners: Mapping[str, Any] | None = None,
) -> GateStack:
    routes = {"allow_unfiltered_content": True} if allow else {}
    gate = GateStack(
        workdir,
        records_for(ACME + GLOBEX),
        config={"routes": {f"/{UNCONFINED}": {"push_down": False}}},
        grpc_upstream_url=grpc_upstream,
        policy_data={"retrieval_gate": {**(owners or {}), "routes": routes}},
    ).start()
    for index in ("docs", UNCONFINED):
        upstream.counting.mount_all(gate.upstream, index)
    upstream.searching.mount_all(gate.upstream)
    return gate


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, milvus_port: int
) -> Iterator[GateStack]:
    milvus = f"http://127.0.0.1:{milvus_port}"
    gate = _gate(tmp_path_factory.mktemp("route-classes"), upstream, milvus)
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def opted_in(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, milvus_port: int
) -> Iterator[GateStack]:
    """A gate whose policy data allows routes with content it cannot filter: the control."""
    milvus = f"http://127.0.0.1:{milvus_port}"
    gate = _gate(tmp_path_factory.mktemp("route-classes-opted-in"), upstream, milvus, allow=True)
    yield gate
    gate.stop()


@pytest.fixture(scope="module")
def qdrant_grpc(upstream: Upstream) -> Iterator[FakeGrpcUpstream]:
    fake = FakeGrpcUpstream(upstream.counting.qdrant_grpc_handlers()).start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def qdrant_stacks(
    tmp_path_factory: pytest.TempPathFactory, upstream: Upstream, qdrant_grpc: FakeGrpcUpstream
) -> Iterator[tuple[GateStack, GateStack]]:
    """A default gate and an opted-in one in front of the fake Qdrant gRPC server."""
    url = qdrant_grpc.url
    gates = (
        _gate(tmp_path_factory.mktemp("qdrant"), upstream, url, owners=OWNERS),
        _gate(tmp_path_factory.mktemp("qdrant-opted-in"), upstream, url, allow=True, owners=OWNERS),
    )
    yield gates
    for gate in gates:
        gate.stop()


@pytest.fixture
def globex_out(upstream: Upstream) -> Iterator[Upstream]:
    """Each case starts without globex's data, and leaves it so."""
    yield upstream
    upstream.remove_globex()


def ask(gate: GateStack, method: str, path: str, body: Any = None) -> ClientView:
    """``method path`` as acme, through ``gate``: what the caller learns."""
    raw = b"" if body is None else orjson.dumps(body)
    return client_view(gate.search(path, method=method, body=raw))


def ask_grpc(
    gate: GateStack, request: Any, call: str = "DescribeIndex"
) -> tuple[grpc.StatusCode, bytes]:
    """A gRPC ``call`` (Milvus' by default, ``qdrant.Collections/...``) as acme through
    ``gate``: its status and its reply, or the refusal's details."""
    address = gate.url.removeprefix("http://")
    with grpc.insecure_channel(address) as channel:
        if "/" in call:
            service, method = call.split("/")
            stub = getattr(q, f"{service.removeprefix('qdrant.')}Stub")(channel)
        else:
            stub, method = milvus_pb2_grpc.MilvusServiceStub(channel), call
        metadata = (("x-gate-tenant", "acme"), ("x-gate-principals", "user:alice"))
        try:
            reply = getattr(stub, method)(request, metadata=metadata, timeout=20)
        except grpc.RpcError as error:
            return error.code(), error.details().encode()
        return grpc.StatusCode.OK, reply.SerializeToString()


def before_and_after(upstream: Upstream, probe: Any) -> tuple[Any, Any]:
    """``probe()`` without globex's data, then with it."""
    before = probe()
    upstream.add_globex()
    return before, probe()


# (method, path, body) of REST routes that count or name stored objects.
COUNTING_ROUTES = [
    pytest.param(
        "POST",
        "/v2/vectordb/indexes/describe",
        {"collectionName": "docs", "indexName": "vector"},
        id="milvus-index-describe",
    ),
    pytest.param(
        "POST", "/v2/vectordb/jobs/import/list", {"collectionName": "docs"}, id="milvus-imports"
    ),
    pytest.param(
        "POST", "/v2/vectordb/jobs/import/describe", {"jobId": "globex"}, id="milvus-import"
    ),
    pytest.param(
        "POST",
        "/v2/vectordb/jobs/import/get_progress",
        {"jobId": "globex"},
        id="milvus-import-progress",
    ),
    pytest.param("GET", "/bulk/imports", None, id="pinecone-imports"),
    pytest.param("GET", "/bulk/imports/globex", None, id="pinecone-import"),
    pytest.param("GET", "/docs/_field_caps?fields=*", None, id="es-field-caps"),
    pytest.param(
        "POST",
        "/docs/_field_caps?fields=*",
        {"index_filter": {"range": {"salary": {"gte": 100_000}}}},
        id="es-field-caps-index-filter",
    ),
]


@pytest.mark.parametrize(("method", "path", "body"), COUNTING_ROUTES)
def test_routes_that_count_or_name_stored_objects_answer_alike_whoever_stored_what(
    stack: GateStack,
    opted_in: GateStack,
    globex_out: Upstream,
    method: str,
    path: str,
    body: Any,
) -> None:
    stack.upstream.requests.clear()

    def probe() -> tuple[ClientView, ClientView]:
        return ask(stack, method, path, body), ask(opted_in, method, path, body)

    (refused_before, control_before), (refused_after, control_after) = before_and_after(
        globex_out, probe
    )
    assert refused_before == refused_after
    assert refused_before.status == 403
    assert orjson.loads(refused_before.body) == ALLOWED
    assert stack.upstream.requests == []
    # Control: allowed, the same requests tell whether globex stored anything
    # (a count, a name, or a not-found that becomes an answer).
    assert control_after.status == 200
    assert control_before != control_after


def test_milvus_index_descriptions_are_refused_over_grpc_as_over_rest(
    stack: GateStack, opted_in: GateStack, globex_out: Upstream
) -> None:
    request = milvus_pb2.DescribeIndexRequest(collection_name="docs", field_name="vec")

    def probe() -> tuple[Any, Any, ClientView]:
        rest = ask(stack, "POST", "/v2/vectordb/indexes/describe", {"collectionName": "docs"})
        return ask_grpc(stack, request), ask_grpc(opted_in, request), rest

    (refused_before, control_before, rest), (refused_after, control_after, _) = before_and_after(
        globex_out, probe
    )
    assert refused_before == refused_after
    assert refused_before[0] is grpc.StatusCode.PERMISSION_DENIED
    assert orjson.loads(refused_before[1]) == ALLOWED
    assert rest.status == 403  # the REST twin's refusal, the same policy answer
    # Control: Milvus Lite's own counts, every tenant's rows, differ.
    assert control_before[0] is control_after[0] is grpc.StatusCode.OK
    rows = [
        milvus_pb2.DescribeIndexResponse.FromString(r[1]) for r in (control_before, control_after)
    ]
    assert [r.index_descriptions[0].total_rows for r in rows] == [2, 3]


PIT_FILTER = {"index_filter": {"range": {"salary": {"gte": 100_000}}}}


@pytest.mark.parametrize("index", ["docs", UNCONFINED])
def test_a_point_in_times_index_filter_is_refused_whoever_stored_what(
    stack: GateStack, opted_in: GateStack, globex_out: Upstream, index: str
) -> None:
    path = f"/{index}/_pit?keep_alive=1m"
    stack.upstream.requests.clear()

    def probe() -> tuple[ClientView, ClientView, bytes]:
        direct = SeenRequest("POST", path, {}, orjson.dumps(PIT_FILTER))
        premise = orjson.dumps(globex_out.counting.elasticsearch_open_pit(direct))
        return (
            ask(stack, "POST", path, PIT_FILTER),
            ask(opted_in, "POST", path, PIT_FILTER),
            premise,
        )

    (before, opted_before, premise_before), (after, opted_after, premise_after) = before_and_after(
        globex_out, probe
    )
    assert before == after == opted_before == opted_after
    assert before.status == 400
    assert orjson.loads(before.body)["error"] == "request_not_filterable"
    assert stack.upstream.requests == []
    # Control: the database would have told (shards skipped: 2, then 1).
    assert premise_before != premise_after
    # Control: the same opening without a filter reaches the database and is answered.
    opened = ask(stack, "POST", path)
    assert opened.status == 200
    assert orjson.loads(opened.body)["_shards"]["skipped"] == 0
    assert [seen.path for seen in stack.upstream.requests] == [path]


def test_a_search_of_a_point_in_time_is_confined_to_the_callers_tenant(
    stack: GateStack, globex_out: Upstream
) -> None:
    body = {"pit": {"id": "46ToAwMDaWR5", "keep_alive": "1m"}, "query": {"match": {"text": "care"}}}
    direct = SeenRequest("POST", "/_search", {}, orjson.dumps(body))

    def probe() -> tuple[ClientView, Any, bytes]:
        stack.upstream.requests.clear()
        answer = ask(stack, "POST", "/_search", body)
        (seen,) = stack.upstream.requests
        premise = orjson.dumps(globex_out.searching.elasticsearch_search(direct))
        return answer, orjson.loads(seen.body), premise

    (before, sent, premise_before), (after, _, premise_after) = before_and_after(globex_out, probe)
    assert sent["pit"] == body["pit"]
    assert sent["query"] == {
        "bool": {"filter": [{"term": {"tenant": "acme"}}], "must": [body["query"]]}
    }
    assert before == after
    assert [hit["_id"] for hit in orjson.loads(after.body)["hits"]["hits"]] == ["1", "3"]
    # Control: the app's query alone would have matched globex's document.
    assert b'"_id":"2"' not in premise_before
    assert b'"_id":"2"' in premise_after


def test_qdrant_collection_info_tells_no_point_count_over_rest_or_grpc(
    qdrant_stacks: tuple[GateStack, GateStack], globex_out: Upstream
) -> None:
    stack, opted_in = qdrant_stacks
    request = q.GetCollectionInfoRequest(collection_name="docs")

    def probe() -> tuple[Any, ClientView, Any]:
        grpc_refused = ask_grpc(stack, request, "qdrant.Collections/Get")
        return (
            grpc_refused,
            ask(stack, "GET", "/collections/docs"),
            ask_grpc(opted_in, request, "qdrant.Collections/Get"),
        )

    (refused_before, rest_before, control_before), (refused_after, rest_after, control_after) = (
        before_and_after(globex_out, probe)
    )
    # gRPC: the reply is not read, so it is content, refused.
    assert refused_before == refused_after
    assert refused_before[0] is grpc.StatusCode.PERMISSION_DENIED
    assert orjson.loads(refused_before[1]) == ALLOWED
    # REST: filtered, its counts removed.
    assert rest_before == rest_after
    assert rest_before.status == 200
    assert "points_count" not in orjson.loads(rest_before.body)["result"]
    # Control: the gRPC reply, allowed, counts globex's point.
    counts = [q.GetCollectionInfoResponse.FromString(r[1]) for r in (control_before, control_after)]
    assert [c.result.points_count for c in counts] == [2, 3]


def test_a_qdrant_existence_check_over_grpc_is_asked_of_the_collections_owner(
    qdrant_stacks: tuple[GateStack, GateStack],
) -> None:
    stack, _ = qdrant_stacks
    exists = "qdrant.Collections/CollectionExists"
    # The caller's own collection: a read, answered.
    status, _ = ask_grpc(stack, q.CollectionExistsRequest(collection_name="docs"), exists)
    assert status is grpc.StatusCode.OK
    # Another tenant's: the collection in the body goes to the ownership check.
    status, details = ask_grpc(stack, q.CollectionExistsRequest(collection_name="finance"), exists)
    assert status is grpc.StatusCode.PERMISSION_DENIED
    assert orjson.loads(details)["reasons"] == ["COLLECTION_FORBIDDEN"]
    # Over REST the path names it: the same answer.
    assert ask(stack, "GET", "/collections/finance/exists").status == 403
