"""The unchanged qdrant-client over gRPC through a real Envoy: only admitted points come back.

``FakeQdrant`` (``tests.fixtures.qdrant_grpc_upstream``) is a FAKE Qdrant: a
real gRPC server answering the ``qdrant.Points`` methods with replies built
from qdrant-client's own message classes, every search returning every point
of its corpus (no Qdrant server runs here). The client is
``qdrant_client.QdrantClient(prefer_grpc=True)`` as an application uses it,
with the caller's JWT where it takes its Qdrant API key (``api-key``
metadata, identity ``jwt``); the deprecated search, recommend and discover
calls, which the client no longer wraps, go through its own gRPC stub
(``client.grpc_points``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from qdrant_client import QdrantClient, models
from qdrant_client import grpc as q

from tests.fixtures import tokens
from tests.fixtures.harness import GateStack
from tests.fixtures.qdrant_grpc_upstream import FakeQdrant, route_path
from tests.fixtures.records import record_dict, text_for

pytestmark = [
    pytest.mark.envoy,
    # The listener is plaintext, as a local gateway's is.
    pytest.mark.filterwarnings("ignore:Api key is used with an insecure connection"),
]

# Point id -> (record overrides, or None when the store has no record; indexed text)
CORPUS: dict[int, tuple[dict[str, Any] | None, str]] = {
    101: ({}, text_for("101")),
    102: ({"status": "revoked"}, text_for("102")),
    103: ({"tenant_id": "globex"}, text_for("103")),
    104: ({}, text_for("104")),
    105: ({}, text_for("105") + " (edited in the index)"),
    106: (None, text_for("106")),
    107: ({"allowed_principals": ["group:hr"]}, text_for("107")),
    108: ({}, text_for("108")),
}
ADMITTED = [101, 104, 108]
SECRET = tokens.hmac_secret()


def _payload(pid: int) -> dict[str, Any]:
    record = CORPUS[pid][0] or {}
    return {
        "doc_id": f"doc-{pid % 3}",
        "tenant": record.get("tenant_id", "acme"),
        "source": f"SECRET-source-{pid}",  # never released: not declared
    }


def jwt(**claims: Any) -> str:
    return tokens.token(SECRET, tokens.claims(groups=["qa"], **claims))


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeQdrant]:
    upstream = FakeQdrant({pid: (text, _payload(pid)) for pid, (_, text) in CORPUS.items()})
    upstream.start()
    yield upstream
    upstream.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeQdrant) -> Iterator[GateStack]:
    workdir = tmp_path_factory.mktemp("qdrant-grpc")
    records = [record_dict(str(pid), **o) for pid, (o, _) in CORPUS.items() if o is not None]
    gate = GateStack(
        workdir,
        records,
        config={
            **tokens.hmac_identity(workdir, SECRET),
            "overfetch_factor": 2,
            "formats": {"qdrant_grpc": {"releasable_fields": ["doc_id"]}},
        },
        grpc_upstream_url=fake.url,
        # The collection finance is reserved to tenant globex.
        policy_data={"retrieval_gate": {"collections": {"finance": {"tenants": ["globex"]}}}},
    ).start()
    yield gate
    gate.stop()


def client(stack: GateStack, api_key: str | None = None, **options: Any) -> QdrantClient:
    """The unchanged client, dialling the gate with a JWT as its API key."""
    return QdrantClient(
        url=stack.url,
        grpc_port=stack.listen_port,
        prefer_grpc=True,
        api_key=api_key or jwt(),
        check_compatibility=False,
        timeout=10,
        **options,
    )


def received(fake: FakeQdrant, method: str, cls: Any) -> tuple[Any, Any]:
    """The last call the fake got on ``method``, and its request message."""
    call = fake.upstream.last_call(route_path(method))
    return call, cls.FromString(call.request)


TENANT = q.Condition(field=q.FieldCondition(key="tenant", match=q.Match(keyword="acme")))


def _check_points(points: list[Any]) -> None:
    for point in points:
        # Only the text and the declared field go out of the payload.
        assert point.payload == {"text": CORPUS[point.id][1], "doc_id": f"doc-{point.id % 3}"}


def test_query_points_returns_only_admitted_points(stack: GateStack, fake: FakeQdrant) -> None:
    response = client(stack).query_points("docs", query=[0.1, 0.2], limit=8, with_payload=True)
    assert [point.id for point in response.points] == ADMITTED  # rank order kept
    _check_points(response.points)
    call, request = received(fake, "Query", q.QueryPoints)
    # The tenant went down into the filter, k was over-fetched, the key stayed here.
    assert request.filter == q.Filter(must=[TENANT])
    assert request.limit == 16
    assert call.header("api-key") is None
    record = stack.audit_records()[-1]
    assert record["released"] == [str(pid) for pid in ADMITTED]
    assert record["tenant_filter"] is True


def test_query_points_trims_the_overfetched_points_to_k(stack: GateStack, fake: FakeQdrant) -> None:
    app_filter = models.Filter(
        must=[models.FieldCondition(key="lang", match=models.MatchValue(value="en"))]
    )
    response = client(stack).query_points(
        "docs", query=[0.1, 0.2], limit=2, query_filter=app_filter, with_payload=True
    )
    assert [point.id for point in response.points] == ADMITTED[:2]
    _, request = received(fake, "Query", q.QueryPoints)
    assert request.limit == 4
    assert request.filter.must[0] == TENANT
    assert request.filter.must[1].filter.must[0].field.key == "lang"


def test_query_with_prefetches_confines_every_stage(stack: GateStack, fake: FakeQdrant) -> None:
    response = client(stack).query_points(
        "docs",
        prefetch=[
            models.Prefetch(
                query=[0.1, 0.2],
                limit=20,
                prefetch=[models.Prefetch(query=[0.3, 0.4], limit=50)],
            ),
        ],
        query=models.FusionQuery(fusion=models.Fusion.RRF),
        limit=8,
        with_payload=True,
    )
    assert [point.id for point in response.points] == ADMITTED
    _, request = received(fake, "Query", q.QueryPoints)
    (outer,) = request.prefetch
    (inner,) = outer.prefetch
    assert outer.filter == inner.filter == request.filter == q.Filter(must=[TENANT])
    assert (outer.limit, inner.limit) == (20, 50)  # prefetch limits are the app's


def test_query_batch_points_filters_every_result(stack: GateStack, fake: FakeQdrant) -> None:
    responses = client(stack).query_batch_points(
        "docs",
        requests=[
            models.QueryRequest(query=[0.1, 0.2], limit=8, with_payload=True),
            models.QueryRequest(query=[0.2, 0.1], limit=1, with_payload=True),
        ],
    )
    assert [[p.id for p in r.points] for r in responses] == [ADMITTED, ADMITTED[:1]]
    _, request = received(fake, "QueryBatch", q.QueryBatchPoints)
    assert [sub.filter for sub in request.query_points] == [q.Filter(must=[TENANT])] * 2
    assert [sub.limit for sub in request.query_points] == [16, 2]


def test_query_points_groups_keeps_groups_with_admitted_points(
    stack: GateStack, fake: FakeQdrant
) -> None:
    response = client(stack).query_points_groups(
        "docs", group_by="doc_id", query=[0.1, 0.2], limit=10, group_size=5, with_payload=True
    )
    groups = {group.id: [hit.id for hit in group.hits] for group in response.groups}
    expected: dict[str, list[int]] = {}
    for pid in ADMITTED:
        expected.setdefault(f"doc-{pid % 3}", []).append(pid)
    assert groups == expected
    _, request = received(fake, "QueryGroups", q.QueryPointGroups)
    assert request.filter == q.Filter(must=[TENANT])


def _scroll_all(qdrant: QdrantClient, limit: int) -> list[Any]:
    """Every record a client's scroll loop collects, page by page."""
    seen: list[Any] = []
    offset: Any = None
    for _ in range(len(CORPUS) + 1):
        records, offset = qdrant.scroll("docs", limit=limit, offset=offset, with_payload=True)
        seen.extend(records)
        if offset is None:
            break
    return seen


def test_scroll_pages_through_admitted_points_only(stack: GateStack, fake: FakeQdrant) -> None:
    seen = _scroll_all(client(stack), limit=4)
    assert [record.id for record in seen] == ADMITTED
    _check_points(seen)
    _, request = received(fake, "Scroll", q.ScrollPoints)
    assert request.filter == q.Filter(must=[TENANT])
    assert request.limit == 4  # scroll is never over-fetched
    assert request.offset == q.PointId(num=105)  # right after the last released point


def test_a_scroll_page_with_nothing_released_ends_the_scroll(stack: GateStack) -> None:
    # Pages of 3: 101-103 (101 released), 102-104 (104), 105-107 (none): any
    # cursor after that page would name a rejected point, so there is none,
    # and 108 is not reached (as over REST).
    seen = _scroll_all(client(stack), limit=3)
    assert [record.id for record in seen] == [101, 104]


def test_retrieve_returns_only_admitted_points(stack: GateStack, fake: FakeQdrant) -> None:
    qdrant = client(stack)
    records = qdrant.retrieve("docs", ids=[*CORPUS, 999], with_payload=True)
    assert [record.id for record in records] == ADMITTED
    _check_points(records)
    # A rejected point is retrieved like an absent one.
    assert qdrant.retrieve("docs", ids=[103]) == qdrant.retrieve("docs", ids=[999]) == []


def test_the_deprecated_search_calls_are_filtered(stack: GateStack, fake: FakeQdrant) -> None:
    qdrant = client(stack)  # the stub's channel lives as long as its client
    points = qdrant.grpc_points
    with_payload = q.WithPayloadSelector(enable=True)
    reply = points.Search(
        q.SearchPoints(
            collection_name="docs", vector=[0.1, 0.2], limit=8, with_payload=with_payload
        )
    )
    assert [p.id.num for p in reply.result] == ADMITTED
    assert not reply.HasField("usage")
    _, request = received(fake, "Search", q.SearchPoints)
    assert (request.filter, request.limit) == (q.Filter(must=[TENANT]), 16)
    batch = points.SearchBatch(
        q.SearchBatchPoints(
            collection_name="docs",
            search_points=[
                q.SearchPoints(collection_name="docs", vector=[0.1], limit=2),
                q.SearchPoints(collection_name="docs", vector=[0.2], limit=8),
            ],
        )
    )
    assert [[p.id.num for p in r.result] for r in batch.result] == [ADMITTED[:2], ADMITTED]
    groups = points.SearchGroups(
        q.SearchPointGroups(
            collection_name="docs", vector=[0.1], limit=1, group_by="doc_id", group_size=3
        )
    )
    # The first group that keeps hits: doc-2 (101, 104).
    assert [[p.id.num for p in g.hits] for g in groups.result.groups] == [[101, 104]]
    recommended = points.Recommend(
        q.RecommendPoints(
            collection_name="docs",
            positive_vectors=[q.Vector(dense=q.DenseVector(data=[0.1, 0.2]))],
            limit=8,
        )
    )
    assert [p.id.num for p in recommended.result] == ADMITTED
    discovered = points.Discover(
        q.DiscoverPoints(
            collection_name="docs",
            target=q.TargetVector(
                single=q.VectorExample(vector=q.Vector(dense=q.DenseVector(data=[0.1])))
            ),
            limit=8,
        )
    )
    assert [p.id.num for p in discovered.result] == ADMITTED


def test_a_query_by_point_id_is_refused_before_the_database(
    stack: GateStack, fake: FakeQdrant
) -> None:
    qdrant = client(stack)
    calls = len(fake.upstream.calls)
    with pytest.raises(grpc.RpcError) as raised:
        qdrant.query_points("docs", query=103, limit=3)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as raised:
        qdrant.grpc_points.Recommend(
            q.RecommendPoints(collection_name="docs", positive=[q.PointId(num=103)], limit=3)
        )
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "103" not in (raised.value.details() or "")
    assert len(fake.upstream.calls) == calls  # never forwarded


def test_count_is_content_the_gate_cannot_filter(stack: GateStack, fake: FakeQdrant) -> None:
    calls = len(fake.upstream.calls)
    with pytest.raises(grpc.RpcError) as raised:
        client(stack).count("docs")
    assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert len(fake.upstream.calls) == calls


def test_a_bad_token_fails_fast(stack: GateStack, fake: FakeQdrant) -> None:
    calls = len(fake.upstream.calls)
    other = tokens.hmac_secret()
    for api_key in ("not-a-jwt", tokens.token(other, tokens.claims(groups=["qa"]))):
        with pytest.raises(grpc.RpcError) as raised:
            client(stack, api_key).query_points("docs", query=[0.1, 0.2], limit=3)
        assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert len(fake.upstream.calls) == calls


def test_a_compressing_client_gets_the_same_answer(stack: GateStack) -> None:
    qdrant = client(stack, grpc_compression=grpc.Compression.Gzip)
    response = qdrant.query_points("docs", query=[0.1, 0.2], limit=8, with_payload=True)
    assert [point.id for point in response.points] == ADMITTED
    _check_points(response.points)


def test_a_collection_of_another_tenant_is_refused_however_the_request_names_it(
    stack: GateStack, fake: FakeQdrant
) -> None:
    qdrant = client(stack)
    calls = len(fake.upstream.calls)
    elsewhere = models.LookupLocation(collection="finance")
    for call in (
        lambda: qdrant.query_points("finance", query=[0.1, 0.2], limit=3),
        lambda: qdrant.query_points("docs", query=[0.1, 0.2], limit=3, lookup_from=elsewhere),
        lambda: qdrant.query_points_groups(
            "docs", group_by="doc_id", query=[0.1, 0.2], with_lookup="finance"
        ),
        lambda: qdrant.query_batch_points(
            "docs",
            requests=[
                models.QueryRequest(
                    prefetch=models.Prefetch(query=[0.1], lookup_from=elsewhere), limit=3
                )
            ],
        ),
        lambda: qdrant.retrieve("finance", ids=[101]),
        lambda: qdrant.scroll("finance", limit=3),
    ):
        with pytest.raises(grpc.RpcError) as raised:
            call()
        assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert len(fake.upstream.calls) == calls  # nothing of finance was read
    # globex, finance's owner, may.
    owner = client(stack, jwt(tenant="globex"))
    response = owner.query_points("finance", query=[0.1, 0.2], limit=8)
    assert [point.id for point in response.points] == [103]
    _, request = received(fake, "Query", q.QueryPoints)
    assert request.collection_name == "finance"
    assert request.filter.must[0].field.match.keyword == "globex"
