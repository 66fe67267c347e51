"""Weaviate gRPC Search requests: tenant push-down, over-fetch, refusals, collections.

Requests are built with weaviate-client's own generated classes
(``weaviate.proto.v1``), as the v4 client sends them, and the rewritten body
is read back with the same classes, as Weaviate would read it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from weaviate.proto.v1 import (
    base_pb2,
    base_search_pb2,
    generative_pb2,
    search_get_pb2,
)

from sidecar.core.hits import Route
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat
from tests.fixtures.format_strategies import PROPERTIES

SEARCH = Route("POST", "/weaviate.v1.Weaviate/Search")
SearchRequest = search_get_pb2.SearchRequest
Filters = base_pb2.Filters
TENANT = "acme"
# Another tenant's object, as an app would name it.
OTHER_OBJECT = "6b1f5e0a-9d43-4a38-8d2e-2c7f0e4b9a10"


def framed(request: Any) -> bytes:
    return grpc_frames.frame(request.SerializeToString())


def request_of(body: bytes) -> Any:
    (message,) = grpc_frames.messages(body)
    return SearchRequest.FromString(message)


def rewrite(
    request: Any,
    *,
    tenant: str = TENANT,
    tenant_key: str | None = "tenant_id",
    factor: float = 1.0,
    cap: int = 1000,
    route: Route = SEARCH,
) -> RequestRewrite:
    return WeaviateGrpcFormat().rewrite_request(
        framed(request),
        route,
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def condition(tenant: str = TENANT, key: str = "tenant_id") -> Any:
    return Filters(
        operator=Filters.OPERATOR_EQUAL,
        target=base_pb2.FilterTarget(property=key),
        value_text=tenant,
    )


def near_vector(**more: Any) -> Any:
    """A near_vector search as the v4 client sends it; ``more`` sets other fields."""
    fields: dict[str, Any] = {
        "collection": "Docs",
        "limit": 10,
        "near_vector": base_search_pb2.NearVector(
            vectors=[
                base_pb2.Vectors(
                    vector_bytes=b"\x00\x00\x80\x3f", type=base_pb2.Vectors.VECTOR_TYPE_SINGLE_FP32
                )
            ]
        ),
        "metadata": search_get_pb2.MetadataRequest(uuid=True, distance=True),
        "properties": search_get_pb2.PropertiesRequest(return_all_nonref_properties=True),
        "uses_123_api": True,
        "uses_125_api": True,
        "uses_127_api": True,
    }
    return SearchRequest(**{**fields, **more})


APP_FILTER = Filters(
    operator=Filters.OPERATOR_OR,
    filters=[
        Filters(
            operator=Filters.OPERATOR_LIKE,
            target=base_pb2.FilterTarget(property="title"),
            value_text="intro*",
        ),
        Filters(
            operator=Filters.OPERATOR_GREATER_THAN,
            target=base_pb2.FilterTarget(property="year"),
            value_int=2020,
        ),
    ],
)


# -- routes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "rewrites"),
    [
        ("POST", "/weaviate.v1.Weaviate/Search", True),
        ("POST", "/weaviate.v1.Weaviate/Aggregate", False),
        ("POST", "/weaviate.v1.Weaviate/BatchObjects", False),
        ("POST", "/weaviate.v1.Weaviate/TenantsGet", False),
        ("GET", "/weaviate.v1.Weaviate/Search", False),
        ("POST", "/v1/graphql", False),
    ],
)
def test_rewrites_search_only(method: str, path: str, rewrites: bool) -> None:
    assert WeaviateGrpcFormat().rewrites_request(Route(method, path)) is rewrites


def test_other_routes_come_back_unchanged() -> None:
    body = b"anything"
    out = WeaviateGrpcFormat().rewrite_request(
        body,
        Route("POST", "/weaviate.v1.Weaviate/Aggregate"),
        tenant=TENANT,
        tenant_key="tenant_id",
        overfetch_factor=2.0,
        overfetch_cap=100,
    )
    assert out == RequestRewrite(body, (), tenant_filter=False, overfetched=False)


# -- push-down -------------------------------------------------------------------------


def test_without_filters_the_condition_stands_alone() -> None:
    out = rewrite(near_vector())
    assert out.tenant_filter and not out.overfetched
    sent = request_of(out.body)
    assert sent.filters == condition()
    expected = near_vector()
    expected.filters.CopyFrom(condition())
    assert sent == expected


def test_the_apps_filter_is_the_second_operand_untouched() -> None:
    sent = request_of(rewrite(near_vector(filters=APP_FILTER)).body)
    assert sent.filters.operator == Filters.OPERATOR_AND
    assert list(sent.filters.filters) == [condition(), APP_FILTER]


def test_the_apps_filter_keeps_fields_the_gate_does_not_declare_byte_for_byte() -> None:
    # A deprecated `on` path: declared, so it survives as it is.
    legacy = Filters(operator=Filters.OPERATOR_EQUAL, on=["title"], value_text="x")
    sent = request_of(rewrite(near_vector(filters=legacy)).body)
    assert sent.filters.filters[1] == legacy


@given(
    tenant=st.text(max_size=30), key=st.from_regex(r"[_A-Za-z][_0-9A-Za-z]{0,20}", fullmatch=True)
)
@PROPERTIES
def test_property_any_tenant_is_one_string_value(tenant: str, key: str) -> None:
    sent = request_of(rewrite(near_vector(filters=APP_FILTER), tenant=tenant, tenant_key=key).body)
    assert list(sent.filters.filters) == [condition(tenant, key), APP_FILTER]


@pytest.mark.parametrize("key", ["", "a.b", "1x", "tenant id", 'x"'])
def test_a_tenant_key_that_is_no_property_name_is_a_setting_error(key: str) -> None:
    with pytest.raises(ValueError, match="tenant_key"):
        rewrite(near_vector(), tenant_key=key)


@pytest.mark.parametrize(
    "request_",
    [
        SearchRequest(collection="Docs", limit=5),  # fetch_objects
        SearchRequest(collection="Docs", bm25_search=base_search_pb2.BM25(query="q")),
        SearchRequest(
            collection="Docs",
            hybrid_search=base_search_pb2.Hybrid(
                query="q",
                alpha=0.5,
                near_text=base_search_pb2.NearTextSearch(
                    query=["x"],
                    move_to=base_search_pb2.NearTextSearch.Move(force=0.5, concepts=["c"]),
                ),
            ),
        ),
        SearchRequest(
            collection="Docs",
            near_text=base_search_pb2.NearTextSearch(
                query=["x"],
                move_away=base_search_pb2.NearTextSearch.Move(force=0.5, concepts=["c"]),
            ),
        ),
        SearchRequest(collection="Docs", tenant=TENANT),
        SearchRequest(
            collection="Docs",
            group_by=search_get_pb2.GroupBy(path=["topic"], number_of_groups=2),
        ),
        SearchRequest(
            collection="Docs",
            sort_by=[search_get_pb2.SortBy(path=["year"])],
            rerank=search_get_pb2.Rerank(property="text"),
        ),
    ],
)
def test_what_is_allowed(request_: Any) -> None:
    sent = request_of(rewrite(request_).body)
    assert sent.filters == condition()


def test_generative_provider_settings_pass_byte_for_byte() -> None:
    """The gate's copy does not declare the providers' settings; they are not refused
    and reach Weaviate as the client sent them."""
    generative = generative_pb2.GenerativeSearch(
        single=generative_pb2.GenerativeSearch.Single(
            prompt="Summarise {text}",
            queries=[
                generative_pb2.GenerativeProvider(
                    return_metadata=True,
                    openai=generative_pb2.GenerativeOpenAI(model="gpt-4o", temperature=0.2),
                )
            ],
        )
    )
    sent = request_of(rewrite(near_vector(generative=generative)).body)
    assert sent.generative == generative


@pytest.mark.parametrize(
    ("request_", "named"),
    [
        (
            SearchRequest(
                collection="Docs", near_object=base_search_pb2.NearObject(id=OTHER_OBJECT)
            ),
            "near_object",
        ),
        (
            SearchRequest(
                collection="Docs",
                near_text=base_search_pb2.NearTextSearch(
                    query=["x"],
                    move_to=base_search_pb2.NearTextSearch.Move(force=1, uuids=["u"]),
                ),
            ),
            "move_to",
        ),
        (
            SearchRequest(
                collection="Docs",
                hybrid_search=base_search_pb2.Hybrid(
                    query="q",
                    near_text=base_search_pb2.NearTextSearch(
                        query=["x"],
                        move_away=base_search_pb2.NearTextSearch.Move(force=1, uuids=["u"]),
                    ),
                ),
            ),
            "move_away",
        ),
        (
            SearchRequest(
                collection="Docs",
                properties=search_get_pb2.PropertiesRequest(
                    ref_properties=[
                        search_get_pb2.RefPropertiesRequest(reference_property="source")
                    ]
                ),
            ),
            "referenced objects",
        ),
        (SearchRequest(collection="Docs", tenant="globex"), "tenant"),
    ],
)
def test_what_the_condition_cannot_reach_is_refused(request_: Any, named: str) -> None:
    with pytest.raises(UnfilterableRequest, match=named) as refused:
        rewrite(request_)
    assert refused.value.code == "request_not_filterable"
    assert "globex" not in str(refused.value)


def _with_unknown(request: Any, path: tuple[str, ...] = ()) -> bytes:
    """``request`` serialised with an unknown varint field (number 999) in the message
    at ``path``."""
    unknown = b"\xb8\x3e\x01"  # field 999, varint 1
    if not path:
        return bytes(request.SerializeToString() + unknown)
    return _with_field(request, path, unknown)


def _with_field(request: Any, path: tuple[str, ...], extra: bytes) -> bytes:
    """``request`` serialised with ``extra`` appended to the message at ``path``."""
    holder = request
    for name in path[:-1]:
        holder = getattr(holder, name)
    inner = getattr(holder, path[-1])
    data = inner.SerializeToString() + extra
    holder.ClearField(path[-1])
    field = holder.DESCRIPTOR.fields_by_name[path[-1]]
    encoded = _varint((field.number << 3) | 2) + _varint(len(data)) + data
    if len(path) == 1:
        return bytes(request.SerializeToString() + encoded)
    return _with_field(request, path[:-1], encoded)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte = number & 0x7F
        number >>= 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


@pytest.mark.parametrize(
    "path", [(), ("near_vector",), ("filters",), ("properties",), ("metadata",)]
)
def test_a_field_the_gate_does_not_know_is_refused(path: tuple[str, ...]) -> None:
    request = near_vector(filters=APP_FILTER)
    body = grpc_frames.frame(_with_unknown(request, path))
    with pytest.raises(UnfilterableRequest, match="does not know"):
        WeaviateGrpcFormat().rewrite_request(
            body,
            SEARCH,
            tenant=TENANT,
            tenant_key="tenant_id",
            overfetch_factor=1.0,
            overfetch_cap=100,
        )


def test_without_push_down_unknown_fields_and_references_pass() -> None:
    request = near_vector(
        near_object=base_search_pb2.NearObject(id="x"),
        properties=search_get_pb2.PropertiesRequest(
            ref_properties=[
                search_get_pb2.RefPropertiesRequest(
                    reference_property="source", target_collection="Sources"
                )
            ]
        ),
    )
    body = grpc_frames.frame(_with_unknown(request))
    out = WeaviateGrpcFormat().rewrite_request(
        body, SEARCH, tenant=TENANT, tenant_key=None, overfetch_factor=1.0, overfetch_cap=100
    )
    assert out == RequestRewrite(body, (), False, False, ("Docs", "Sources"))


# -- collections -----------------------------------------------------------------------


def test_collections_are_the_searched_one_and_those_references_name() -> None:
    request = SearchRequest(
        collection="Docs",
        properties=search_get_pb2.PropertiesRequest(
            ref_properties=[
                search_get_pb2.RefPropertiesRequest(
                    reference_property="source",
                    target_collection="Sources",
                    properties=search_get_pb2.PropertiesRequest(
                        ref_properties=[
                            search_get_pb2.RefPropertiesRequest(
                                reference_property="author", target_collection="People"
                            )
                        ]
                    ),
                ),
                search_get_pb2.RefPropertiesRequest(reference_property="single"),
            ]
        ),
        filters=Filters(
            operator=Filters.OPERATOR_EQUAL,
            value_text="x",
            target=base_pb2.FilterTarget(
                multi_target=base_pb2.FilterReferenceMultiTarget(
                    on="cites",
                    target_collection="Papers",
                    target=base_pb2.FilterTarget(
                        single_target=base_pb2.FilterReferenceSingleTarget(
                            on="venue", target=base_pb2.FilterTarget(property="name")
                        )
                    ),
                )
            ),
        ),
    )
    out = rewrite(request, tenant_key=None)
    assert out.collections == ("Docs", "Sources", "People", "Papers")
    assert out.body == framed(request)


def test_a_search_naming_no_collection_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        rewrite(SearchRequest(limit=3), tenant_key=None)


@pytest.mark.parametrize(
    "body", [b"", b"\x00\x00\x00\x00", grpc_frames.frame(b"\xff\xff"), b"\x00\x00\x00\x00\x09ab"]
)
def test_undecodable_requests_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedRequest):
        WeaviateGrpcFormat().rewrite_request(
            body, SEARCH, tenant=TENANT, tenant_key="t", overfetch_factor=2.0, overfetch_cap=9
        )


def test_two_messages_are_malformed() -> None:
    body = framed(near_vector()) * 2
    with pytest.raises(MalformedRequest):
        WeaviateGrpcFormat().rewrite_request(
            body, SEARCH, tenant=TENANT, tenant_key=None, overfetch_factor=1.0, overfetch_cap=9
        )


# -- over-fetch ------------------------------------------------------------------------


def test_the_limit_is_raised_and_remembered() -> None:
    out = rewrite(near_vector(), tenant_key=None, factor=1.5)
    assert (out.limits, out.overfetched, out.tenant_filter) == ((10,), True, False)
    sent = request_of(out.body)
    assert sent.limit == 15 and not sent.HasField("filters")


def test_push_down_and_over_fetch_together() -> None:
    out = rewrite(near_vector(), factor=2.0, cap=12)
    sent = request_of(out.body)
    assert (sent.limit, out.limits) == (12, (10,))
    assert sent.filters == condition()


@pytest.mark.parametrize(
    "more",
    [
        {"limit": 0},
        {"offset": 5},
        {"autocut": 1},
        {"after": "00000000-0000-0000-0000-000000000001"},
        {"group_by": search_get_pb2.GroupBy(path=["topic"], number_of_groups=2)},
        {
            "generative": generative_pb2.GenerativeSearch(
                grouped=generative_pb2.GenerativeSearch.Grouped(task="sum up")
            )
        },
        {"generative": generative_pb2.GenerativeSearch(grouped_response_task="sum up")},
    ],
)
def test_limits_that_are_not_raised(more: dict[str, Any]) -> None:
    request = near_vector()
    for name, item in more.items():
        if isinstance(item, int | str):
            setattr(request, name, item)
        else:
            getattr(request, name).CopyFrom(item)
    out = rewrite(request, tenant_key=None, factor=3.0)
    assert out == RequestRewrite(framed(request), (), False, False, ("Docs",))


def test_a_present_empty_cursor_survives_the_rewrite() -> None:
    """``after: ""`` starts a cursor iteration (servers since 1.2x read its presence)."""
    gate_request = grpc_messages.message_class("weaviate.v1.SearchRequest")(
        collection="Docs", limit=10, after=""
    )
    body = grpc_frames.frame(gate_request.SerializeToString())
    out = WeaviateGrpcFormat().rewrite_request(
        body, SEARCH, tenant=TENANT, tenant_key="tenant_id", overfetch_factor=2.0, overfetch_cap=99
    )
    (sent,) = grpc_frames.messages(out.body)
    decoded = grpc_messages.decode("weaviate.v1.SearchRequest", sent)
    assert decoded.HasField("after") and decoded.limit == 10
    assert not out.overfetched


def test_single_generative_is_over_fetched() -> None:
    request = near_vector(
        generative=generative_pb2.GenerativeSearch(
            single=generative_pb2.GenerativeSearch.Single(prompt="p")
        )
    )
    assert rewrite(request, factor=2.0).limits == (10,)


@given(
    asked=st.integers(1, 2**32 - 1),
    factor=st.floats(0, 10, allow_nan=False),
    cap=st.integers(0, 2**40),
)
@PROPERTIES
def test_property_over_fetch_arithmetic(asked: int, factor: float, cap: int) -> None:
    request = SearchRequest(collection="Docs", limit=asked)
    out = rewrite(request, tenant_key=None, factor=factor, cap=cap)
    sent = request_of(out.body).limit
    if out.overfetched:
        assert out.limits == (asked,)
        assert asked < sent <= min(cap, 2**32 - 1)
    else:
        assert out.limits == () and sent == asked


def test_a_factor_that_is_not_finite_is_a_setting_error() -> None:
    with pytest.raises(ValueError):
        rewrite(near_vector(), factor=float("inf"))
