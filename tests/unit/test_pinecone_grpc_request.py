"""Pinecone gRPC requests: tenant push-down into the metadata filter, over-fetch, namespaces.

Requests are built with the message classes of the gate's own copy of
Pinecone's proto (``QueryRequest``, ``QueryVector``, ``FetchRequest``). The
gRPC rewriter confines a query through the REST one (``pinecone_request``), so
a property checks that both give the same answer for the same query; the REST
rewriter's own filter semantics are tested in tests/unit/test_pinecone_request.py.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.hits import Route
from sidecar.formats import grpc_adapter, grpc_frames, grpc_messages
from sidecar.formats.base import MalformedRequest, RequestRewrite, UnfilterableRequest
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from sidecar.formats.pinecone.grpc_request import python_struct
from sidecar.formats.pinecone.rest import PineconeFormat
from tests.fixtures.format_strategies import PROPERTIES

FMT = PineconeGrpcFormat()
QUERY = Route("POST", "/VectorService/Query")
FETCH = Route("POST", "/VectorService/Fetch")
CONDITION = {"tenant": {"$eq": "acme"}}

QueryRequest = grpc_messages.message_class("QueryRequest")
FetchRequest = grpc_messages.message_class("FetchRequest")


def query(*, filter: dict[str, Any] | None = None, **fields: Any) -> Any:
    """A ``QueryRequest``; ``filter`` None leaves the field unset."""
    request = QueryRequest(**fields)
    if filter is not None:
        request.filter.SetInParent()
        request.filter.update(filter)
    return request


def rewrite(
    request: Any,
    route: Route = QUERY,
    *,
    tenant: str = "acme",
    tenant_key: str | None = "tenant",
    factor: float = 1,
    cap: int = 100,
) -> RequestRewrite:
    body = request if isinstance(request, bytes) else grpc_adapter.encode_unary(request)
    return FMT.rewrite_request(
        body,
        route,
        tenant=tenant,
        tenant_key=tenant_key,
        overfetch_factor=factor,
        overfetch_cap=cap,
    )


def rewritten(request: Any, **kwargs: Any) -> Any:
    return grpc_adapter.decode_unary(rewrite(request, **kwargs).body, "QueryRequest")


def _without(request: Any, *fields: str) -> Any:
    out = QueryRequest()
    out.CopyFrom(request)
    for name in fields:
        out.ClearField(name)
    for entry in out.queries:
        entry.ClearField("filter")
    return out


# -- push-down ------------------------------------------------------------------------


def test_query_filter_is_anded_and_nothing_else_changes() -> None:
    app = {"genre": {"$in": ["drama", "comedy"]}, "year": {"$gte": 2020}}
    request = query(
        vector=[0.1, 0.2], top_k=3, filter=app, include_metadata=True, namespace="ns", scan_factor=2
    )
    request.sparse_vector.indices.extend([4])
    request.sparse_vector.values.extend([0.5])
    out = rewritten(request)
    assert python_struct(out.filter) == {"$and": [CONDITION, app]}
    assert _without(out, "filter") == _without(request, "filter")


@pytest.mark.parametrize("app", [None, {}])
def test_no_filter_is_the_condition_alone(app: dict[str, Any] | None) -> None:
    assert python_struct(rewritten(query(top_k=3, filter=app)).filter) == CONDITION


def test_every_legacy_query_is_filtered() -> None:
    request = query(top_k=2, filter={"a": 1})
    request.queries.add(values=[0.1], top_k=4).filter.update({"b": 2})
    request.queries.add(values=[0.2], namespace="other")
    out = rewritten(request)
    assert python_struct(out.filter) == {"$and": [CONDITION, {"a": 1}]}
    assert [python_struct(entry.filter) for entry in out.queries] == [
        {"$and": [CONDITION, {"b": 2}]},
        CONDITION,
    ]
    assert [entry.top_k for entry in out.queries] == [4, 0]
    assert _without(out, "filter") == _without(request, "filter")


def test_the_tenant_is_a_string_value_whatever_it_holds() -> None:
    tenant = '"}, {"$or": [{}]} \\ \n'
    out = rewritten(query(top_k=1), tenant=tenant, tenant_key="org")
    assert python_struct(out.filter) == {"org": {"$eq": tenant}}
    assert out.filter.fields["org"].struct_value.fields["$eq"].string_value == tenant


def test_a_query_by_vector_id_is_refused() -> None:
    request = query(id="rec-9", top_k=3)
    with pytest.raises(UnfilterableRequest) as raised:
        rewrite(request)
    assert raised.value.code == "request_not_filterable"
    assert "'id'" in str(raised.value) and "rec-9" not in str(raised.value)
    # Without push-down the gate has nothing to say about it.
    assert rewrite(request, tenant_key=None, factor=2).tenant_filter is False


def test_fields_the_gate_does_not_know_are_refused_under_push_down() -> None:
    # A newer client's way to query could bypass the filter as ``id`` does.
    body = grpc_frames.frame(query(top_k=3).SerializeToString() + b"\x9a\x01\x03abc")  # field 19
    with pytest.raises(UnfilterableRequest):
        rewrite(body)
    # Over-fetch alone keeps them: the database reads the request as the app wrote it.
    out = rewrite(body, tenant_key=None, factor=2)
    assert out.limits == (3,)
    assert grpc_adapter.decode_unary(out.body, "QueryRequest").top_k == 6
    assert out.body.endswith(b"\x9a\x01\x03abc")


# -- over-fetch -------------------------------------------------------------------------


def test_overfetch_raises_top_k_and_remembers_the_apps() -> None:
    out = rewrite(query(top_k=5, vector=[0.1]), tenant_key=None, factor=1.5)
    assert (out.limits, out.overfetched, out.tenant_filter) == ((5,), True, False)
    assert grpc_adapter.decode_unary(out.body, "QueryRequest").top_k == 8
    assert rewritten(query(top_k=80), factor=2).top_k == 100  # the cap
    pushed = rewrite(query(top_k=5), factor=2)
    assert (pushed.limits, pushed.tenant_filter) == ((5,), True)


@pytest.mark.parametrize(
    "request_",
    [query(top_k=0), query(top_k=100), query(top_k=3, queries=[{"values": [0.1]}])],
)
def test_not_overfetched(request_: Any) -> None:
    out = rewrite(request_, tenant_key=None, factor=2)
    assert (out.limits, out.overfetched) == ((), False)
    assert out.body == grpc_adapter.encode_unary(request_)


def test_nothing_to_apply_passes_the_body_as_it_came() -> None:
    body = grpc_adapter.encode_unary(query(top_k=5, namespace="ns", filter={"a": 1}))
    out = rewrite(body, tenant_key=None, factor=1)
    assert out == RequestRewrite(body, (), False, False, ("ns",))


def test_a_factor_that_is_not_finite_is_a_configuration_error() -> None:
    with pytest.raises(ValueError, match="finite"):
        rewrite(query(top_k=5), factor=float("inf"))


# -- namespaces -------------------------------------------------------------------------


def test_query_names_its_namespaces() -> None:
    request = query(top_k=1, namespace="")
    assert rewrite(request, tenant_key=None).collections == ("__default__",)
    request = query(top_k=1, namespace="a", queries=[{"namespace": "b"}, {"namespace": ""}])
    assert rewrite(request).collections == ("a", "b")


@pytest.mark.parametrize("tenant_key", ["tenant", None])
def test_fetch_names_its_namespace_and_goes_on_unchanged(tenant_key: str | None) -> None:
    body = grpc_adapter.encode_unary(FetchRequest(ids=["a", "b"], namespace="docs"))
    out = rewrite(body, FETCH, tenant_key=tenant_key, factor=2)
    assert out == RequestRewrite(body, (), False, False, ("docs",))
    empty = grpc_adapter.encode_unary(FetchRequest(ids=["a"]))
    assert rewrite(empty, FETCH).collections == ("__default__",)


@pytest.mark.parametrize("name", ["Upsert", "Delete", "Update", "List", "DescribeIndexStats"])
def test_other_methods_are_not_rewritten(name: str) -> None:
    route = Route("POST", f"/VectorService/{name}")
    assert not FMT.rewrites_request(route)
    assert rewrite(b"\x00\x00\x00\x00\x01x", route) == RequestRewrite(
        b"\x00\x00\x00\x00\x01x", (), False, False
    )
    assert FMT.rewrites_request(QUERY) and FMT.rewrites_request(FETCH)


# -- unreadable requests -----------------------------------------------------------------


def _struct_with_unset_value() -> Any:
    request = query(top_k=1, filter={"a": 1})
    request.filter.fields["b"].SetInParent()
    return request


@pytest.mark.parametrize(
    ("body", "route"),
    [
        (b"", QUERY),
        (b"\x00\x00\x00", QUERY),
        (grpc_frames.frame(b"\xff\xff"), QUERY),
        (grpc_frames.frame(b"") * 2, QUERY),
        (b"\x01\x00\x00\x00\x00", QUERY),
        (grpc_adapter.encode_unary(query(top_k=1, filter={"a": float("nan")})), QUERY),
        (grpc_adapter.encode_unary(query(top_k=1, filter={"a": [float("inf")]})), QUERY),
        (grpc_adapter.encode_unary(_struct_with_unset_value()), QUERY),
        (grpc_frames.frame(b"\xff"), FETCH),
    ],
)
def test_unreadable_requests(body: bytes, route: Route) -> None:
    with pytest.raises(MalformedRequest) as raised:
        rewrite(body, route)
    assert not isinstance(raised.value, UnfilterableRequest)


# -- properties ---------------------------------------------------------------------------

struct_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
struct_values = st.recursive(
    struct_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=10,
)
filters = st.none() | st.dictionaries(st.text(max_size=6), struct_values, max_size=3)
namespaces = st.text(max_size=5)


@st.composite
def query_requests(draw: st.DrawFn) -> Any:
    request = query(
        top_k=draw(st.integers(0, 2**32 - 1)),
        namespace=draw(namespaces),
        vector=draw(st.lists(st.floats(width=32, allow_nan=False), max_size=3)),
        include_metadata=draw(st.booleans()),
        filter=draw(filters),
    )
    for _ in range(draw(st.integers(0, 2))):
        entry = request.queries.add(namespace=draw(namespaces), top_k=draw(st.integers(0, 9)))
        app = draw(filters)
        if app is not None:
            entry.filter.update(app)
    return request


def _number_equal(value: Any) -> Any:
    """``value`` with ints as floats: a Struct holds every number as a double."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, dict):
        return {k: _number_equal(v) for k, v in value.items()}
    return [_number_equal(v) for v in value]


@PROPERTIES
@given(
    request=query_requests(),
    tenant=st.text(max_size=10),
    tenant_key=st.text(min_size=1, max_size=6),
)
def test_property_push_down_ands_the_condition_everywhere(
    request: Any, tenant: str, tenant_key: str
) -> None:
    out = rewritten(request, tenant=tenant, tenant_key=tenant_key)
    condition = {tenant_key: {"$eq": tenant}}
    pairs = [(request, out), *zip(request.queries, out.queries, strict=True)]
    for sent, forwarded in pairs:
        app = python_struct(sent.filter) if sent.HasField("filter") else {}
        expected = {"$and": [condition, app]} if app else condition
        assert _number_equal(python_struct(forwarded.filter)) == _number_equal(expected)
    assert _without(out, "filter") == _without(request, "filter")


def _rest_twin(request: Any) -> dict[str, Any]:
    """``request`` as the REST API's ``POST /query`` body."""
    body: dict[str, Any] = {"topK": request.top_k, "namespace": request.namespace}
    if request.HasField("filter"):
        body["filter"] = python_struct(request.filter)
    if request.queries:
        body["queries"] = [
            {"namespace": entry.namespace}
            | ({"filter": python_struct(entry.filter)} if entry.HasField("filter") else {})
            for entry in request.queries
        ]
    return body


@PROPERTIES
@given(
    request=query_requests(),
    tenant_key=st.none() | st.just("tenant"),
    factor=st.sampled_from([1, 1.1, 2, 3.5]),
)
def test_property_grpc_and_rest_confine_a_query_alike(
    request: Any, tenant_key: str | None, factor: float
) -> None:
    kwargs: dict[str, Any] = {
        "tenant": "acme",
        "tenant_key": tenant_key,
        "overfetch_factor": factor,
        "overfetch_cap": 1000,
    }
    grpc = FMT.rewrite_request(grpc_adapter.encode_unary(request), QUERY, **kwargs)
    rest = PineconeFormat().rewrite_request(
        orjson.dumps(_rest_twin(request)), Route("POST", "/query"), **kwargs
    )
    assert (grpc.limits, grpc.tenant_filter, grpc.overfetched, grpc.collections) == (
        rest.limits,
        rest.tenant_filter,
        rest.overfetched,
        rest.collections,
    )
    forwarded = grpc_adapter.decode_unary(grpc.body, "QueryRequest")
    rest_body = orjson.loads(rest.body)
    assert forwarded.top_k == rest_body["topK"]
    assert _rest_twin(forwarded).get("filter") == rest_body.get("filter")


@PROPERTIES
@given(body=st.binary(max_size=30), framed=st.booleans())
def test_property_arbitrary_bodies_are_rewritten_or_refused(body: bytes, framed: bool) -> None:
    sent = grpc_frames.frame(body) if framed else body
    for route in (QUERY, FETCH):
        try:
            out = rewrite(sent, route, factor=2)
        except MalformedRequest:
            continue
        # What goes on parses, and under push-down carries the condition.
        if route == QUERY:
            forwarded = grpc_adapter.decode_unary(out.body, "QueryRequest")
            assert python_struct(forwarded.filter) in (
                CONDITION,
                {"$and": [CONDITION, python_struct(QueryRequest.FromString(body).filter)]},
            )


def test_without_push_down_the_filter_is_neither_read_nor_changed() -> None:
    request = query(top_k=5, filter={"a": float("nan"), "b": 2**60})
    out = rewrite(request, tenant_key=None, factor=2)
    assert out.limits == (5,)
    forwarded = grpc_adapter.decode_unary(out.body, "QueryRequest")
    assert forwarded.filter == request.filter
