"""The Milvus gRPC adapter: its proto, methods, candidates, filtering, fail-closed release.

Replies are built with pymilvus' own message classes (tests/fixtures/
milvus_grpc_bodies.py) and what the gate renders is read back with pymilvus'
own result parsers, as ``MilvusClient`` reads it. The gate's trimmed proto
(proto/vendor/milvus) is checked against pymilvus' descriptors: same service,
same fields. The unchanged client against a real Milvus Lite through Envoy is
tests/envoy/test_envoy_milvus_grpc.py. Requests: tests/unit/test_milvus_grpc_request.py.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st
from pymilvus.grpc_gen import common_pb2, milvus_pb2, schema_pb2

from sidecar.core.hits import Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedBody
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.milvus.grpc_methods import KINDS
from sidecar.formats.milvus.grpc_request import IteratorEcho
from sidecar.formats.milvus.rest import ERROR_MESSAGE
from sidecar.formats.options import AdapterOptions
from tests.fixtures import milvus_grpc_bodies as mb
from tests.fixtures.format_strategies import PROPERTIES, SLOW_PROPERTIES, adapter
from tests.fixtures.milvus_grpc_bodies import DT, Reply, column

FMT = MilvusGrpcFormat()
SERVICE = "milvus.proto.milvus.MilvusService"


def texts(values: Sequence[str | None], *, nullable: bool = False) -> Any:
    return column("text", DT.VarChar, list(values), nullable=nullable)


def simple(keys: Sequence[Any] = (1, 2, 3), topks: Sequence[int] | None = None) -> Reply:
    keys = list(keys)
    return Reply(
        ids=keys,
        scores=[1.0 - i / 8 for i in range(len(keys))],
        topks=list(topks) if topks is not None else [len(keys)],
        columns=[texts([f"t{k}" for k in keys])],
        output_fields=["text"],
    )


# -- the proto: the gate's copy against pymilvus' --------------------------------------


def _fields(descriptor: Any) -> list[tuple[Any, ...]]:
    proto = descriptor_pb2.DescriptorProto()
    descriptor.CopyToProto(proto)
    return sorted(
        (f.name, f.number, f.type, f.label, f.type_name, f.proto3_optional) for f in proto.field
    )


def _vendor_messages() -> list[Any]:
    pool = grpc_messages._pool()
    found = []
    for name in ("milvus/common.proto", "milvus/schema.proto", "milvus/milvus.proto"):
        pending = list(pool.FindFileByName(name).message_types_by_name.values())
        while pending:
            message = pending.pop()
            found.append(message)
            pending.extend(message.nested_types)
    return found


def _pymilvus_message(full_name: str) -> Any:
    for module in (common_pb2, schema_pb2, milvus_pb2):
        pool = module.DESCRIPTOR.pool
        try:
            return pool.FindMessageTypeByName(full_name)
        except KeyError:
            continue
    raise KeyError(full_name)


def test_declared_messages_have_exactly_pymilvus_fields() -> None:
    declared = [m for m in _vendor_messages() if m.fields]
    assert len(declared) > 50
    for message in declared:
        assert _fields(message) == _fields(_pymilvus_message(message.full_name)), message.full_name


def test_the_filtered_messages_are_declared_whole() -> None:
    for name in ("SearchRequest", "HybridSearchRequest", "QueryRequest", "SearchResults"):
        assert grpc_messages.message_class(f"milvus.proto.milvus.{name}").DESCRIPTOR.fields
    assert grpc_messages.message_class("milvus.proto.schema.FieldData").DESCRIPTOR.fields


def test_the_service_is_pymilvus_service() -> None:
    ours = grpc_messages._pool().FindServiceByName(SERVICE)
    theirs = milvus_pb2.DESCRIPTOR.services_by_name["MilvusService"]
    assert [(m.name, m.input_type.full_name, m.output_type.full_name) for m in ours.methods] == [
        (m.name, m.input_type.full_name, m.output_type.full_name) for m in theirs.methods
    ]


# -- routes ----------------------------------------------------------------------------


def route(name: str, service: str = SERVICE) -> Route:
    return Route("POST", f"/{service}/{name}")


def test_every_method_of_the_service_is_classified() -> None:
    methods = {m.name for m in grpc_messages._pool().FindServiceByName(SERVICE).methods}
    assert set(KINDS) == methods
    for name in methods:
        assert FMT.route_kind(route(name)) is KINDS[name]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("Search", RouteKind.FILTERED),
        ("HybridSearch", RouteKind.FILTERED),
        ("Query", RouteKind.FILTERED),
        ("Connect", RouteKind.READ),
        ("DescribeCollection", RouteKind.READ),
        ("GetLoadState", RouteKind.READ),
        ("GetCollectionStatistics", RouteKind.CONTENT),
        ("DescribeIndex", RouteKind.CONTENT),
        ("GetImportState", RouteKind.CONTENT),
        ("HasNamespace", RouteKind.CONTENT),  # ListNamespaces, one name at a time
        ("GetRefreshExternalCollectionProgress", RouteKind.CONTENT),  # the source
        ("ListRefreshExternalCollectionJobs", RouteKind.CONTENT),
        ("CalcDistance", RouteKind.CONTENT),
        ("Dummy", RouteKind.CONTENT),
        ("ExportSnapshot", RouteKind.CONTENT),
        ("DumpMessages", RouteKind.CONTENT),
        ("Insert", RouteKind.WRITE),
        ("Delete", RouteKind.WRITE),
        ("CreateCollection", RouteKind.WRITE),
    ],
)
def test_method_kinds(name: str, kind: RouteKind) -> None:
    assert FMT.route_kind(route(name)) is kind


def test_an_unknown_method_may_return_content() -> None:
    assert FMT.route_kind(route("SearchV3")) is RouteKind.CONTENT


@pytest.mark.parametrize(
    "bad",
    [
        Route("GET", f"/{SERVICE}/Search"),
        Route("POST", "/milvus.proto.milvus.ClientTelemetryService/ClientHeartbeat"),
        Route("POST", f"/{SERVICE.lower()}/search"),
        Route("POST", "/v2/vectordb/entities/search"),
        Route("POST", f"/{SERVICE}/Search/x"),
    ],
)
def test_paths_outside_the_service_are_not_its(bad: Route) -> None:
    assert FMT.route_kind(bad) is None


def test_name_and_collections() -> None:
    assert FMT.name == "milvus_grpc"
    assert FMT.route_collections(mb.SEARCH) == []


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"id_field": "text"}, "id_field"),
        ({"releasable_fields": "n"}, "releasable_fields"),
        ({"hashed_fields": ["a..b"]}, "hashed_fields"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(MilvusGrpcFormat, **kwargs)


def test_parse_refuses_a_method_it_does_not_filter() -> None:
    with pytest.raises(ValueError):
        FMT.parse(simple().body(), route("DescribeCollection"))


# -- candidates ------------------------------------------------------------------------


@pytest.mark.parametrize("keys", [[1, -2, 2**63 - 1], ["a", "b", ""]])
def test_search_candidates_are_the_primary_keys(keys: list[Any]) -> None:
    parsed = FMT.parse(simple(keys).body(), mb.SEARCH)
    assert [c.chunk_id for c in parsed.candidates][:2] == [str(k) for k in keys[:2]]
    assert [c.text for c in parsed.candidates] == [f"t{k}" for k in keys]
    if keys[2] == "":
        assert parsed.candidates[2].problem == "primary key is empty"


def test_hybrid_search_reads_as_search() -> None:
    parsed = FMT.parse(simple().body(), mb.HYBRID_SEARCH)
    assert [c.chunk_id for c in parsed.candidates] == ["1", "2", "3"]


def test_a_null_or_missing_text_is_a_problem() -> None:
    reply = simple()
    reply.columns = [texts(["a", None, "c"], nullable=True)]
    parsed = FMT.parse(reply.body(), mb.SEARCH)
    assert parsed.candidates[1].text is None
    assert parsed.candidates[1].problem == "field 'text' missing"
    reply.columns = []
    assert all(
        c.problem == "field 'text' missing" for c in FMT.parse(reply.body(), mb.SEARCH).candidates
    )


def test_text_and_id_from_the_dynamic_field() -> None:
    reply = simple()
    reply.columns = [
        column(
            "$meta",
            DT.JSON,
            [{"text": "a", "doc_id": 7}, {"text": 5}, {"other": 1}],
            is_dynamic=True,
        )
    ]
    fmt = MilvusGrpcFormat(AdapterOptions(id_field="doc_id"))
    candidates = fmt.parse(reply.body(), mb.SEARCH).candidates
    assert (candidates[0].chunk_id, candidates[0].text) == ("7", "a")
    assert candidates[1].problem == "field 'doc_id' missing; field 'text' is not a string"
    assert candidates[2].text is None


def test_query_candidates_are_the_primary_key_column() -> None:
    body = mb.query_body([column("pk", DT.Int64, [5, 6]), texts(["a", "b"])])
    parsed = FMT.parse(body, mb.QUERY)
    assert [(c.chunk_id, c.text) for c in parsed.candidates] == [("5", "a"), ("6", "b")]


def test_a_query_without_a_primary_key_name_has_no_ids() -> None:
    body = mb.query_body([column("pk", DT.Int64, [5]), texts(["a"])], primary="")
    assert FMT.parse(body, mb.QUERY).candidates[0].problem == (
        "the reply names no primary key field"
    )


def test_hashed_fields_reach_the_candidate() -> None:
    reply = simple([1])
    reply.columns.append(column("doc", DT.JSON, [{"a": 1, "b": "x"}]))
    reply.columns.append(column("n", DT.Int64, [4]))
    fmt = MilvusGrpcFormat(AdapterOptions(hashed_fields=["doc.a", "n"]))
    candidate = fmt.parse(reply.body(), mb.SEARCH).candidates[0]
    assert candidate.fields == canonical_fields({"doc.a": 1, "n": 4})


def test_a_null_hashed_field_is_hashed_as_null_and_an_absent_one_left_out() -> None:
    reply = simple([1])
    reply.columns.append(column("n", DT.Int64, [None], nullable=True))
    reply.columns.append(column("$meta", DT.JSON, [{"k": None}], is_dynamic=True))
    fmt = MilvusGrpcFormat(AdapterOptions(hashed_fields=["n", "k", "gone"]))
    candidate = fmt.parse(reply.body(), mb.SEARCH).candidates[0]
    assert candidate.fields == canonical_fields({"n": None, "k": None})


def test_a_hashed_binary_field_has_no_canonical_form() -> None:
    reply = simple([1])
    reply.columns.append(column("bin", DT.BinaryVector, [b"a"], dim=8))
    candidate = (
        MilvusGrpcFormat(AdapterOptions(hashed_fields=["bin"]))
        .parse(reply.body(), mb.SEARCH)
        .candidates
    )
    assert candidate[0].text is None
    assert candidate[0].problem == "hashed fields have no canonical form"


# -- release ---------------------------------------------------------------------------


def test_search_keeps_the_kept_rows_of_every_query_and_recounts_topks() -> None:
    reply = simple([1, 2, 3, 4, 5], topks=[3, 2])
    parsed = FMT.parse(reply.body(), mb.SEARCH)
    out = parsed.render({0, 2, 4})
    hits = mb.search_hits(out)
    assert [[h["pk"] for h in query] for query in hits] == [[1, 3], [5]]
    assert [[h["entity"]["text"] for h in query] for query in hits] == [["t1", "t3"], ["t5"]]
    message = mb.search_message(out)
    assert list(message.results.topks) == [2, 1]
    assert list(message.results.scores) == [reply.scores[0], reply.scores[2], reply.scores[4]]
    assert parsed.released_positions({0, 2, 4}) == [0, 2, 4]


def test_limits_trim_each_query_and_set_top_k() -> None:
    parsed = FMT.parse(simple([1, 2, 3, 4, 5], topks=[3, 2]).body(), mb.SEARCH)
    out = mb.search_message(parsed.render({0, 1, 2, 3, 4}, [1]))
    assert list(out.results.ids.int_id.data) == [1, 4]
    assert list(out.results.topks) == [1, 1]
    assert out.results.top_k == 1
    assert parsed.released_positions({0, 1, 2, 3, 4}, [1]) == [0, 3]
    with pytest.raises(MalformedBody):
        parsed.render({0}, [1, 1])


def test_columns_not_declared_are_dropped_and_declared_ones_kept() -> None:
    reply = simple([1, 2])
    reply.columns += [
        column("secret", DT.VarChar, ["s1", "s2"]),
        column("n", DT.Int64, [10, 20]),
        column("$meta", DT.JSON, [{"m": 1, "x": 2}, {"m": 3}], is_dynamic=True),
    ]
    reply.output_fields = ["text", "secret", "n", "m", "x"]
    out = MilvusGrpcFormat(AdapterOptions(releasable_fields=["n", "m"])).parse(
        reply.body(), mb.SEARCH
    )
    rendered = out.render({1})
    assert [h["entity"] for h in mb.search_hits(rendered)[0]] == [{"text": "t2", "n": 20, "m": 3}]
    message = mb.search_message(rendered)
    assert [c.field_name for c in message.results.fields_data] == ["text", "n", "$meta"]
    assert list(message.results.output_fields) == ["text", "n", "m"]


def test_json_fields_release_only_the_declared_paths() -> None:
    reply = simple([1])
    reply.columns.append(column("doc", DT.JSON, [{"a": {"b": 1, "c": 2}, "d": 3}]))
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=["doc.a.b"]))
    hits = mb.search_hits(fmt.parse(reply.body(), mb.SEARCH).render({0}))
    assert hits[0][0]["entity"]["doc"] == {"a": {"b": 1}}


def test_a_path_inside_a_released_path_goes_out_with_it() -> None:
    reply = simple([1])
    reply.columns.append(column("doc", DT.JSON, [{"a": 5, "z": 1}]))
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=["doc.a", "doc.a.b"]))
    hits = mb.search_hits(fmt.parse(reply.body(), mb.SEARCH).render({0}))
    assert hits[0][0]["entity"]["doc"] == {"a": 5}


def test_what_describes_the_unfiltered_search_is_dropped() -> None:
    reply = simple()
    reply.extra = {"recalls": [0.9], "all_search_count": 99}
    message = reply.message()
    message.status.extra_info["report_value"] = "12"
    body = grpc_frames.frame(message.SerializeToString())
    out = mb.search_message(FMT.parse(body, mb.SEARCH).render({0, 1, 2}))
    assert not out.results.recalls
    assert out.results.all_search_count == 0
    assert not out.status.extra_info


def test_nothing_removed_goes_out_byte_for_byte() -> None:
    body = simple().body()
    assert FMT.parse(body, mb.SEARCH).render({0, 1, 2}) == body
    query = mb.query_body([column("pk", DT.Int64, [1, 2]), texts(["a", "b"])])
    assert FMT.parse(query, mb.QUERY).render({0, 1}) == query


def test_a_field_sent_twice_is_sent_once() -> None:
    message = simple().message()
    again = milvus_pb2.SearchResults(collection_name="other").SerializeToString()
    body = grpc_frames.frame(message.SerializeToString() + again)
    out = FMT.parse(body, mb.SEARCH).render({0, 1, 2})
    assert out != body
    assert mb.search_message(out).collection_name == "other"


def test_two_columns_of_one_field_are_malformed() -> None:
    message = simple().message()
    body = grpc_frames.frame(message.SerializeToString() + message.SerializeToString())
    with pytest.raises(MalformedBody, match="same field"):
        FMT.parse(body, mb.SEARCH)


def _ours(body: bytes) -> Any:
    """A rendered search reply decoded with the gate's own classes (unknown fields kept)."""
    return grpc_messages.decode("milvus.proto.milvus.SearchResults", grpc_frames.messages(body)[0])


def _unknown(number: int) -> bytes:
    """A varint field ``number`` with value 1: a field pymilvus 3.0.2 does not declare."""
    tag = number << 3
    out = bytearray()
    while tag > 0x7F:
        out.append(tag & 0x7F | 0x80)
        tag >>= 7
    return bytes([*out, tag, 1])


def test_unknown_fields_never_go_out() -> None:
    reply = simple()
    data = reply.data()
    results = schema_pb2.SearchResultData.FromString(data.SerializeToString() + _unknown(90))
    hidden = schema_pb2.FieldData.FromString(
        column("other", DT.Int64, [1, 2, 3]).SerializeToString() + _unknown(91)
    )
    results.fields_data.append(hidden)
    message = milvus_pb2.SearchResults(status=common_pb2.Status(), results=results)
    body = grpc_frames.frame(message.SerializeToString() + _unknown(92))
    out = FMT.parse(body, mb.SEARCH).render({0, 1, 2})
    decoded = grpc_messages.decode(
        "milvus.proto.milvus.SearchResults", grpc_frames.messages(out)[0]
    )
    assert not grpc_messages.has_unknown_fields(decoded)
    assert [c.field_name for c in decoded.results.fields_data] == ["text"]


def test_a_released_column_with_an_unknown_field_is_refused() -> None:
    reply = simple()
    reply.columns = [
        schema_pb2.FieldData.FromString(texts(["a", "b", "c"]).SerializeToString() + _unknown(30))
    ]
    with pytest.raises(MalformedBody, match="does not know"):
        FMT.parse(reply.body(), mb.SEARCH)


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"topks": [2]}, "'topks'"),
        ({"scores": [0.5]}, "'scores'"),
        ({"extra": {"distances": [0.1]}}, "'distances'"),
        ({"extra": {"element_indices": schema_pb2.LongArray(data=[1])}}, "'element_indices'"),
        ({"columns": [texts(["a", "b"])]}, "one value per row"),
        ({"extra": {"agg_topks": [1]}}, "aggregation"),
    ],
)
def test_replies_that_do_not_add_up_are_malformed(change: dict[str, Any], problem: str) -> None:
    reply = simple()
    for key, value in change.items():
        setattr(reply, key, value)
    with pytest.raises(MalformedBody, match=problem):
        FMT.parse(reply.body(), mb.SEARCH)


def test_search_aggregation_buckets_are_refused() -> None:
    reply = simple()
    reply.extra = {"agg_buckets": [schema_pb2.AggBucket(count=3)]}
    with pytest.raises(MalformedBody, match="aggregation"):
        FMT.parse(reply.body(), mb.SEARCH)


@pytest.mark.parametrize(
    "body",
    [b"", b"\x00\x00\x00\x00\x05abc", b"\x01\x00\x00\x00\x00", b"\x00\x00\x00\x00\x02\xff\xff"],
)
def test_undecodable_replies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody):
        FMT.parse(body, mb.SEARCH)


# -- columns of every kind -------------------------------------------------------------


def _cut_rows(columns: list[Any], keep: set[int], rows: int) -> list[dict[str, Any]]:
    """Render a query reply of ``columns`` keeping ``keep``; the rows pymilvus reads."""
    pk = column("pk", DT.Int64, list(range(rows)))
    body = mb.query_body([pk, texts([str(i) for i in range(rows)]), *columns])
    releasable = [c.field_name for c in columns if not c.is_dynamic] + ["m"]
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=releasable))
    parsed = fmt.parse(body, mb.QUERY)
    assert len(parsed.candidates) == rows
    return mb.query_rows(parsed.render(keep))


def test_nullable_vectors_are_counted_over_valid_rows() -> None:
    vectors = [[1.0, 1.0], None, [3.0, 3.0], None, [5.0, 5.0]]
    rows = _cut_rows([column("vec", DT.FloatVector, vectors, nullable=True, dim=2)], {1, 2, 4}, 5)
    assert [(r["pk"], r["vec"]) for r in rows] == [(1, None), (2, [3.0, 3.0]), (4, [5.0, 5.0])]


def test_nullable_scalars_keep_a_slot_per_row_and_nulls_are_placeholders() -> None:
    data = column("s", DT.VarChar, ["a", None, "c"], nullable=True)
    data.scalars.string_data.data[1] = "hidden in a null slot"
    body = mb.query_body([column("pk", DT.Int64, [0, 1, 2]), texts(["x", "y", "z"]), data])
    parsed = MilvusGrpcFormat(AdapterOptions(releasable_fields=["s"])).parse(body, mb.QUERY)
    out = mb.query_message(parsed.render({1, 2}))
    assert list(out.fields_data[2].scalars.string_data.data) == ["", "c"]
    assert list(out.fields_data[2].valid_data) == [False, True]


@pytest.mark.parametrize(
    ("dtype", "values", "kwargs"),
    [
        (DT.Bool, [True, False, True], {}),
        (DT.Int32, [1, -2, 3], {}),
        (DT.Int64, [2**63 - 1, 0, -(2**63)], {}),
        (DT.Double, [0.5, 1e300, -2.0], {}),
        (DT.VarChar, ["a", "", "c"], {}),
        (DT.JSON, [{"a": 1}, [1, 2], "s"], {}),
        (DT.Array, [[1, 2], [], [3]], {}),
        (DT.FloatVector, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], {"dim": 2}),
        (DT.BinaryVector, [b"\x01\x02", b"\x03\x04", b"\x05\x06"], {"dim": 16}),
        (DT.SparseFloatVector, [{1: 0.5}, {}, {3: 1.0, 20: 2.0}], {"dim": 21}),
    ],
)
def test_every_column_kind_stays_aligned(dtype: int, values: list[Any], kwargs: Any) -> None:
    rows = _cut_rows([column("c", dtype, values, **kwargs)], {0, 2}, 3)
    if dtype == DT.BinaryVector:
        values = [[value] for value in values]  # how pymilvus' query returns them
    assert [(r["pk"], r["c"]) for r in rows] == [(0, values[0]), (2, values[2])]


def test_sparse_dimension_is_that_of_the_rows_sent() -> None:
    values = [{1: 0.5}, {30: 1.0}]
    pk = column("pk", DT.Int64, [0, 1])
    body = mb.query_body(
        [pk, texts(["a", "b"]), column("sp", DT.SparseFloatVector, values, dim=31)]
    )
    out = (
        MilvusGrpcFormat(AdapterOptions(releasable_fields=["sp"])).parse(body, mb.QUERY).render({0})
    )
    assert mb.query_message(out).fields_data[2].vectors.sparse_float_vector.dim == 2


def test_dense_byte_vectors_keep_their_width() -> None:
    data = schema_pb2.FieldData(type=DT.Float16Vector, field_name="h")
    data.vectors.dim = 2
    data.vectors.float16_vector = bytes(range(12))
    body = mb.query_body([column("pk", DT.Int64, [0, 1, 2]), texts(["a", "b", "c"]), data])
    out = (
        MilvusGrpcFormat(AdapterOptions(releasable_fields=["h"]))
        .parse(body, mb.QUERY)
        .render({0, 2})
    )
    assert mb.query_message(out).fields_data[2].vectors.float16_vector == bytes(
        [0, 1, 2, 3, 8, 9, 10, 11]
    )


def test_a_vector_column_that_does_not_divide_is_malformed() -> None:
    data = column("v", DT.FloatVector, [[1.0, 2.0], [3.0, 4.0]], dim=3)
    body = mb.query_body([column("pk", DT.Int64, [0, 1]), texts(["a", "b"]), data])
    with pytest.raises(MalformedBody, match="divide"):
        MilvusGrpcFormat(AdapterOptions(releasable_fields=["v"])).parse(body, mb.QUERY)


def test_struct_array_columns_stay_aligned() -> None:
    data = schema_pb2.FieldData(type=DT.ArrayOfStruct, field_name="st")
    data.struct_arrays.fields.extend(
        [column("x", DT.Array, [[1], [2, 2], [3]]), column("y", DT.Array, [[4], [5, 5], [6]])]
    )
    body = mb.query_body([column("pk", DT.Int64, [0, 1, 2]), texts(["a", "b", "c"]), data])
    out = (
        MilvusGrpcFormat(AdapterOptions(releasable_fields=["st"])).parse(body, mb.QUERY).render({1})
    )
    fields = mb.query_message(out).fields_data[2].struct_arrays.fields
    assert [list(f.scalars.array_data.data[0].long_data.data) for f in fields] == [[2, 2], [5, 5]]


def test_group_by_values_highlights_and_element_indices_follow_the_rows() -> None:
    reply = simple([1, 2, 3])
    reply.columns.append(column("g", DT.VarChar, ["x", "y", "z"]))
    highlight = common_pb2.HighlightResult(
        field_name="text",
        datas=[common_pb2.HighlightData(fragments=[f"<em>t{i}</em>"]) for i in (1, 2, 3)],
    )
    reply.extra = {
        "group_by_field_value": column("g", DT.VarChar, ["x", "y", "z"]),
        "group_by_field_values": [column("g", DT.VarChar, ["x", "y", "z"])],
        "highlight_results": [
            highlight,
            common_pb2.HighlightResult(field_name="secret", datas=highlight.datas),
        ],
        "element_indices": schema_pb2.LongArray(data=[7, 8, 9]),
        "distances": [0.1, 0.2, 0.3],
    }
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=["g"]))
    parsed = fmt.parse(reply.body(), mb.SEARCH)
    out = parsed.render({0, 2}, None, {2: Replacement("33", "new")})
    results = mb.search_message(out).results
    assert list(results.group_by_field_value.scalars.string_data.data) == ["x", "z"]
    assert list(results.group_by_field_values[0].scalars.string_data.data) == ["x", "z"]
    assert [h.field_name for h in results.highlight_results] == ["text"]
    assert [list(d.fragments) for d in results.highlight_results[0].datas] == [["<em>t1</em>"], []]
    assert list(results.element_indices.data) == [7, 9]
    assert list(results.distances) == pytest.approx([0.1, 0.3])
    hits = mb.search_hits(out)[0]
    assert [(h["pk"], h["offset"], h["entity"]["text"]) for h in hits] == [
        (1, 7, "t1"),
        (33, 9, "new"),
    ]


def _iterator_page(
    keys: Sequence[int], token: str = "tok", last_bound: float = 0.75
) -> tuple[Reply, Any]:
    """A search iterator's page of ``keys`` and its iterator fields, as Milvus answers."""
    reply = simple(keys)
    reply.extra = {
        "search_iterator_v2_results": schema_pb2.SearchIteratorV2Results(
            token=token, last_bound=last_bound
        )
    }
    return reply, FMT.parse(reply.body(), mb.SEARCH)


def _iteration(body: bytes) -> tuple[str, float]:
    out = mb.search_message(body).results.search_iterator_v2_results
    return out.token, out.last_bound


def test_an_iterator_bound_is_the_score_of_the_last_row_sent() -> None:
    reply, parsed = _iterator_page([1, 2, 3], last_bound=0.5)  # none of the scores
    token, bound = _iteration(parsed.render({0, 1}))
    assert token == "tok"
    assert bound == pytest.approx(reply.scores[1])
    # Nothing rejected: Milvus' own bound is the last row's score, and so is the gate's.
    assert _iteration(parsed.render({0, 1, 2}))[1] == pytest.approx(reply.scores[2])


def test_a_page_with_no_row_sent_never_carries_a_rejected_rows_score() -> None:
    reply, parsed = _iterator_page([1, 2, 3], last_bound=0.75)
    # A first page: no bound to start from, none goes out (the empty page ends it).
    assert _iteration(parsed.render(set())) == ("tok", 0.0)
    # A later page: the bound it started from, as Milvus answers a page with no row.
    echo = IteratorEcho("tok", 0.9)
    later = FMT.parse(reply.body(), mb.SEARCH, echo)
    token, bound = _iteration(later.render(set()))
    assert token == "tok"
    assert bound == pytest.approx(0.9)
    assert all(_iteration(later.render(set()))[1] != pytest.approx(s) for s in reply.scores)


def test_the_iterator_token_is_the_one_the_request_named() -> None:
    reply, _ = _iterator_page([1, 2], token="planted-by-the-upstream")
    parsed = FMT.parse(reply.body(), mb.SEARCH, IteratorEcho("the-apps-token", 0.9))
    assert _iteration(parsed.render({0}))[0] == "the-apps-token"
    # A first page names none: the server's new token goes out.
    first = FMT.parse(reply.body(), mb.SEARCH, IteratorEcho(None, None))
    assert _iteration(first.render({0}))[0] == "planted-by-the-upstream"


# -- substitutes -----------------------------------------------------------------------


def test_a_substitute_takes_the_key_text_and_nulls_its_declared_fields() -> None:
    reply = simple([1, 2])
    reply.columns += [
        column("pk", DT.Int64, [1, 2]),
        column("n", DT.Int64, [10, 20], nullable=True),
        column("m", DT.Int64, [5, 6]),
        column("$meta", DT.JSON, [{"d": 1}, {"d": 2}], is_dynamic=True),
    ]
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=["n", "m", "d"]))
    out = fmt.parse(reply.body(), mb.SEARCH).render({0, 1}, None, {1: Replacement("9", "fresh")})
    hits = mb.search_hits(out)[0]
    assert hits[0] == {
        "pk": 1,
        "distance": 1.0,
        "entity": {"pk": 1, "text": "t1", "n": 10, "m": 5, "d": 1},
    }
    # n is nullable and goes null; m cannot be null and stays; d leaves the dynamic object.
    assert hits[1]["pk"] == 9
    assert hits[1]["entity"] == {"pk": 9, "text": "fresh", "n": None, "m": 6}


def test_a_substitute_in_a_string_key_reply_and_in_id_field_mode() -> None:
    reply = simple(["a", "b"])
    reply.columns.append(column("doc", DT.VarChar, ["d1", "d2"]))
    out = FMT.parse(reply.body(), mb.SEARCH).render({0}, None, {0: Replacement("z", "T")})
    assert mb.search_hits(out)[0][0]["pk"] == "z"
    fmt = MilvusGrpcFormat(AdapterOptions(id_field="doc"))
    parsed = fmt.parse(reply.body(), mb.SEARCH)
    assert [c.chunk_id for c in parsed.candidates] == ["d1", "d2"]
    hit = mb.search_hits(parsed.render({1}, None, {1: Replacement("d9", "T")}))[0][0]
    assert (hit["pk"], hit["entity"]) == ("b", {"text": "T", "doc": "d9"})


def test_a_substitute_whose_id_an_int64_key_cannot_hold_is_malformed() -> None:
    parsed = FMT.parse(simple([1]).body(), mb.SEARCH)
    with pytest.raises(MalformedBody, match="not an integer"):
        parsed.render({0}, None, {0: Replacement("doc-9", "x")})


# -- errors inside an OK reply ---------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "route"), [("SearchResults", mb.SEARCH), ("QueryResults", mb.QUERY)]
)
def test_an_error_goes_out_with_its_codes_and_the_gates_text(reply: str, route: Route) -> None:
    body = mb.error_body(reply, code=1100, error_code=5, retriable=True, reason='bad "acme-x"')
    parsed = FMT.parse(body, route)
    assert parsed.candidates == ()
    (message,) = grpc_frames.messages(parsed.render(set()))
    status = getattr(milvus_pb2, reply).FromString(message).status
    assert (status.code, status.error_code, status.retriable, status.reason) == (
        1100,
        5,
        True,
        ERROR_MESSAGE,
    )


def test_an_error_with_rows_is_malformed() -> None:
    message = simple().message()
    message.status.code = 65535
    with pytest.raises(MalformedBody, match="error status"):
        FMT.parse(grpc_frames.frame(message.SerializeToString()), mb.SEARCH)


def test_an_empty_search_has_no_hits() -> None:
    body = grpc_frames.frame(
        milvus_pb2.SearchResults(status=common_pb2.Status()).SerializeToString()
    )
    parsed = FMT.parse(body, mb.SEARCH)
    assert parsed.candidates == ()
    assert parsed.render(set()) == body


# -- properties ------------------------------------------------------------------------


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


@st.composite
def search_replies(draw: st.DrawFn) -> tuple[Reply, list[dict[str, Any]]]:
    topks = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    count = sum(topks)
    rows = draw(st.lists(mb.ROW, min_size=count, max_size=count))
    if draw(st.booleans()):
        keys: list[Any] = draw(
            st.lists(st.integers(-(2**63), 2**63 - 1), min_size=count, max_size=count)
        )
    else:
        keys = draw(st.lists(st.text(min_size=1, max_size=4), min_size=count, max_size=count))
    scores = [_float32(draw(st.floats(-2, 2))) for _ in range(count)]
    reply = Reply(
        ids=keys,
        scores=scores,
        topks=topks,
        columns=mb.row_columns(rows, "pk", keys),
        output_fields=["pk", *mb.ROW_NAMES, "extra", "secret"],
    )
    return reply, rows


@SLOW_PROPERTIES
@given(case=search_replies(), data=st.data())
def test_property_search_release(case: tuple[Reply, list[dict[str, Any]]], data: Any) -> None:
    reply, rows = case
    total = len(rows)
    keep = data.draw(st.sets(st.integers(0, max(total - 1, 0))) if total else st.just(set()))
    limit = data.draw(st.none() | st.integers(0, 4))
    fmt = MilvusGrpcFormat(AdapterOptions(releasable_fields=mb.RELEASABLE))
    parsed = fmt.parse(reply.body(), mb.SEARCH)
    assert [c.chunk_id for c in parsed.candidates] == [str(k) for k in reply.ids]
    out = parsed.render(keep, [limit])
    expected: list[list[int]] = []
    start = 0
    for size in reply.topks:
        expected.append([r for r in range(start, start + size) if r in keep][:limit])
        start += size
    assert parsed.released_positions(keep, [limit]) == [r for query in expected for r in query]
    hits = mb.search_hits(out)
    assert len(hits) == len(reply.topks)
    for query_hits, query_rows in zip(hits, expected, strict=True):
        assert [h["pk"] for h in query_hits] == [reply.ids[r] for r in query_rows]
        assert [h["distance"] for h in query_hits] == [reply.scores[r] for r in query_rows]
        assert [h["entity"] for h in query_hits] == [
            {"pk": reply.ids[r], **mb.released_entity(rows[r])} for r in query_rows
        ]
    message = mb.search_message(out)
    assert list(message.results.topks) == [len(q) for q in expected]
    decoded = grpc_messages.decode(
        "milvus.proto.milvus.SearchResults", grpc_frames.messages(out)[0]
    )
    assert not grpc_messages.has_unknown_fields(decoded)
    names = [c.field_name for c in message.results.fields_data]
    assert "hidden" not in names
    assert all(
        b"secret" not in c.SerializeToString() or c.field_name != "$meta"
        for c in message.results.fields_data
    )
    for data_column in message.results.fields_data:
        if data_column.is_dynamic:
            assert all("secret" not in json.loads(d) for d in data_column.scalars.json_data.data)


@PROPERTIES
@given(rows=st.lists(mb.ROW, max_size=6), data=st.data())
def test_property_query_release(rows: list[dict[str, Any]], data: Any) -> None:
    keys = list(range(100, 100 + len(rows)))
    body = mb.query_body(mb.row_columns(rows, "pk", keys))
    keep = data.draw(st.sets(st.integers(0, max(len(rows) - 1, 0))) if rows else st.just(set()))
    limit = data.draw(st.none() | st.integers(0, 6))
    parsed = MilvusGrpcFormat(AdapterOptions(releasable_fields=mb.RELEASABLE)).parse(body, mb.QUERY)
    assert [c.chunk_id for c in parsed.candidates] == [str(k) for k in keys]
    out = parsed.render(keep, [limit])
    expected = sorted(keep)[:limit]
    assert parsed.released_positions(keep, [limit]) == expected
    assert mb.query_rows(out) == [
        {"pk": keys[r], **mb.released_entity(rows[r], query=True)} for r in expected
    ]
