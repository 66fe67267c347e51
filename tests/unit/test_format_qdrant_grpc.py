"""The Qdrant gRPC adapter: the gate's protos, method kinds, candidates and released replies.

Replies are built with qdrant-client's own message classes (``qdrant_client.grpc``,
as a Qdrant server sends them) and what the gate renders is parsed with the
same classes, as an unchanged application reads it.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Iterator, Sequence
from importlib import resources
from typing import Any

import orjson
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor
from hypothesis import given
from hypothesis import strategies as st
from qdrant_client import grpc as q
from qdrant_client.conversions.conversion import GrpcToRest, json_to_value, value_to_json

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.formats import grpc_messages
from sidecar.formats.base import SUBSTITUTED_FOR, MalformedBody, Unreleasable
from sidecar.formats.grpc_frames import frame
from sidecar.formats.options import AdapterOptions
from sidecar.formats.qdrant.grpc import QdrantGrpcFormat, fill_value, point_id, python_value
from sidecar.formats.qdrant.rest import GROUP_ID_NOT_RELEASED, QdrantFormat, next_offset_after
from tests.fixtures.format_strategies import PROPERTIES, adapter
from tests.fixtures.qdrant_grpc_upstream import (
    framed,
    ids_of,
    payload,
    retrieved,
    route_path,
    scored,
    unframed,
)

# JSON values as Qdrant's payloads hold them: integers are int64.
payload_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)

# Groups here are grouped by "doc", declared releasable: a group's id goes out only
# as a value the caller gets anyway.
FORMAT = QdrantGrpcFormat(AdapterOptions(releasable_fields=["doc"]))
UUID_A = "5c56c793-69f3-4fbf-87e6-c4bf54c28c26"


def route(method: str) -> Route:
    return Route("POST", route_path(method))


# Method -> (reply class, layout), as Qdrant defines them.
POINTS: dict[str, Any] = {
    "Get": q.GetResponse,
    "Search": q.SearchResponse,
    "Recommend": q.RecommendResponse,
    "Discover": q.DiscoverResponse,
    "Query": q.QueryResponse,
}
BATCHES: dict[str, Any] = {
    "SearchBatch": q.SearchBatchResponse,
    "RecommendBatch": q.RecommendBatchResponse,
    "DiscoverBatch": q.DiscoverBatchResponse,
    "QueryBatch": q.QueryBatchResponse,
}
GROUPS: dict[str, Any] = {
    "SearchGroups": q.SearchGroupsResponse,
    "RecommendGroups": q.RecommendGroupsResponse,
    "QueryGroups": q.QueryGroupsResponse,
}
FILTERED = {*POINTS, *BATCHES, *GROUPS, "Scroll"}
CONTENT = {"Count", "Facet", "SearchMatrixPairs", "SearchMatrixOffsets"}


def _point(method: str, chunk_id: str | int, text: str | None, **fields: Any) -> Any:
    """The point a reply of ``method`` carries."""
    if method in ("Get", "Scroll"):
        return retrieved(chunk_id, text, **fields)
    return scored(chunk_id, text, **fields)


# -- the gate's copy of Qdrant's protos -----------------------------------------


def _gate_pool() -> descriptor_pool.DescriptorPool:
    data = resources.files("sidecar.formats").joinpath(grpc_messages.DESCRIPTORS).read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for proto in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(proto)
    return pool


def _gate_messages() -> Iterator[Descriptor]:
    pool = _gate_pool()
    names = ("points", "points_service", "qdrant_common", "json_with_int", "collections")
    for name in (*names, "snapshots_service"):
        yield from _nested(pool.FindFileByName(f"qdrant/{name}.proto").message_types_by_name)


def _nested(types: Any) -> Iterator[Descriptor]:
    for message in types.values():
        yield message
        yield from _nested(message.nested_types_by_name)


def _vendor(full_name: str) -> Descriptor:
    return descriptor_pool.Default().FindMessageTypeByName(full_name)


def _shape(field: Any) -> tuple[Any, ...]:
    sub = field.message_type.full_name if field.message_type else None
    enum = field.enum_type.full_name if field.enum_type else None
    oneof = field.containing_oneof.name if field.containing_oneof else None
    return (field.number, field.type, field.is_repeated, sub, enum, oneof, field.has_presence)


# Messages every field of which the gate's copy must declare: what a server
# sends in a filtered reply, and where a request can hide a query, an example
# or a collection (a field left out there would pass unseen).
COMPLETE = {
    *(cls.DESCRIPTOR.full_name for cls in [*POINTS.values(), *BATCHES.values()]),
    *(cls.DESCRIPTOR.full_name for cls in GROUPS.values()),
    "qdrant.ScrollResponse",
    "qdrant.ScoredPoint",
    "qdrant.RetrievedPoint",
    "qdrant.PointId",
    "qdrant.GroupId",
    "qdrant.PointGroup",
    "qdrant.GroupsResult",
    "qdrant.BatchResult",
    "qdrant.VectorsOutput",
    "qdrant.VectorOutput",
    "qdrant.NamedVectorsOutput",
    "qdrant.DenseVector",
    "qdrant.SparseVector",
    "qdrant.MultiDenseVector",
    "qdrant.SparseIndices",
    "qdrant.ShardKey",
    "qdrant.OrderValue",
    "qdrant.Value",
    "qdrant.Struct",
    "qdrant.ListValue",
    "qdrant.Usage",
    "qdrant.HardwareUsage",
    "qdrant.InferenceUsage",
    "qdrant.ModelUsage",
    "qdrant.Filter",
    "qdrant.Condition",
    "qdrant.FieldCondition",
    "qdrant.Match",
    "qdrant.SearchPoints",
    "qdrant.SearchBatchPoints",
    "qdrant.SearchPointGroups",
    "qdrant.ScrollPoints",
    "qdrant.RecommendPoints",
    "qdrant.RecommendBatchPoints",
    "qdrant.RecommendPointGroups",
    "qdrant.DiscoverPoints",
    "qdrant.DiscoverBatchPoints",
    "qdrant.QueryPoints",
    "qdrant.QueryBatchPoints",
    "qdrant.QueryPointGroups",
    "qdrant.PrefetchQuery",
    "qdrant.Query",
    "qdrant.VectorInput",
    "qdrant.RecommendInput",
    "qdrant.DiscoverInput",
    "qdrant.ContextInput",
    "qdrant.ContextInputPair",
    "qdrant.NearestInputWithMmr",
    "qdrant.RelevanceFeedbackInput",
    "qdrant.FeedbackItem",
    "qdrant.TargetVector",
    "qdrant.VectorExample",
    "qdrant.ContextExamplePair",
    "qdrant.LookupLocation",
    "qdrant.WithLookup",
}


def test_gate_protos_declare_qdrants_fields_with_qdrants_numbers() -> None:
    checked = 0
    for message in _gate_messages():
        vendor = _vendor(message.full_name)
        for field in message.fields:
            assert field.name in vendor.fields_by_name, (message.full_name, field.name)
            assert _shape(field) == _shape(vendor.fields_by_name[field.name]), (
                message.full_name,
                field.name,
            )
        if message.full_name in COMPLETE:
            assert {f.name for f in message.fields} == {f.name for f in vendor.fields}, (
                message.full_name
            )
            checked += 1
    assert checked == len(COMPLETE)


@pytest.mark.parametrize("service", ["qdrant.Points", "qdrant.Collections", "qdrant.Snapshots"])
def test_gate_protos_define_qdrants_services_as_qdrant_does(service: str) -> None:
    ours = _gate_pool().FindServiceByName(service)
    theirs = descriptor_pool.Default().FindServiceByName(service)
    assert {m.name for m in ours.methods} == {m.name for m in theirs.methods}
    for method in ours.methods:
        vendor = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == vendor.input_type.full_name
        assert method.output_type.full_name == vendor.output_type.full_name


def test_gate_protos_are_not_in_the_default_pool() -> None:
    # qdrant-client's own registration is untouched, and the gate's classes are others.
    ours = grpc_messages.message_class("qdrant.ScoredPoint")
    assert ours is not q.ScoredPoint
    assert ours.DESCRIPTOR.file.name == "qdrant/points.proto"


# -- routes ----------------------------------------------------------------------


def test_every_method_of_the_points_service_is_classified() -> None:
    service = descriptor_pool.Default().FindServiceByName("qdrant.Points")
    kinds = {m.name: FORMAT.route_kind(route(m.name)) for m in service.methods}
    assert None not in kinds.values()
    assert {m for m, kind in kinds.items() if kind is RouteKind.FILTERED} == FILTERED
    assert {m for m, kind in kinds.items() if kind is RouteKind.CONTENT} == CONTENT
    writes = {m for m, kind in kinds.items() if kind is RouteKind.WRITE}
    assert writes == set(kinds) - FILTERED - CONTENT
    assert {"Upsert", "Delete", "SetPayload", "UpdateBatch", "CreateFieldIndex"} <= writes


@pytest.mark.parametrize(
    "route_",
    [
        Route("GET", "/qdrant.Points/Query"),
        Route("POST", "/qdrant.Points/"),
        Route("POST", "/qdrant.Points/Query/x"),
        Route("GET", "/qdrant.Collections/Get"),
        Route("POST", "/qdrant.Qdrant/HealthCheck"),
        Route("POST", "/collections/docs/points/query"),
    ],
    ids=str,
)
def test_other_paths_are_not_its_routes(route_: Route) -> None:
    assert FORMAT.route_kind(route_) is None
    with pytest.raises(ValueError, match="not handled"):
        FORMAT.parse(b"", route_)


def test_a_method_it_does_not_know_may_return_content() -> None:
    # A newer Qdrant's method: the request policy must see it as content, not unknown.
    assert FORMAT.route_kind(route("NewMethod")) is RouteKind.CONTENT
    with pytest.raises(ValueError, match="not handled"):
        FORMAT.parse(b"", route("NewMethod"))


def test_name_and_collections() -> None:
    assert FORMAT.name == "qdrant_grpc"
    assert FORMAT.route_collections(route("Query")) == []


COLLECTION_KINDS = {
    "Get": RouteKind.CONTENT,  # points_count: the REST twin filters it, this reply is not read
    "List": RouteKind.CONTENT,
    "ListCollectionAliases": RouteKind.CONTENT,
    "ListAliases": RouteKind.CONTENT,
    "CollectionClusterInfo": RouteKind.CONTENT,
    "ListShardKeys": RouteKind.CONTENT,
    "CollectionExists": RouteKind.READ,
    "Create": RouteKind.WRITE,
    "Update": RouteKind.WRITE,
    "Delete": RouteKind.WRITE,
    "UpdateAliases": RouteKind.WRITE,
    "UpdateCollectionClusterSetup": RouteKind.WRITE,
    "CreateShardKey": RouteKind.WRITE,
    "DeleteShardKey": RouteKind.WRITE,
}
# Methods whose request names no collection the gate reads.
NAMES_NONE = {
    "/qdrant.Collections/List",
    "/qdrant.Collections/ListAliases",
    "/qdrant.Collections/UpdateAliases",
    "/qdrant.Snapshots/CreateFull",
    "/qdrant.Snapshots/ListFull",
    "/qdrant.Snapshots/DeleteFull",
}


@pytest.mark.parametrize("service", ["qdrant.Collections", "qdrant.Snapshots"])
def test_every_method_of_the_collections_and_snapshots_services_is_classified(
    service: str,
) -> None:
    methods = {m.name for m in descriptor_pool.Default().FindServiceByName(service).methods}
    expected = COLLECTION_KINDS if service == "qdrant.Collections" else None
    for name in methods:
        found = FORMAT.route_kind(Route("POST", f"/{service}/{name}"))
        assert found is (RouteKind.CONTENT if expected is None else expected[name]), name
    if expected is not None:
        assert methods == set(expected)
    assert FORMAT.route_kind(Route("POST", f"/{service}/NewMethod")) is RouteKind.CONTENT


@pytest.mark.parametrize("service", ["qdrant.Collections", "qdrant.Snapshots"])
def test_requests_naming_a_collection_are_read_for_it_and_the_rest_name_every_one(
    service: str,
) -> None:
    for method in descriptor_pool.Default().FindServiceByName(service).methods:
        path = f"/{service}/{method.name}"
        if path in NAMES_NONE:
            assert not FORMAT.rewrites_request(Route("POST", path))
            assert FORMAT.route_collections(Route("POST", path)) == ["*"], path
            continue
        assert FORMAT.rewrites_request(Route("POST", path)), path
        assert FORMAT.route_collections(Route("POST", path)) == [], path
        # qdrant-client's own request message, every field as Qdrant declares it.
        request: Any = message_factory.GetMessageClass(method.input_type)()
        request.collection_name = "hr"
        body = frame(request.SerializeToString())
        assert FORMAT.request_collections(body, Route("POST", path)) == ("hr",), path
    unknown = Route("POST", f"/{service}/NewMethod")
    assert FORMAT.route_collections(unknown) == ["*"]


# -- candidates ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("point_id", "chunk_id"),
    [
        (q.PointId(num=0), "0"),
        (q.PointId(num=2**64 - 1), str(2**64 - 1)),
        (q.PointId(uuid=UUID_A.upper()), UUID_A),
        (q.PointId(uuid="{" + UUID_A.replace("-", "") + "}"), UUID_A),
    ],
)
def test_chunk_id_is_the_point_id_in_canonical_form(point_id: Any, chunk_id: str) -> None:
    point = q.ScoredPoint(id=point_id, payload=payload({"text": "t"}))
    parsed = FORMAT.parse(framed(q.QueryResponse(result=[point])), route("Query"))
    assert [(c.chunk_id, c.text, c.problem) for c in parsed.candidates] == [(chunk_id, "t", None)]


@pytest.mark.parametrize(
    ("point", "problem"),
    [
        (q.ScoredPoint(payload=payload({"text": "t"})), "point id missing"),
        (q.ScoredPoint(id=q.PointId(uuid="nope"), payload=payload({"text": "t"})), "not a UUID"),
        (q.ScoredPoint(id=q.PointId(num=1)), "no payload"),
        (q.ScoredPoint(id=q.PointId(num=1), payload=payload({"x": 1})), "'text' missing"),
        (q.ScoredPoint(id=q.PointId(num=1), payload=payload({"text": 1})), "not a string"),
        (q.ScoredPoint(id=q.PointId(num=1), payload={"text": q.Value()}), "'text' missing"),
    ],
)
def test_unusable_points_are_candidates_with_a_problem(point: Any, problem: str) -> None:
    (candidate,) = FORMAT.parse(framed(q.QueryResponse(result=[point])), route("Query")).candidates
    assert candidate.problem is not None and problem in candidate.problem
    assert candidate.chunk_id is None or candidate.text is None


def test_id_field_and_text_field_options() -> None:
    fmt = QdrantGrpcFormat(AdapterOptions(text_field="body", id_field="chunk"))
    point = q.ScoredPoint(id=q.PointId(num=9), payload=payload({"body": "b", "chunk": "c-1"}))
    (candidate,) = fmt.parse(framed(q.QueryResponse(result=[point])), route("Query")).candidates
    assert (candidate.chunk_id, candidate.text) == ("c-1", "b")
    with pytest.raises(ValueError):
        QdrantGrpcFormat(AdapterOptions(text_field=""))
    with pytest.raises(ValueError):
        QdrantGrpcFormat(AdapterOptions(id_field=""))


def test_problems_never_contain_payload_values() -> None:
    secret = "SECRET-VALUE-123"
    points = [
        q.ScoredPoint(id=q.PointId(uuid=secret), payload=payload({"text": "t"})),
        q.ScoredPoint(id=q.PointId(num=1), payload=payload({"text": {"s": secret}})),
    ]
    parsed = FORMAT.parse(framed(q.QueryResponse(result=points)), route("Query"))
    assert all(secret not in (c.problem or "") for c in parsed.candidates)


# -- released replies ------------------------------------------------------------


def _ids(points: Sequence[Any]) -> list[Any]:
    return ids_of(points)


@pytest.mark.parametrize("method", sorted(POINTS))
def test_points_reply_keeps_exactly_the_kept_points(method: str) -> None:
    points = [_point(method, i, f"text {i}") for i in range(1, 6)]
    reply = POINTS[method](result=points, time=0.25)
    parsed = FORMAT.parse(framed(reply), route(method))
    out = unframed(POINTS[method], parsed.render({0, 2, 4}))
    assert _ids(out.result) == [1, 3, 5]
    assert out.time == 0.25
    assert parsed.released_positions({0, 2, 4}) == [0, 2, 4]


def test_everything_but_the_points_own_fields_and_declared_payload_is_dropped() -> None:
    point = q.ScoredPoint(
        id=q.PointId(num=1),
        score=0.75,
        version=12,
        payload=payload({"text": "t", "secret": "s", "doc_id": "d"}),
        vectors=q.VectorsOutput(vector=q.VectorOutput(dense=q.DenseVector(data=[0.5, 0.25]))),
        shard_key=q.ShardKey(keyword="k"),
        order_value=q.OrderValue(int=4),
    )
    reply = q.QueryResponse(
        result=[point], time=0.5, usage=q.Usage(hardware=q.HardwareUsage(cpu=100))
    )
    fmt = QdrantGrpcFormat(AdapterOptions(releasable_fields=["doc_id"]))
    out = unframed(q.QueryResponse, fmt.parse(framed(reply), route("Query")).render({0}))
    expected = q.ScoredPoint()
    expected.CopyFrom(point)
    del expected.payload["secret"]
    assert list(out.result) == [expected]
    assert not out.HasField("usage")
    assert out.time == 0.5


def test_a_reply_with_nothing_to_remove_goes_out_byte_for_byte() -> None:
    reply = q.QueryResponse(result=[scored(1, "a"), scored(2, "b")], time=0.1)
    body = framed(reply)
    assert FORMAT.parse(body, route("Query")).render({0, 1}) == body
    # Usage (work over every tenant's points) is always removed.
    reply.usage.hardware.cpu = 3
    body = framed(reply)
    assert unframed(q.QueryResponse, FORMAT.parse(body, route("Query")).render({0, 1})) != reply


def test_a_newer_servers_per_point_field_never_passes() -> None:
    point = scored(1, "a")
    # Field 99 of ScoredPoint, a string: what a newer Qdrant could add per hit.
    data = point.SerializeToString() + b"\x9a\x06\x06secret"
    raw = q.QueryResponse(time=0.1).SerializeToString() + b"\x0a" + bytes([len(data)]) + data
    parsed = FORMAT.parse(frame(raw), route("Query"))
    rendered = parsed.render({0})
    assert b"secret" not in rendered
    assert _ids(unframed(q.QueryResponse, rendered).result) == [1]


@pytest.mark.parametrize("method", sorted(BATCHES))
def test_batch_replies_keep_the_kept_points_of_each_sub_result(method: str) -> None:
    reply = BATCHES[method](
        result=[
            q.BatchResult(result=[scored(1, "a"), scored(2, "b")]),
            q.BatchResult(result=[]),
            q.BatchResult(result=[scored(2, "b"), scored(3, "c")]),
        ]
    )
    parsed = FORMAT.parse(framed(reply), route(method))
    out = unframed(BATCHES[method], parsed.render({1, 2}, limits=[None, 5, 1]))
    assert [_ids(batch.result) for batch in out.result] == [[2], [], [2]]
    with pytest.raises(MalformedBody):
        parsed.render({1}, limits=[None])


def _groups_reply(cls: Any) -> Any:
    return cls(
        result=q.GroupsResult(
            groups=[
                q.PointGroup(
                    id=q.GroupId(string_value="g1"),
                    hits=[scored(1, "a", doc="g1"), scored(2, "b", doc="g1")],
                    lookup=retrieved(10, "lookup 10"),
                ),
                q.PointGroup(id=q.GroupId(unsigned_value=5), hits=[scored(3, "c", doc=5)]),
                q.PointGroup(
                    id=q.GroupId(integer_value=-1),
                    hits=[scored(4, "d", doc=-1)],
                    lookup=retrieved(11, "lookup 11"),
                ),
            ]
        ),
        time=0.2,
    )


@pytest.mark.parametrize("method", sorted(GROUPS))
def test_group_replies(method: str) -> None:
    cls = GROUPS[method]
    parsed = FORMAT.parse(framed(_groups_reply(cls)), route(method))
    # Lookups are candidates after their group's hits.
    assert [c.chunk_id for c in parsed.candidates] == ["1", "2", "10", "3", "4", "11"]
    out = unframed(cls, parsed.render({1, 3, 5}))
    groups = out.result.groups
    assert [_ids(g.hits) for g in groups] == [[2], [3]]
    # A rejected lookup is left out, as Qdrant leaves out a missing one.
    assert [g.HasField("lookup") for g in groups] == [False, False]
    assert [g.id for g in groups] == [q.GroupId(string_value="g1"), q.GroupId(unsigned_value=5)]
    # A group whose hits are all rejected goes, even with a kept lookup; the
    # limit counts the groups that remain.
    out = unframed(cls, parsed.render({2, 4, 5}, limits=[1]))
    assert [_ids(g.hits) for g in out.result.groups] == [[4]]
    assert _ids([out.result.groups[0].lookup]) == [11]


@pytest.mark.parametrize(
    ("group_id", "value"),
    [
        (q.GroupId(string_value="acme-merger"), None),  # group_by a field not released
        (q.GroupId(string_value="another tenant's value"), "doc-1"),  # none of its hits'
        (q.GroupId(unsigned_value=7), "7"),  # a value of another type
    ],
)
def test_a_group_id_that_is_no_released_value_is_unreleasable(group_id: Any, value: Any) -> None:
    fields = {"secret": "acme-merger"} if value is None else {"doc": value}
    reply = q.QueryGroupsResponse(
        result=q.GroupsResult(groups=[q.PointGroup(id=group_id, hits=[scored(1, "a", **fields)])])
    )
    parsed = FORMAT.parse(framed(reply), route("QueryGroups"))
    with pytest.raises(Unreleasable) as raised:
        parsed.render({0})
    assert raised.value.code == GROUP_ID_NOT_RELEASED


def test_a_group_id_is_released_by_its_released_lookup_point() -> None:
    group = q.PointGroup(
        id=q.GroupId(unsigned_value=42),
        hits=[scored(1, "a", secret=42)],
        lookup=retrieved(42, "doc 42"),
    )
    reply = q.QueryGroupsResponse(result=q.GroupsResult(groups=[group]))
    parsed = QdrantGrpcFormat().parse(framed(reply), route("QueryGroups"))
    out = unframed(q.QueryGroupsResponse, parsed.render({0, 1}))
    assert out.result.groups[0].id == q.GroupId(unsigned_value=42)
    with pytest.raises(Unreleasable):
        parsed.render({0})


def _scroll(ids: Sequence[int | str], following: int | str | None) -> bytes:
    reply = q.ScrollResponse(result=[retrieved(i, f"t{i}") for i in ids], time=0.1)
    if following is not None:
        reply.next_page_offset.CopyFrom(
            q.PointId(num=following) if isinstance(following, int) else q.PointId(uuid=following)
        )
    return framed(reply)


@pytest.mark.parametrize(
    ("ids", "following", "keep", "cursor"),
    [
        ([1, 5, 9], 12, {0, 1, 2}, q.PointId(num=10)),
        ([1, 5, 9], 12, {0, 1}, q.PointId(num=6)),
        ([1, 5, 9], 12, {0}, q.PointId(num=2)),
        ([1, 5, 9], 12, set(), None),
        ([1, 5, 9], None, {0}, None),
        ([2**64 - 1], UUID_A, {0}, q.PointId(uuid=str(uuid.UUID(int=0)))),
        ([UUID_A], "ffffffff-0000-0000-0000-000000000000", {0}, q.PointId(uuid=UUID_A[:-1] + "7")),
        (["ffffffff-ffff-ffff-ffff-ffffffffffff"], UUID_A, {0}, None),
    ],
)
def test_scroll_cursor_is_just_after_the_last_released_point(
    ids: list[int | str], following: int | str | None, keep: set[int], cursor: Any
) -> None:
    out = unframed(
        q.ScrollResponse, FORMAT.parse(_scroll(ids, following), route("Scroll")).render(keep)
    )
    assert _ids(out.result) == [ids[i] for i in sorted(keep)]
    if cursor is None:
        assert not out.HasField("next_page_offset")
    else:
        assert out.next_page_offset == cursor


def test_a_substitute_takes_the_replaced_points_place() -> None:
    reply = q.QueryResponse(result=[scored(1, "old", score=0.9, doc_id="d", other="o")])
    fmt = QdrantGrpcFormat(AdapterOptions(releasable_fields=["doc_id"]))
    parsed = fmt.parse(framed(reply), route("Query"))
    out = unframed(
        q.QueryResponse, parsed.render({0}, replacements={0: Replacement("77", "new text")})
    )
    (point,) = out.result
    assert point.id == q.PointId(num=77)
    assert point.score == pytest.approx(0.9)
    assert GrpcToRest.convert_payload(point.payload) == {"text": "new text", SUBSTITUTED_FOR: 1}
    out = unframed(
        q.QueryResponse, parsed.render({0}, replacements={0: Replacement(UUID_A, "new")})
    )
    assert out.result[0].id == q.PointId(uuid=UUID_A)


def test_a_substitute_marks_an_id_beyond_int64_exactly() -> None:
    reply = q.QueryResponse(result=[scored(2**64 - 1, "old")])
    parsed = FORMAT.parse(framed(reply), route("Query"))
    out = unframed(q.QueryResponse, parsed.render({0}, replacements={0: Replacement("1", "n")}))
    assert out.result[0].payload[SUBSTITUTED_FOR].string_value == str(2**64 - 1)


def test_render_can_be_called_again_with_another_keep_set() -> None:
    parsed = FORMAT.parse(
        framed(q.QueryResponse(result=[scored(i, "t") for i in range(4)])), route("Query")
    )
    assert _ids(unframed(q.QueryResponse, parsed.render({0})).result) == [0]
    assert _ids(unframed(q.QueryResponse, parsed.render({1, 3})).result) == [1, 3]
    assert parsed.released_positions({2}) == [2]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00\x00",
        frame(b"\xff\xff\xff"),
        frame(b"") + frame(b""),
        b"\x01\x00\x00\x00\x00",
        frame(q.QueryResponse().SerializeToString())[:-1] + b"\x00\x00",
    ],
)
def test_unreadable_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody):
        FORMAT.parse(body, route("Query"))


def test_an_empty_reply_is_a_reply_without_points() -> None:
    parsed = FORMAT.parse(frame(b""), route("Query"))
    assert parsed.candidates == ()
    assert unframed(q.QueryResponse, parsed.render(set())) == q.QueryResponse()


# -- payload values ----------------------------------------------------------------


@PROPERTIES
@given(value=payload_values)
def test_payload_values_convert_as_qdrant_client_does(value: Any) -> None:
    converted = json_to_value(value)
    ours = grpc_messages.message_class("qdrant.Value").FromString(converted.SerializeToString())
    assert python_value(ours) == value_to_json(converted) == value
    back = grpc_messages.message_class("qdrant.Value")()
    fill_value(back, python_value(ours))
    assert q.Value.FromString(back.SerializeToString()) == converted


# -- properties ------------------------------------------------------------------

_point_ids = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.uuids().map(str),
)


@st.composite
def _replies(draw: st.DrawFn) -> tuple[str, Any, list[list[Any]]]:
    """A filtered method, a reply of it, and its points per sub-result (for groups:
    per group, hits then lookup)."""
    method = draw(st.sampled_from(sorted(FILTERED)))
    ids = iter(draw(st.lists(_point_ids, min_size=30, max_size=30, unique=True)))

    def points(kind: str, most: int = 4, **fields: Any) -> list[Any]:
        count = draw(st.integers(0, most))
        return [_point(kind, next(ids), draw(st.text(max_size=6)), **fields) for _ in range(count)]

    parts: list[list[Any]]
    if method in POINTS or method == "Scroll":
        parts = [points(method)]
        reply = _reply_class(method)(result=parts[0])
    elif method in BATCHES:
        parts = [points(method) for _ in range(draw(st.integers(0, 3)))]
        reply = BATCHES[method](result=[q.BatchResult(result=s) for s in parts])
    else:
        groups, parts = [], []
        for index in range(draw(st.integers(0, 3))):
            hits = points(method, 3, doc=index)
            lookup = retrieved(next(ids), "l") if draw(st.booleans()) else None
            group = q.PointGroup(id=q.GroupId(unsigned_value=index), hits=hits, lookup=lookup)
            groups.append(group)
            parts.append([*hits, *([lookup] if lookup is not None else [])])
        reply = GROUPS[method](result=q.GroupsResult(groups=groups))
    # What counts the work and the time of the search, as Qdrant reports them.
    reply.time = draw(st.floats(min_value=0, max_value=10))
    if draw(st.booleans()):
        reply.usage.hardware.cpu = draw(st.integers(0, 2**20))
    if method == "Scroll" and draw(st.booleans()):
        reply.next_page_offset.num = 2**64 - 1
    return method, reply, parts


def _reply_class(method: str) -> Any:
    if method == "Scroll":
        return q.ScrollResponse
    return {**POINTS, **BATCHES, **GROUPS}[method]


@PROPERTIES
@given(case=_replies(), data=st.data())
def test_property_released_points_are_exactly_the_kept_ones(
    case: tuple[str, Any, list[list[Any]]], data: st.DataObject
) -> None:
    method, reply, parts = case
    parsed = FORMAT.parse(framed(reply), route(method))
    count = sum(len(part) for part in parts)
    assert len(parsed.candidates) == count
    keep = data.draw(st.sets(st.integers(0, max(count - 1, 0))))
    out = unframed(_reply_class(method), parsed.render(keep))
    assert not grpc_messages.has_unknown_fields(out)
    assert out.time == reply.time
    assert not out.HasField("usage")
    released = parsed.released_positions(keep)
    assert set(released) <= keep
    # Expected: per sub-result, its kept points in order.
    position = 0
    expected: list[list[Any]] = []
    for part in parts:
        expected.append([p for i, p in enumerate(part, position) if i in keep])
        position += len(part)
    if method in GROUPS:
        got = [[*g.hits, *([g.lookup] if g.HasField("lookup") else [])] for g in out.result.groups]
        assert got == [e for e, part in zip(expected, parts, strict=True) if _has_hits(e, part)]
    elif method in BATCHES:
        assert [list(b.result) for b in out.result] == expected
    else:
        assert list(out.result) == expected[0]
        assert set(released) == keep & set(range(count))
    if method == "Scroll":
        # The cursor says nothing of rejected points: it follows the last released one.
        cursor = out.next_page_offset if out.HasField("next_page_offset") else None
        if not expected[0] or not reply.HasField("next_page_offset"):
            assert cursor is None
        else:
            following = next_offset_after({"id": point_id(expected[0][-1])})
            if cursor is None:
                assert following is None
            else:
                assert ids_of([q.RetrievedPoint(id=cursor)]) == [following]


def _has_hits(kept: list[Any], part: list[Any]) -> bool:
    """True when a group's kept points include a hit (not only its lookup)."""
    return any(isinstance(p, q.ScoredPoint) for p in kept)


@PROPERTIES
@given(case=_replies(), data=st.data())
def test_property_limits_keep_the_first_kept_of_each_sub_result(
    case: tuple[str, Any, list[list[Any]]], data: st.DataObject
) -> None:
    method, reply, parts = case
    parsed = FORMAT.parse(framed(reply), route(method))
    subs = len(parts) if method in BATCHES else 1
    limits = data.draw(st.lists(st.none() | st.integers(0, 3), min_size=subs, max_size=subs))
    everything = set(range(len(parsed.candidates)))
    out = unframed(_reply_class(method), parsed.render(everything, limits))
    if method in GROUPS:
        with_hits = [p for p in parts if _has_hits(p, p)]
        assert len(out.result.groups) == len(with_hits[: limits[0]])
    elif method in BATCHES:
        assert [list(b.result) for b in out.result] == [
            part[:limit] for part, limit in zip(parts, limits, strict=True)
        ]
    else:
        assert list(out.result) == parts[0][: limits[0]]


@st.composite
def _with_unknown_fields(draw: st.DrawFn) -> tuple[str, bytes, Any]:
    """A reply with an unknown field put into one of its messages (or itself)."""
    method, reply, _ = draw(_replies())
    targets = list(_messages(reply))
    target = draw(st.sampled_from(targets))
    number = draw(st.integers(min_value=50, max_value=2000))
    # A length-delimited field: what a newer server's string or message looks like.
    tag = (number << 3) | 2
    raw = _varint(tag) + b"\x04leak"
    target.MergeFromString(raw)
    return method, framed(reply), reply


def _messages(message: Any) -> Iterator[Any]:
    yield message
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for item in value.values():
                    yield from _messages(item)
        elif field.is_repeated:
            for item in value:
                yield from _messages(item)
        else:
            yield from _messages(value)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


@PROPERTIES
@given(case=_with_unknown_fields(), data=st.data())
def test_property_unknown_fields_never_pass(
    case: tuple[str, bytes, Any], data: st.DataObject
) -> None:
    method, body, _ = case
    parsed = FORMAT.parse(body, route(method))
    keep = data.draw(st.sets(st.integers(0, max(len(parsed.candidates) - 1, 0))))
    rendered = parsed.render(
        keep | set(range(len(parsed.candidates))) if data.draw(st.booleans()) else keep
    )
    assert b"leak" not in rendered
    assert not grpc_messages.has_unknown_fields(unframed(_reply_class(method), rendered))


@PROPERTIES
@given(
    points=st.lists(
        st.tuples(
            _point_ids,
            st.text(max_size=5),
            st.dictionaries(st.sampled_from("abc"), payload_values, max_size=2),
        ),
        max_size=5,
        unique_by=lambda t: t[0],
    )
)
def test_property_candidates_are_the_rest_adapters_for_the_same_points(
    points: list[tuple[int | str, str, dict[str, Any]]],
) -> None:
    options: dict[str, Any] = {"hashed_fields": ["a", "b"], "releasable_fields": ["c"]}
    grpc_points = [scored(pid, text, **fields) for pid, text, fields in points]
    ours = adapter(QdrantGrpcFormat, **options).parse(
        framed(q.QueryResponse(result=grpc_points)), route("Query")
    )
    rest_body = {
        "result": {
            "points": [
                GrpcToRest.convert_scored_point(p).model_dump(mode="json") for p in grpc_points
            ]
        },
        "status": "ok",
    }
    rest = adapter(QdrantFormat, **options).parse(
        orjson.dumps(rest_body), Route("POST", "/collections/c/points/query")
    )
    assert ours.candidates == rest.candidates
    # And what goes out of each payload is the same.
    keep: Collection[int] = range(len(points))
    out = unframed(q.QueryResponse, ours.render(keep))
    rest_out = orjson.loads(rest.render(keep))["result"]["points"]
    assert [GrpcToRest.convert_payload(p.payload) for p in out.result] == [
        p["payload"] for p in rest_out
    ]


def test_a_substitute_whose_id_is_no_point_id_is_not_released() -> None:
    parsed = FORMAT.parse(framed(q.QueryResponse(result=[scored(1, "old")])), route("Query"))
    with pytest.raises(MalformedBody):
        parsed.render({0}, replacements={0: Replacement(str(2**64), "new")})
