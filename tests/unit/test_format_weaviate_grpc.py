"""The Weaviate gRPC adapter: methods, candidates, filtering, fail-closed release, properties.

Replies are built with weaviate-client's own generated message classes
(``weaviate.proto.v1``, Weaviate's protos as the 4.16.2 client ships them), so
the bytes are what a Weaviate server sends, and every filtered reply is read
back the way the unchanged client reads it (``client_view``: the client's own
``_BaseExecutor`` turning a ``SearchReply`` into ``QueryReturn``,
``GroupByReturn`` or ``GenerativeReturn``). The client through a real Envoy is
tests/envoy/test_envoy_weaviate_grpc.py; requests: tests/unit/test_weaviate_grpc_request.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st
from weaviate.collections.classes.internal import _QueryOptions
from weaviate.collections.queries.base_executor import _BaseExecutor
from weaviate.proto.v1 import (
    base_pb2,
    properties_pb2,
    search_get_pb2,
    weaviate_pb2,
)
from weaviate.util import _ServerVersion

from sidecar.core.hits import Candidate, Replacement, Route, RouteKind
from sidecar.core.integrity import canonical_fields
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedBody, Unreleasable
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat
from sidecar.formats.weaviate.grpc_reply import WITHHELD_GROUP_NAME
from tests.fixtures.format_strategies import PROPERTIES, adapter

SEARCH = Route("POST", "/weaviate.v1.Weaviate/Search")
COLLECTION = "Docs"

SearchReply = search_get_pb2.SearchReply
SearchResult = search_get_pb2.SearchResult
Value = properties_pb2.Value


# -- builders (weaviate-client's own message classes) -----------------------------------


def uid(number: int) -> uuid.UUID:
    """The UUID of object ``number``."""
    return uuid.UUID(int=number + 0x1234_0000_0000_0000_0000_0000_0000)


def value(item: Any) -> Any:
    """A property Value for a Python value, as a Weaviate server encodes it."""
    if item is None:
        return Value(null_value="NULL_VALUE")
    if isinstance(item, bool):
        return Value(bool_value=item)
    if isinstance(item, int):
        return Value(int_value=item)
    if isinstance(item, float):
        return Value(number_value=item)
    if isinstance(item, str):
        return Value(text_value=item)
    if isinstance(item, dict):
        return Value(object_value=props(**item))
    if isinstance(item, list):
        return Value(list_value=properties_pb2.ListValue(text_values={"values": item}))
    raise TypeError(type(item))


def props(**values: Any) -> Any:
    """A ``Properties`` message."""
    return properties_pb2.Properties(fields={key: value(item) for key, item in values.items()})


def metadata(
    number: int | None, *, as_bytes: bool = True, as_text: bool = False, **more: Any
) -> Any:
    """Object ``number``'s metadata with its id as the server sends it (bytes, text or both)."""
    out = search_get_pb2.MetadataResult(**more)
    if number is not None and as_bytes:
        out.id_as_bytes = uid(number).bytes
    if number is not None and as_text:
        out.id = str(uid(number))
    return out


def result(
    number: int,
    text: str | None = None,
    *,
    distance: float | None = None,
    references: dict[str, list[Any]] | None = None,
    generated: str | None = None,
    own_metadata: Any = None,
    **values: Any,
) -> Any:
    """A SearchResult for object ``number`` with its text (default ``text <number>``)."""
    fields = {"text": f"text {number}" if text is None else text, **values}
    properties = search_get_pb2.PropertiesResult(
        non_ref_props=props(**fields), target_collection=COLLECTION
    )
    for name, targets in (references or {}).items():
        properties.ref_props_requested = True
        properties.ref_props.add(prop_name=name, properties=targets)
    out = SearchResult(
        properties=properties,
        metadata=own_metadata if own_metadata is not None else metadata(number),
    )
    if distance is not None:
        out.metadata.distance = distance
        out.metadata.distance_present = True
    if generated is not None:
        out.generative.values.add(result=generated)
    return out


def referenced(number: int, text: str | None = None, **values: Any) -> Any:
    """A referenced object (a PropertiesResult with its own metadata)."""
    fields = {"text": f"text {number}" if text is None else text, **values}
    return search_get_pb2.PropertiesResult(
        non_ref_props=props(**fields),
        target_collection="Sources",
        metadata=metadata(number, as_text=True),
    )


def group(name: str, objects: Sequence[Any], **more: Any) -> Any:
    """A GroupByResult whose statistics are those of ``objects``."""
    distances = [obj.metadata.distance for obj in objects]
    return search_get_pb2.GroupByResult(
        name=name,
        objects=objects,
        number_of_objects=len(objects),
        min_distance=min(distances, default=0.0),
        max_distance=max(distances, default=0.0),
        **more,
    )


def framed(reply: Any) -> bytes:
    return grpc_frames.frame(reply.SerializeToString())


def reply_of(body: bytes) -> Any:
    """The one SearchReply of a rendered body (exactly one flag-0 frame)."""
    (message,) = grpc_frames.messages(body)
    return SearchReply.FromString(message)


def client_view(body: bytes, *, group_by: bool = False, generative: bool = False) -> Any:
    """The reply as weaviate-client turns it into results (a 1.32 server)."""
    connection = SimpleNamespace(_weaviate_version=_ServerVersion(1, 32, 0))
    executor: Any = _BaseExecutor(connection, COLLECTION, None, None, None, None, False)
    options = _QueryOptions(True, True, True, True, group_by)
    reply = reply_of(body)
    if generative:
        return executor._result_to_generative_return(reply, options)
    if group_by:
        return executor._result_to_groupby_return(reply, options)
    return executor._result_to_query_return(reply, options)


def ids(body: bytes) -> list[uuid.UUID]:
    """The object UUIDs the client reads, in order."""
    return [obj.uuid for obj in client_view(body).objects]


def parse(reply: Any, **options: Any) -> Any:
    return adapter(WeaviateGrpcFormat, **options).parse(framed(reply), SEARCH)


PLAIN = SearchReply(took=0.25, results=[result(n, distance=n / 10) for n in range(4)])


# -- routes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        ("Search", RouteKind.FILTERED),
        ("Aggregate", RouteKind.CONTENT),
        ("TenantsGet", RouteKind.CONTENT),
        ("BatchObjects", RouteKind.WRITE),
        ("BatchDelete", RouteKind.WRITE),
        ("BatchReferences", RouteKind.WRITE),
        ("BatchSend", RouteKind.WRITE),
        ("BatchStream", RouteKind.WRITE),
    ],
)
def test_every_method_of_the_service_is_classified(method: str, kind: RouteKind) -> None:
    route = Route("POST", f"/weaviate.v1.Weaviate/{method}")
    assert WeaviateGrpcFormat().route_kind(route) is kind


@pytest.mark.parametrize("method", ["Check", "Watch"])
def test_the_health_service_the_client_probes_is_a_read(method: str) -> None:
    route = Route("POST", f"/grpc.health.v1.Health/{method}")
    assert WeaviateGrpcFormat().route_kind(route) is RouteKind.READ


def test_the_service_methods_are_the_clients_and_the_gates() -> None:
    clients = {m.name for m in weaviate_pb2.DESCRIPTOR.services_by_name["Weaviate"].methods}
    pool = grpc_messages.message_class("weaviate.v1.SearchReply").DESCRIPTOR.file.pool
    gates = {m.name for m in pool.FindServiceByName("weaviate.v1.Weaviate").methods}
    assert clients == gates
    fmt = WeaviateGrpcFormat()
    for name in clients:
        assert fmt.route_kind(Route("POST", f"/weaviate.v1.Weaviate/{name}")) is not None


def test_the_gates_search_messages_have_the_clients_fields() -> None:
    """Every field the client's SearchReply (and what it holds) declares, the gate declares
    with the same number and type; only ``iterator_next_uuid`` of later servers is extra."""
    seen: set[str] = set()
    pending = [(search_get_pb2.SearchReply.DESCRIPTOR, "weaviate.v1.SearchReply")]
    while pending:
        theirs, name = pending.pop()
        mine = grpc_messages.message_class(name).DESCRIPTOR
        extra = {f.name for f in mine.fields} - {f.name for f in theirs.fields}
        assert extra <= {"iterator_next_uuid"}
        for field in theirs.fields:
            own = mine.fields_by_name[field.name]
            assert (own.number, own.type, own.is_repeated) == (
                field.number,
                field.type,
                field.is_repeated,
            )
            nested = field.message_type
            if nested is not None and nested.full_name not in seen:
                seen.add(nested.full_name)
                pending.append((nested, nested.full_name))
    assert "weaviate.v1.GenerativeMetadata" in seen


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/weaviate.v1.Weaviate/Search"),
        ("POST", "/weaviate.v1.Weaviate/Search/more"),
        ("POST", "/weaviate.v1.Weaviate/"),
        ("POST", "/grpc.health.v1.Health/List"),
        ("GET", "/grpc.health.v1.Health/Check"),
        ("POST", "/qdrant.Points/Search"),
        ("POST", "/v1/graphql"),
        ("GET", "/v1/meta"),
    ],
)
def test_paths_outside_the_service_are_not_its(method: str, path: str) -> None:
    assert WeaviateGrpcFormat().route_kind(Route(method, path)) is None


def test_a_method_it_does_not_know_may_return_content() -> None:
    route = Route("POST", "/weaviate.v1.Weaviate/Unknown")
    assert WeaviateGrpcFormat().route_kind(route) is RouteKind.CONTENT
    with pytest.raises(ValueError, match="not handled"):
        WeaviateGrpcFormat().parse(b"", route)


def test_name_and_collections() -> None:
    fmt = WeaviateGrpcFormat()
    assert fmt.name == "weaviate_grpc"
    assert fmt.route_collections(SEARCH) == []


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"text_field": ""}, "text_field"),
        ({"id_field": ""}, "id_field"),
        ({"id_field": "text"}, "id_field"),
        ({"generative": "keep"}, "generative"),
        ({"hashed_fields": "title"}, "hashed_fields"),
        ({"releasable_fields": ["a..b"]}, "releasable_fields"),
    ],
)
def test_invalid_options_name_the_option(kwargs: dict[str, Any], option: str) -> None:
    with pytest.raises(ValueError, match=option):
        adapter(WeaviateGrpcFormat, **kwargs)


@pytest.mark.parametrize("method", ["Aggregate", "TenantsGet", "BatchObjects"])
def test_parse_rejects_a_method_it_does_not_filter(method: str) -> None:
    with pytest.raises(ValueError):
        WeaviateGrpcFormat().parse(framed(PLAIN), Route("POST", f"/weaviate.v1.Weaviate/{method}"))


# -- candidates ------------------------------------------------------------------------


def test_candidates_are_the_results_in_order() -> None:
    parsed = parse(PLAIN)
    assert parsed.candidates == tuple(Candidate(n, str(uid(n)), f"text {n}") for n in range(4))


@pytest.mark.parametrize(
    ("meta", "chunk_id", "problem"),
    [
        (metadata(1), str(uid(1)), None),
        (metadata(1, as_bytes=False, as_text=True), str(uid(1)), None),
        (metadata(1, as_text=True), str(uid(1)), None),
        (
            search_get_pb2.MetadataResult(id=str(uid(1)).upper()),
            str(uid(1)),
            None,
        ),
        (
            search_get_pb2.MetadataResult(id=str(uid(1)), id_as_bytes=uid(2).bytes),
            None,
            "metadata.id and metadata.id_as_bytes differ",
        ),
        (search_get_pb2.MetadataResult(id_as_bytes=b"\x01" * 15), None, "not 16 bytes"),
        (search_get_pb2.MetadataResult(id="doc-1"), None, "metadata.id is not a UUID"),
        (search_get_pb2.MetadataResult(distance=0.5), None, "metadata.id missing"),
    ],
)
def test_candidate_id_is_the_canonical_uuid(
    meta: Any, chunk_id: str | None, problem: str | None
) -> None:
    (candidate,) = parse(SearchReply(results=[result(1, own_metadata=meta)])).candidates
    assert candidate.chunk_id == chunk_id
    assert (candidate.problem or None) == problem or (problem and problem in candidate.problem)


def test_a_result_without_metadata_or_properties_is_a_problem() -> None:
    bare = SearchResult(properties=search_get_pb2.PropertiesResult(target_collection=COLLECTION))
    (candidate,) = parse(SearchReply(results=[bare])).candidates
    assert candidate.chunk_id is None and candidate.text is None
    assert candidate.problem == "no metadata; property 'text' missing"


@pytest.mark.parametrize(
    ("text", "expected", "problem"),
    [
        (Value(text_value="x"), "x", None),
        (Value(string_value="x"), "x", None),
        (Value(text_value=""), "", None),
        (Value(int_value=3), None, "property 'text' is not a string"),
        (Value(null_value="NULL_VALUE"), None, "property 'text' is not a string"),
        (Value(), None, "property 'text' missing"),
    ],
)
def test_candidate_text(text: Any, expected: str | None, problem: str | None) -> None:
    obj = result(1)
    obj.properties.non_ref_props.fields["text"].CopyFrom(text)
    (candidate,) = parse(SearchReply(results=[obj])).candidates
    assert (candidate.text, candidate.problem) == (expected, problem)


@pytest.mark.parametrize(
    ("doc_id", "chunk_id", "problem"),
    [
        (Value(text_value="c-1"), "c-1", None),
        (Value(uuid_value=str(uid(5))), str(uid(5)), None),
        (Value(int_value=42), "42", None),
        (Value(text_value=""), None, "property 'doc_id' is empty"),
        (Value(number_value=1.5), None, "property 'doc_id' is not a string or integer"),
        (None, None, "property 'doc_id' missing"),
    ],
)
def test_candidate_from_id_field(doc_id: Any, chunk_id: str | None, problem: str | None) -> None:
    obj = result(1, own_metadata=search_get_pb2.MetadataResult())
    if doc_id is not None:
        obj.properties.non_ref_props.fields["doc_id"].CopyFrom(doc_id)
    (candidate,) = parse(SearchReply(results=[obj]), id_field="doc_id").candidates
    assert (candidate.chunk_id, candidate.problem) == (chunk_id, problem)


def test_the_text_property_is_an_option() -> None:
    obj = result(1, body="the body")
    (candidate,) = parse(SearchReply(results=[obj]), text_field="body").candidates
    assert candidate.text == "the body"
    out = reply_of(parse(SearchReply(results=[obj]), text_field="body").render({0}))
    assert list(out.results[0].properties.non_ref_props.fields) == ["body"]


def test_problems_never_contain_values() -> None:
    secret = "secret-value-7"
    obj = result(1, own_metadata=search_get_pb2.MetadataResult(id=secret))
    obj.properties.non_ref_props.fields["text"].CopyFrom(Value(int_value=7))
    (candidate,) = parse(SearchReply(results=[obj])).candidates
    assert candidate.problem is not None and "7" not in candidate.problem


def test_hashed_properties_reach_the_candidate_as_the_rest_api_writes_them() -> None:
    obj = result(
        1,
        title="T",
        pages=3.0,
        ratio=0.5,
        meta={"source": "s", "year": 2020},
        tags=["a", "b"],
    )
    obj.properties.non_ref_props.fields["counts"].list_value.int_values.values = (7).to_bytes(
        8, "little"
    ) + (8).to_bytes(8, "little")
    (candidate,) = parse(
        SearchReply(results=[obj]),
        hashed_fields=["title", "pages", "ratio", "meta.source", "tags", "counts", "absent"],
    ).candidates
    assert candidate.fields == canonical_fields(
        {
            "title": "T",
            "pages": 3,  # Go writes a whole float64 without its fraction
            "ratio": 0.5,
            "meta.source": "s",
            "tags": ["a", "b"],
            "counts": [7, 8],
        }
    )
    assert candidate.problem is None


def test_hashed_values_without_a_canonical_form_reject_the_hit() -> None:
    obj = result(1, ratio=float("nan"))
    (candidate,) = parse(SearchReply(results=[obj]), hashed_fields=["ratio"]).candidates
    assert candidate.text is None
    assert candidate.problem == "hashed fields have no canonical form"


def test_referenced_objects_are_candidates_after_their_holder() -> None:
    reply = SearchReply(
        results=[
            result(1, references={"source": [referenced(10), referenced(11)]}),
            result(2),
        ]
    )
    parsed = parse(reply)
    assert [c.chunk_id for c in parsed.candidates] == [
        str(uid(1)),
        str(uid(10)),
        str(uid(11)),
        str(uid(2)),
    ]


def test_group_objects_are_candidates_after_the_results() -> None:
    reply = SearchReply(
        group_by_results=[
            group("a", [result(1, distance=0.1), result(2, distance=0.2)]),
            group("b", [result(3, distance=0.3)]),
        ]
    )
    assert [c.chunk_id for c in parse(reply).candidates] == [str(uid(n)) for n in (1, 2, 3)]


# -- release ---------------------------------------------------------------------------


@given(keep=st.sets(st.integers(0, 3)))
@PROPERTIES
def test_render_keeps_exactly_the_kept_results(keep: set[int]) -> None:
    body = parse(PLAIN).render(keep)
    assert ids(body) == [uid(n) for n in sorted(keep)]


def test_nothing_removed_goes_out_byte_for_byte() -> None:
    body = framed(PLAIN)
    assert WeaviateGrpcFormat().parse(body, SEARCH).render(range(4)) is body


def test_undeclared_properties_and_explain_score_are_dropped() -> None:
    obj = result(
        1,
        title="T",
        secret="S",
        own_metadata=metadata(1, explain_score="why", explain_score_present=True),
    )
    obj.metadata.score = 0.7
    obj.metadata.score_present = True
    rendered = reply_of(parse(SearchReply(results=[obj]), releasable_fields=["title"]).render({0}))
    (out,) = rendered.results
    assert dict(out.properties.non_ref_props.fields) == {
        "text": Value(text_value="text 1"),
        "title": Value(text_value="T"),
    }
    assert not out.metadata.explain_score and not out.metadata.explain_score_present
    assert out.metadata.score_present and out.metadata.id_as_bytes == uid(1).bytes


def test_nested_declared_properties_go_out_nested() -> None:
    obj = result(1, meta={"source": "s", "owner": "o"})
    rendered = reply_of(
        parse(SearchReply(results=[obj]), releasable_fields=["meta.source"]).render({0})
    )
    fields = rendered.results[0].properties.non_ref_props.fields
    assert dict(fields["meta"].object_value.fields) == {"source": Value(text_value="s")}


def test_the_deprecated_property_encodings_are_dropped() -> None:
    obj = result(1)
    obj.properties.non_ref_properties.update({"secret": "s"})
    obj.properties.text_array_properties.add(prop_name="tags", values=["a"])
    (out,) = reply_of(parse(SearchReply(results=[obj])).render({0})).results
    assert not out.properties.HasField("non_ref_properties")
    assert not out.properties.text_array_properties


def test_the_objects_own_metadata_stays() -> None:
    obj = result(
        1,
        own_metadata=metadata(
            1,
            as_text=True,
            vector_bytes=b"\x00\x00\x80\x3f",
            creation_time_unix=5,
            creation_time_unix_present=True,
            certainty=0.9,
            certainty_present=True,
            rerank_score=0.3,
            rerank_score_present=True,
            is_consistent=True,
            is_consistent_present=True,
            vectors=[
                base_pb2.Vectors(
                    name="v",
                    vector_bytes=b"\x00\x00\x80\x3f",
                    type=base_pb2.Vectors.VECTOR_TYPE_SINGLE_FP32,
                )
            ],
        ),
    )
    original = reply_of(framed(SearchReply(results=[obj])))
    assert reply_of(parse(original).render({0})) == original


def test_unknown_fields_never_go_out() -> None:
    # Field 99 of SearchResult's metadata and of the reply: a newer server's additions.
    unknown = b"\xf8\x06\x01"  # field 111, varint 1
    obj = result(1)
    meta_bytes = obj.metadata.SerializeToString() + unknown
    obj.metadata.Clear()
    data = SearchReply(took=1.0).SerializeToString()
    result_bytes = obj.SerializeToString() + b"\x12" + bytes([len(meta_bytes)]) + meta_bytes
    data += b"\x12" + bytes([len(result_bytes)]) + result_bytes + unknown
    body = grpc_frames.frame(data)
    parsed = WeaviateGrpcFormat().parse(body, SEARCH)
    assert parsed.candidates[0].chunk_id == str(uid(1))
    rendered = parsed.render({0})
    assert rendered != body
    message = grpc_messages.decode("weaviate.v1.SearchReply", grpc_frames.messages(rendered)[0])
    assert not grpc_messages.has_unknown_fields(message)
    assert ids(rendered) == [uid(1)]


# An unknown length-delimited field (number 111): a newer server's addition the
# gate's copy of the messages lacks, with bytes that must never reach the client.
UNREAD = b"\xfa\x06" + bytes([len(b"UNREAD-BY-THE-GATE")]) + b"UNREAD-BY-THE-GATE"


def _with_unknown(where: str) -> bytes:
    """A framed two-result reply with ``UNREAD`` in the reply, a result or its metadata."""
    first, second = result(1), result(2)
    if where == "metadata":
        meta = first.metadata.SerializeToString() + UNREAD
        first.metadata.Clear()
        first_bytes = first.SerializeToString() + b"\x12" + bytes([len(meta)]) + meta
    else:
        first_bytes = first.SerializeToString() + (UNREAD if where == "result" else b"")
    data = SearchReply(took=1.0).SerializeToString()
    for one in (first_bytes, second.SerializeToString()):
        data += b"\x12" + bytes([len(one)]) + one
    return grpc_frames.frame(data + (UNREAD if where == "reply" else b""))


@pytest.mark.parametrize("where", ["reply", "result", "metadata"])
@pytest.mark.parametrize("keep", [{0, 1}, {0}, {1}, set()])
def test_unknown_fields_never_go_out_whether_or_not_anything_was_removed(
    where: str, keep: set[int]
) -> None:
    # Nothing removed is the case a "send what came" shortcut gets wrong.
    body = _with_unknown(where)
    assert b"UNREAD-BY-THE-GATE" in body
    parsed = WeaviateGrpcFormat().parse(body, SEARCH)
    assert [c.chunk_id for c in parsed.candidates] == [str(uid(1)), str(uid(2))]
    rendered = parsed.render(keep)
    assert b"UNREAD-BY-THE-GATE" not in rendered
    message = grpc_messages.decode("weaviate.v1.SearchReply", grpc_frames.messages(rendered)[0])
    assert not grpc_messages.has_unknown_fields(message)
    assert ids(rendered) == [uid(n + 1) for n in sorted(keep)]


def test_limit_trims_the_results() -> None:
    parsed = parse(PLAIN)
    assert ids(parsed.render({0, 2, 3}, [2])) == [uid(0), uid(2)]
    assert ids(parsed.render({0, 2, 3}, [None])) == [uid(0), uid(2), uid(3)]
    assert parsed.released_positions({0, 2, 3}, [2]) == [0, 2]


@pytest.mark.parametrize("limits", [[1, 1], [None, None]])
def test_a_search_takes_one_limit(limits: list[int | None]) -> None:
    with pytest.raises(MalformedBody):
        parse(PLAIN).render({0}, limits)


def test_render_is_repeatable_and_never_mutates() -> None:
    parsed = parse(PLAIN)
    first = parsed.render({1, 2})
    assert parsed.render({1, 2}) == first
    assert parsed.render(range(4)) == framed(PLAIN)
    assert parsed.released_positions({1, 2}) == [1, 2]


# -- references ------------------------------------------------------------------------


REFERENCING = SearchReply(
    results=[
        result(1, references={"source": [referenced(10), referenced(11)]}),
        result(2, references={"source": [referenced(12)]}),
    ]
)


def test_declared_references_keep_only_admitted_objects() -> None:
    parsed = parse(REFERENCING, releasable_fields=["source"])
    body = parsed.render({0, 2, 3, 4})
    objects = client_view(body).objects
    assert [obj.uuid for obj in objects] == [uid(1), uid(2)]
    assert [ref.uuid for ref in objects[0].references["source"].objects] == [uid(11)]
    assert [ref.uuid for ref in objects[1].references["source"].objects] == [uid(12)]
    assert parsed.released_positions({0, 2, 3, 4}) == [0, 2, 3, 4]


def test_undeclared_references_are_dropped() -> None:
    parsed = parse(REFERENCING)
    body = parsed.render(range(5))
    assert all(obj.references == {} for obj in client_view(body).objects)
    assert parsed.released_positions(range(5)) == [0, 3]


def test_references_of_a_removed_object_are_not_released() -> None:
    parsed = parse(REFERENCING, releasable_fields=["source"])
    assert parsed.released_positions({1, 2, 3, 4}) == [3, 4]


# -- groups ----------------------------------------------------------------------------


GROUPED = SearchReply(
    group_by_results=[
        group(
            "alpha",
            [result(1, distance=0.1, topic="alpha"), result(2, distance=0.2, topic="alpha")],
        ),
        group(
            "beta", [result(3, distance=0.3, topic="beta"), result(4, distance=0.4, topic="beta")]
        ),
    ]
)


def test_all_kept_groups_are_unchanged_but_their_undeclared_names() -> None:
    parsed = parse(GROUPED, releasable_fields=["topic"])
    assert parsed.render(range(4)) == framed(GROUPED)
    view = client_view(parse(GROUPED).render(range(4)), group_by=True)
    assert sorted(view.groups) == [WITHHELD_GROUP_NAME.format(0), WITHHELD_GROUP_NAME.format(1)]


def test_groups_are_recomputed_from_kept_objects() -> None:
    grouped = SearchReply()
    grouped.CopyFrom(GROUPED)
    grouped.group_by_results[0].rerank.score = 0.8
    body = parse(grouped, releasable_fields=["topic"]).render({1, 2, 3})
    view = client_view(body, group_by=True)
    alpha, beta = view.groups["alpha"], view.groups["beta"]
    assert [obj.uuid for obj in alpha.objects] == [uid(2)]
    assert alpha.number_of_objects == 1
    assert alpha.min_distance == alpha.max_distance == pytest.approx(0.2)
    assert reply_of(body).group_by_results[0].HasField("rerank") is False
    assert beta.number_of_objects == 2
    assert (beta.min_distance, beta.max_distance) == (pytest.approx(0.3), pytest.approx(0.4))


def test_emptied_groups_are_dropped() -> None:
    body = parse(GROUPED, releasable_fields=["topic"]).render({2})
    assert list(client_view(body, group_by=True).groups) == ["beta"]


def test_statistics_without_distances_become_zero() -> None:
    grouped = SearchReply(group_by_results=[group("g", [result(1), result(2)])])
    grouped.group_by_results[0].min_distance = 0.5
    (out,) = reply_of(parse(grouped).render({0})).group_by_results
    assert (out.number_of_objects, out.min_distance, out.max_distance) == (1, 0.0, 0.0)


def test_a_group_name_equal_to_a_released_array_element_goes_out() -> None:
    grouped = SearchReply(group_by_results=[group("b", [result(1, tags=["a", "b"])])])
    assert (
        reply_of(parse(grouped, releasable_fields=["tags"]).render({0})).group_by_results[0].name
        == "b"
    )


# -- generated text --------------------------------------------------------------------


def generative_reply(grouped: str = "summary of all", count: int = 3) -> Any:
    reply = SearchReply(
        results=[result(n, generated=f"about {n}") for n in range(count)],
        generative_grouped_result=grouped,
    )
    reply.generative_grouped_results.values.add(result=grouped)
    return reply


def test_generated_text_stays_when_nothing_is_removed() -> None:
    body = parse(generative_reply()).render(range(3))
    view = client_view(body, generative=True)
    assert view.generated == "summary of all"
    assert [obj.generated for obj in view.objects] == ["about 0", "about 1", "about 2"]


@pytest.mark.parametrize(
    ("keep", "limits", "replacements"),
    [
        ({0, 2}, None, None),
        ({0, 1, 2}, [2], None),
        ({0, 1, 2}, None, {1: Replacement(str(uid(9)), "new")}),
    ],
)
def test_a_grouped_answer_over_removed_objects_is_stripped_or_blocks(
    keep: set[int], limits: list[int | None] | None, replacements: Any
) -> None:
    body = parse(generative_reply()).render(keep, limits, replacements)
    view = client_view(body, generative=True)
    assert view.generated is None and view.generative is None
    assert all(obj.generated is not None or obj.uuid == uid(9) for obj in view.objects)
    with pytest.raises(Unreleasable) as refused:
        parse(generative_reply(), generative="block").render(keep, limits, replacements)
    assert refused.value.code == "generated_from_rejected_chunks"


def test_a_replaced_objects_own_answer_is_stripped() -> None:
    reply = SearchReply(results=[result(1, generated="about 1")])
    reply.results[0].metadata.generative = "about 1"
    reply.results[0].metadata.generative_present = True
    (out,) = reply_of(parse(reply).render({0}, None, {0: Replacement(str(uid(9)), "new")})).results
    assert not out.HasField("generative")
    assert not out.metadata.generative_present and not out.metadata.generative
    assert out.properties.non_ref_props.fields["text"].text_value == "new"


def test_a_groups_answer_goes_with_the_group_it_was_generated_from() -> None:
    grouped = SearchReply()
    grouped.CopyFrom(GROUPED)
    for item in grouped.group_by_results:
        item.generative.result = f"about {item.name}"
        item.generative_result.values.add(result=f"about {item.name}")
    body = parse(grouped, releasable_fields=["topic"]).render({0, 1, 3})
    alpha, beta = reply_of(body).group_by_results
    assert alpha.generative.result == "about alpha"
    assert not beta.HasField("generative") and not beta.HasField("generative_result")
    with pytest.raises(Unreleasable):
        parse(grouped, generative="block").render({0, 1, 3})


# -- substitutes -----------------------------------------------------------------------


def test_a_substitute_takes_the_objects_id_and_text_and_loses_declared_properties() -> None:
    obj = result(1, own_metadata=metadata(1, as_text=True), title="old", distance=0.1)
    parsed = parse(SearchReply(results=[obj]), releasable_fields=["title"])
    body = parsed.render({0}, None, {0: Replacement(str(uid(7)).upper(), "new text")})
    (out,) = client_view(body).objects
    assert out.uuid == uid(7)
    assert out.properties == {"text": "new text"}
    assert out.metadata.distance == pytest.approx(0.1)
    assert reply_of(body).results[0].metadata.id == str(uid(7))


def test_a_substitute_in_id_field_mode_takes_the_id_property() -> None:
    obj = result(1, doc_id=Value(int_value=5).int_value)
    parsed = parse(SearchReply(results=[obj]), id_field="doc_id")
    (out,) = client_view(parsed.render({0}, None, {0: Replacement("6", "new")})).objects
    assert out.properties == {"text": "new", "doc_id": 6}
    assert out.uuid == uid(1)


def test_a_substitute_id_that_is_no_uuid_cannot_be_released() -> None:
    with pytest.raises(Unreleasable):
        parse(PLAIN).render({0}, None, {0: Replacement("doc-7", "new")})


# -- the iteration cursor --------------------------------------------------------------


def _with_cursor(reply: Any, cursor: bytes) -> bytes:
    """``reply`` framed with ``iterator_next_uuid`` (the client's SearchReply is older
    than the field: a later server's reply)."""
    message = grpc_messages.decode("weaviate.v1.SearchReply", reply.SerializeToString())
    message.iterator_next_uuid = cursor
    return grpc_frames.frame(message.SerializeToString())


def _cursor(body: bytes) -> bytes:
    message = grpc_messages.decode("weaviate.v1.SearchReply", grpc_frames.messages(body)[0])
    assert message.HasField("iterator_next_uuid")
    return bytes(message.iterator_next_uuid)


def test_the_cursor_is_the_last_released_object_whatever_the_scan_reached() -> None:
    # The scan stopped at object 99, which the filter skipped (another tenant's).
    parsed = WeaviateGrpcFormat().parse(_with_cursor(PLAIN, uid(99).bytes), SEARCH)
    assert _cursor(parsed.render(range(4))) == uid(3).bytes  # nothing rejected, still rebuilt
    assert _cursor(parsed.render({0, 1, 2})) == uid(2).bytes
    assert _cursor(parsed.render({1, 3})) == uid(3).bytes
    # Nothing released: the nil UUID, which ends the iteration.
    assert _cursor(parsed.render(set())) == bytes(16)


def test_a_reply_whose_cursor_is_its_last_result_goes_out_as_it_came() -> None:
    same = _with_cursor(PLAIN, uid(3).bytes)
    assert WeaviateGrpcFormat().parse(same, SEARCH).render(range(4)) == same
    # The nil UUID (the scan did not stop early) becomes the last result's UUID.
    parsed = WeaviateGrpcFormat().parse(_with_cursor(PLAIN, bytes(16)), SEARCH)
    assert _cursor(parsed.render(range(4))) == uid(3).bytes


def test_a_substitute_keeps_its_originals_place_in_the_iteration() -> None:
    parsed = WeaviateGrpcFormat().parse(_with_cursor(PLAIN, uid(99).bytes), SEARCH)
    body = parsed.render({0, 3}, None, {3: Replacement(str(uid(7)), "new")})
    assert reply_of(body).results[-1].metadata.id_as_bytes == uid(7).bytes
    assert _cursor(body) == uid(3).bytes


def test_a_reply_without_a_cursor_gets_none() -> None:
    body = WeaviateGrpcFormat().parse(framed(PLAIN), SEARCH).render({0})
    message = grpc_messages.decode("weaviate.v1.SearchReply", grpc_frames.messages(body)[0])
    assert not message.HasField("iterator_next_uuid")


# -- malformed replies -----------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00\x00",
        grpc_frames.frame(b"\xff\xff"),
        framed(PLAIN) + framed(PLAIN),
        b"\x01" + framed(PLAIN)[1:],
        framed(PLAIN)[:-1],
    ],
)
def test_undecodable_replies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedBody):
        WeaviateGrpcFormat().parse(body, SEARCH)


def test_an_empty_reply_has_no_hits() -> None:
    parsed = WeaviateGrpcFormat().parse(grpc_frames.frame(b""), SEARCH)
    assert parsed.candidates == ()
    assert reply_of(parsed.render(())) == SearchReply()


# -- properties ------------------------------------------------------------------------


@st.composite
def replies(draw: st.DrawFn) -> tuple[Any, list[uuid.UUID]]:
    """A reply with results or groups (and references), and its objects' UUIDs in
    candidate order."""
    numbers = iter(range(10_000))
    order: list[uuid.UUID] = []

    def one(topic: str) -> Any:
        number = next(numbers)
        order.append(uid(number))
        refs = []
        for _ in range(draw(st.integers(0, 2))):
            ref_number = next(numbers)
            order.append(uid(ref_number))
            refs.append(referenced(ref_number, draw(st.text(max_size=6))))
        return result(
            number,
            draw(st.text(max_size=6)),
            distance=draw(st.floats(0, 2, width=32)),
            references={"source": refs} if refs else None,
            own_metadata=metadata(number, as_text=draw(st.booleans())),
            topic=topic,
        )

    if draw(st.booleans()):
        reply = SearchReply(results=[one("t") for _ in range(draw(st.integers(0, 5)))])
    else:
        reply = SearchReply(
            group_by_results=[
                group(f"g{g}", [one(f"g{g}") for _ in range(draw(st.integers(1, 3)))])
                for g in range(draw(st.integers(0, 3)))
            ]
        )
    reply.took = draw(st.floats(0, 10, width=32))
    return reply, order


@given(
    data=replies(),
    keep=st.sets(st.integers(0, 40)) | st.just(set(range(41))),
    declared=st.booleans(),
)
@PROPERTIES
def test_property_the_client_reads_exactly_the_kept_objects(
    data: tuple[Any, list[uuid.UUID]], keep: set[int], declared: bool
) -> None:
    reply, order = data
    parsed = parse(reply, releasable_fields=["topic", "source"] if declared else ["topic"])
    assert [c.chunk_id for c in parsed.candidates] == [str(u) for u in order]
    body = parsed.render(keep)
    released = parsed.released_positions(keep)
    assert set(released) <= keep
    grouped = bool(reply.group_by_results)
    view = client_view(body, group_by=grouped)
    seen: list[uuid.UUID] = []
    for obj in view.objects:
        seen.append(obj.uuid)
        for ref in (obj.references or {}).get("source", _NO_REFS).objects:
            seen.append(ref.uuid)
    assert seen == [order[p] for p in released]
    # Every kept result (or group object) whose holder is released goes out.
    holders = {str(uid_) for uid_ in seen}
    for position, candidate in enumerate(parsed.candidates):
        if position in keep and candidate.chunk_id not in holders:
            assert _is_reference(reply, candidate.chunk_id)
    if grouped:
        for out in reply_of(body).group_by_results:
            assert out.number_of_objects == len(out.objects) > 0
    if keep >= set(range(len(order))) and (declared or not _has_references(reply)):
        # Nothing removed and nothing undeclared: the reply itself.
        assert body == framed(reply)


_NO_REFS = SimpleNamespace(objects=[])


def _references(reply: Any) -> list[Any]:
    objects = [*reply.results, *(o for g in reply.group_by_results for o in g.objects)]
    return [t for o in objects for r in o.properties.ref_props for t in r.properties]


def _has_references(reply: Any) -> bool:
    return bool(_references(reply))


def _is_reference(reply: Any, chunk_id: str | None) -> bool:
    return any(str(uuid.UUID(t.metadata.id)) == chunk_id for t in _references(reply))


@given(data=replies(), data2=st.data())
@PROPERTIES
def test_property_substitutes_carry_the_replacement(
    data: tuple[Any, list[uuid.UUID]], data2: st.DataObject
) -> None:
    reply, order = data
    parsed = parse(reply)
    if not order:
        return
    keep = set(range(len(order)))
    position = data2.draw(st.sampled_from(sorted(keep)))
    new_id, text = uid(50_000), data2.draw(st.text(max_size=8))
    body = parsed.render(keep, None, {position: Replacement(str(new_id), text)})
    if position not in parsed.released_positions(keep):
        return
    view = client_view(body, group_by=bool(reply.group_by_results))
    replaced = [obj for obj in view.objects if obj.uuid == new_id]
    assert len(replaced) == 1 and replaced[0].properties["text"] == text


@given(data=replies(), cut=st.data())
@PROPERTIES
def test_property_mutated_replies_are_refused_or_read(
    data: tuple[Any, list[uuid.UUID]], cut: st.DataObject
) -> None:
    reply, _ = data
    raw = bytearray(reply.SerializeToString())
    if raw:
        index = cut.draw(st.integers(0, len(raw) - 1))
        raw[index] = cut.draw(st.integers(0, 255))
    body = grpc_frames.frame(bytes(raw))
    try:
        parsed = WeaviateGrpcFormat().parse(body, SEARCH)
    except MalformedBody:
        return
    _assert_released_as_read(parsed, body)


def _assert_released_as_read(parsed: Any, body: bytes) -> None:
    """Everything kept goes out, and only what the gate read: whether or not the
    body changed, the released reply holds no field the gate's copy of the
    messages lacks (those were not read), and reads back to the same candidates."""
    everything = range(len(parsed.candidates))
    rendered = parsed.render(everything)
    message = grpc_messages.decode("weaviate.v1.SearchReply", grpc_frames.messages(rendered)[0])
    assert not grpc_messages.has_unknown_fields(message)
    # Read again, the released reply holds exactly the objects said to be released.
    again = WeaviateGrpcFormat().parse(rendered, SEARCH)
    released = [parsed.candidates[p].chunk_id for p in parsed.released_positions(everything)]
    assert [c.chunk_id for c in again.candidates] == released
    if rendered == body:
        # The bytes that came went out unchanged only because nothing was unread.
        assert not grpc_messages.has_unknown_fields(parsed.reply)


@given(count=st.integers(1, 5), keep=st.sets(st.integers(0, 4)), block=st.booleans())
@PROPERTIES
def test_property_a_grouped_answer_goes_out_only_over_every_object(
    count: int, keep: set[int], block: bool
) -> None:
    reply = generative_reply(count=count)
    parsed = parse(reply, generative="block" if block else "strip")
    whole = keep >= set(range(count))
    if block and not whole:
        with pytest.raises(Unreleasable):
            parsed.render(keep)
        return
    view = client_view(parsed.render(keep), generative=True)
    assert view.generated == ("summary of all" if whole else None)
    assert [obj.generated for obj in view.objects] == [
        f"about {n}" for n in sorted(keep) if n < count
    ]


@given(body=st.binary(max_size=60) | st.binary(max_size=60).map(grpc_frames.frame))
@PROPERTIES
def test_property_arbitrary_bytes_never_pass_unread(body: bytes) -> None:
    # Framed payloads too: raw bytes are nearly never a frame, and a framed
    # arbitrary payload is mostly unknown fields, the case this is about.
    try:
        parsed = WeaviateGrpcFormat().parse(body, SEARCH)
    except MalformedBody:
        return
    _assert_released_as_read(parsed, body)


def test_descriptor_set_is_a_private_pool() -> None:
    """The gate's Weaviate messages are not the client's: another pool, same names."""
    mine = grpc_messages.message_class("weaviate.v1.SearchReply")
    assert mine is not SearchReply
    assert mine.DESCRIPTOR.full_name == SearchReply.DESCRIPTOR.full_name
    proto = descriptor_pb2.FileDescriptorProto()
    mine.DESCRIPTOR.file.CopyToProto(proto)
    assert proto.name == "weaviate/v1/search_get.proto"
