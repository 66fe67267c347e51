"""Fuzz targets for the request rewriters (``sidecar/formats/*/*_request.py``): tenant push-down.

An input is three selector bytes and a request body: the rewriter and route
(byte 0), the caller's tenant (byte 1, from ``TENANTS``: quotes, brackets,
control characters, a lone surrogate ...) and the over-fetch factor (byte 2).

The oracle: ``rewrite_request`` raises MalformedRequest (UnfilterableRequest
included), or it says it applied the tenant filter and the body it forwards,
read again here (JSON, NDJSON, GraphQL or the framed protobuf request), holds
the tenant condition where the database applies it to every search of the
request: each sub-request of a batch, every prefetch, the expression a
Milvus filter becomes (the tenant literal reads back as the tenant, the app's
filter stays inside the gate's parentheses). These checks are written from
the databases' request formats, not from the rewriters' code. Variants with
no tenant key (the request policy reading the collections a body names)
only have to return or refuse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

import graphql
import orjson
from fuzz_targets import ACCEPTED, CORPUS, REFUSED, OracleFailure, Target, header, pick
from google.protobuf import json_format
from google.protobuf.message import Message

from sidecar.core.hits import Route
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedRequest, ResponseFormat
from sidecar.formats.chroma.rest import ChromaFormat
from sidecar.formats.elasticsearch.rest import ElasticsearchFormat
from sidecar.formats.generic.rest import GenericFormat
from sidecar.formats.grpc_frames import frame
from sidecar.formats.milvus.grpc import MilvusGrpcFormat
from sidecar.formats.milvus.rest import MilvusFormat
from sidecar.formats.pinecone.grpc import PineconeGrpcFormat
from sidecar.formats.pinecone.rest import PineconeFormat
from sidecar.formats.qdrant.grpc import QdrantGrpcFormat
from sidecar.formats.qdrant.rest import QdrantFormat
from sidecar.formats.weaviate.grpc import WeaviateGrpcFormat
from sidecar.formats.weaviate.rest import WeaviateFormat
from tests.fixtures.generic_bodies import BATCHES, INHOUSE

HEADER: Final = 3
KEY: Final = "tenant"
TENANTS: Final = (
    "acme",
    'a"c\\me',
    "t) or (true",
    "x' or '1'='1",
    "éü-漢字",
    "",
    "a\nb",
    "a\u2028b",
    "\ud800",
    "$and",
    "{tenant}",
    "acme" * 40,
)
FACTORS: Final = (1.0, 1.5, 3.0)
CAP: Final = 100

Checker = Callable[[bytes, Route, str], None]


@dataclass(frozen=True)
class Variant:
    """A rewriter on one of its routes; ``check`` None: collections only, no push-down."""

    rewriter: ResponseFormat
    route: Route
    check: Checker | None


def check_rewrite(variant: Variant, selectors: Sequence[int], body: bytes) -> str:
    """Rewrite ``body`` and read the result again; see the module docstring."""
    tenant = TENANTS[pick(TENANTS, selectors[0])]
    factor = FACTORS[pick(FACTORS, selectors[1])]
    key = None if variant.check is None else KEY
    try:
        rewrite = variant.rewriter.rewrite_request(
            body,
            variant.route,
            tenant=tenant,
            tenant_key=key,
            overfetch_factor=factor,
            overfetch_cap=CAP,
        )
    except MalformedRequest:
        return REFUSED
    if variant.check is None:
        return ACCEPTED
    if not rewrite.tenant_filter:
        raise OracleFailure("a search went on without the tenant filter")
    if any(limit is not None and limit > CAP for limit in rewrite.limits):
        raise OracleFailure("an app's limit above the cap was recorded")
    variant.check(rewrite.body, variant.route, tenant)
    return ACCEPTED


def _run(variants: Sequence[Variant], data: bytes) -> str:
    (which, *selectors), body = header(data, HEADER)
    return check_rewrite(variants[pick(variants, which)], selectors, body)


def _fail(what: str) -> OracleFailure:
    return OracleFailure(f"tenant condition missing: {what}")


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(what)
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise _fail(what)
    return value


def _and_first(value: Any, operator: str, condition: Any, what: str) -> None:
    """``value`` is ``{operator: [condition, (one more)]}``."""
    operands = _object(value, what).get(operator)
    if set(value) != {operator} or not isinstance(operands, list):
        raise _fail(what)
    if not 1 <= len(operands) <= 2 or operands[0] != condition:
        raise _fail(what)


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise OracleFailure("the rewritten body is not JSON") from None


# -- JSON APIs -------------------------------------------------------------------------


def _qdrant(body: bytes, route: Route, tenant: str) -> None:
    document = _object(_json(body), "body")
    endpoint = route.path.split("/points/")[1]
    requests = document.get("searches") if endpoint.endswith("/batch") else [document]
    condition = {"key": KEY, "match": {"value": tenant}}
    for request in _list(requests, "searches"):
        holders = [_object(request, "search")]
        if endpoint.startswith("query"):
            holders += _qdrant_prefetches(request)
        for holder in holders:
            _and_first(holder.get("filter"), "must", condition, "filter")


def _qdrant_prefetches(request: dict[str, Any]) -> list[dict[str, Any]]:
    found, pending = [], [request]
    while pending:
        nested = pending.pop().get("prefetch")
        for prefetch in nested if isinstance(nested, list) else [] if nested is None else [nested]:
            found.append(_object(prefetch, "prefetch"))
            pending.append(prefetch)
    return found


def _dollar_and(value: Any, tenant: str, what: str) -> None:
    """A Chroma or Pinecone filter: the condition, or ``$and`` of it and the app's."""
    condition = {KEY: {"$eq": tenant}}
    if value != condition:
        _and_first(value, "$and", condition, what)


def _chroma(body: bytes, route: Route, tenant: str) -> None:
    document = _object(_json(body), "body")
    if route.path.endswith("/search"):
        for search in _list(document.get("searches"), "searches"):
            _dollar_and(_object(search, "search").get("filter"), tenant, "filter")
    else:
        _dollar_and(document.get("where"), tenant, "where")


def _pinecone(body: bytes, route: Route, tenant: str) -> None:
    document = _object(_json(body), "body")
    if route.path.endswith("/search"):
        query = _object(document.get("query"), "query")
        _dollar_and(query.get("filter"), tenant, "query.filter")
        if query.get("id") is not None:
            raise _fail("query by record id")
        return
    _dollar_and(document.get("filter"), tenant, "filter")
    if document.get("id") is not None:
        raise _fail("query by record id")
    for entry in document.get("queries") or []:
        _dollar_and(_object(entry, "queries").get("filter"), tenant, "queries[].filter")


def _milvus(body: bytes, route: Route, tenant: str) -> None:
    document = _object(_json(body), "body")
    action = route.path.rstrip("/").rsplit("/", 1)[1].lower()
    searches = document.get("search") if action in ("hybrid_search", "advanced_search") else None
    requests = [document] if searches is None else _list(searches, "search")
    for request in requests:
        request = _object(request, "search")
        # Milvus (Go) matches keys in any case: no other spelling may stand beside the gate's.
        if any(k.casefold() == "filter" and k != "filter" for k in request):
            raise _fail("a key another spelling of 'filter'")
        if request.get("ids") not in (None, []):
            raise _fail("search by primary key")
        _milvus_expression(request.get("filter"), tenant)


def _milvus_expression(expression: Any, tenant: str) -> None:
    """``tenant == "<tenant>"``, alone or followed by `` and (<one expression>)``."""
    prefix = f"{KEY} == "
    if not isinstance(expression, str) or not expression.startswith(prefix):
        raise _fail("filter expression")
    literal, end = _go_string(expression, len(prefix))
    if literal != tenant:
        raise _fail("the tenant literal reads as another tenant")
    rest = expression[end:]
    if rest and not (rest.startswith(" and (") and _one_group(rest[5:])):
        raise _fail("the app's filter is not enclosed as one expression")


def _go_string(text: str, start: int) -> tuple[str, int]:
    """The double-quoted literal at ``start`` as Go's strconv.Unquote reads it (only
    ``\\\\`` and ``\\"`` escapes expected), and where it ends."""
    if text[start : start + 1] != '"':
        raise _fail("no tenant literal")
    out: list[str] = []
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == '"':
            return "".join(out), i + 1
        if char == "\\":
            following = text[i + 1 : i + 2]
            if following not in ('"', "\\"):
                raise _fail("an escape the gate does not write")
            out.append(following)
            i += 2
            continue
        out.append(char)
        i += 1
    raise _fail("the tenant literal is not closed")


def _one_group(text: str) -> bool:
    """True when ``text`` is ``( ... )`` whose first parenthesis closes at its end,
    reading string literals as Milvus' lexer does."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        char = text[i]
        if quote:
            if char in "\r\n":
                return False
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        elif char == "\\":
            return False
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0 and i != len(text) - 1:
                return False
        i += 1
    return depth == 0 and not quote and text.startswith("(")


def _elasticsearch(body: bytes, route: Route, tenant: str) -> None:
    term = {"term": {KEY: tenant}}
    if "_msearch" in route.path or "_fleet_msearch" in route.path:
        lines = [line for line in body.split(b"\n")]
        if lines[-1] != b"":
            raise _fail("NDJSON does not end with a newline")
        searches = [_json(line) for line in lines[:-1]][1::2]
    else:
        searches = [_json(body)]
    for search in searches:
        search = _object(search, "search")
        if "_knn_search" in route.path:
            _es_filters(search.get("filter"), term, "filter")
            continue
        query = search.get("query")
        if query is None:
            if "knn" not in search and "retriever" not in search:
                raise _fail("a search without a query")
        elif set(_object(query, "query")) == {"hybrid"}:
            for sub in _list(_object(query["hybrid"], "hybrid").get("queries"), "hybrid"):
                _es_restricted(sub, term)
        else:
            _es_restricted(query, term)
        knn = search.get("knn")
        for item in knn if isinstance(knn, list) else [] if knn is None else [knn]:
            _es_filters(_object(item, "knn").get("filter"), term, "knn.filter")
        if "retriever" in search:
            _es_retriever(search["retriever"], term)


def _es_restricted(query: Any, term: Any) -> None:
    inner = _object(_object(query, "query").get("bool"), "query.bool")
    if set(query) != {"bool"} or not set(inner) <= {"filter", "must"}:
        raise _fail("query")
    filters = inner.get("filter")
    if not isinstance(filters, list) or not filters or filters[0] != term:
        raise _fail("query.bool.filter")


def _es_filters(value: Any, term: Any, what: str) -> None:
    if value != term and value != [term]:
        inner = _object(_object(value, what).get("bool"), what)
        filters = inner.get("filter")
        if set(value) != {"bool"} or set(inner) != {"filter"} or not isinstance(filters, list):
            raise _fail(what)
        if not filters or filters[0] != term:
            raise _fail(what)


def _es_retriever(retriever: Any, term: Any) -> None:
    (kind, spec), *more = _object(retriever, "retriever").items() or [(None, None)]
    spec = _object(spec, "retriever")
    if more:
        raise _fail("a retriever with two kinds")
    if kind in ("standard", "knn"):
        _es_filters(spec.get("filter"), term, f"{kind} retriever filter")
    elif kind in ("rrf", "linear"):
        for child in _list(spec.get("retrievers"), "retrievers"):
            child = _object(child, "retriever")
            _es_retriever(child.get("retriever", child), term)
    elif kind in ("text_similarity_reranker", "rescorer"):
        _es_retriever(spec.get("retriever"), term)
    else:
        raise _fail(f"a {kind} retriever")


_INTROSPECTION: Final = frozenset({"__schema", "__type", "__typename"})


def _weaviate(body: bytes, route: Route, tenant: str) -> None:
    document = _json(body)
    requests = document if route.path.rstrip("/").endswith("/batch") else [document]
    condition = {"path": [KEY], "operator": "Equal", "valueText": tenant}
    for request in _list(requests, "batch"):
        query = _object(request, "request").get("query")
        if not isinstance(query, str):
            raise _fail("query")
        for definition in graphql.parse(query).definitions:
            if not isinstance(definition, graphql.OperationDefinitionNode):
                continue
            if definition.operation is not graphql.OperationType.QUERY:
                raise _fail("an operation other than a query")
            for root in definition.selection_set.selections:
                if not isinstance(root, graphql.FieldNode):
                    raise _fail("a fragment at the root")
                if root.name.value in _INTROSPECTION:
                    continue
                if root.name.value != "Get":
                    raise _fail(f"root field {root.name.value}")
                # A Get without class fields reads nothing (Weaviate refuses it).
                for field in root.selection_set.selections if root.selection_set else ():
                    _weaviate_class(field, condition)


def _weaviate_class(field: graphql.SelectionNode, condition: dict[str, Any]) -> None:
    if not isinstance(field, graphql.FieldNode):
        raise _fail("a fragment in Get")
    if field.name.value == "__typename":
        return
    where = next((a.value for a in field.arguments or () if a.name.value == "where"), None)
    value = None if where is None else graphql.value_from_ast_untyped(where)
    if value != condition:
        if not isinstance(value, dict) or value.get("operator") != "And":
            raise _fail("where")
        operands = value.get("operands")
        if set(value) != {"operator", "operands"} or not isinstance(operands, list):
            raise _fail("where")
        if not 1 <= len(operands) <= 2 or operands[0] != condition:
            raise _fail("where.operands")


def _generic(filter_at: str) -> Checker:
    def check(body: bytes, route: Route, tenant: str) -> None:
        document = _object(_json(body), "body")
        if filter_at == "$.filter":
            holders = [document]
        else:
            holders = [_object(q, "queries") for q in _list(document.get("queries"), "queries")]
        for holder in holders:
            _and_first(holder.get("filter"), "$and", {KEY: {"$eq": tenant}}, "filter")

    return check


# -- gRPC APIs -------------------------------------------------------------------------


def _decode(body: bytes, full_name: str) -> Any:
    (only,) = grpc_frames.messages(body)
    return grpc_messages.decode(full_name, only)


def _messages(message: Message) -> Iterator[Message]:
    """``message`` and every message inside it, at any depth."""
    pending = [message]
    while pending:
        current = pending.pop()
        yield current
        for field, value in current.ListFields():
            if field.message_type is None or field.message_type.GetOptions().map_entry:
                continue
            pending.extend(value if field.is_repeated else [value])


_QDRANT_REQUESTS: Final = {
    "Search": ("qdrant.SearchPoints", None),
    "SearchBatch": ("qdrant.SearchBatchPoints", "search_points"),
    "SearchGroups": ("qdrant.SearchPointGroups", None),
    "Scroll": ("qdrant.ScrollPoints", None),
    "Recommend": ("qdrant.RecommendPoints", None),
    "RecommendBatch": ("qdrant.RecommendBatchPoints", "recommend_points"),
    "Discover": ("qdrant.DiscoverPoints", None),
    "Query": ("qdrant.QueryPoints", None),
    "QueryBatch": ("qdrant.QueryBatchPoints", "query_points"),
    "QueryGroups": ("qdrant.QueryPointGroups", None),
}


def _qdrant_grpc(body: bytes, route: Route, tenant: str) -> None:
    full_name, batch = _QDRANT_REQUESTS[route.path.rsplit("/", 1)[1]]
    request = _decode(body, full_name)
    holders = [request] if batch is None else list(getattr(request, batch))
    holders += [m for m in _messages(request) if m.DESCRIPTOR.full_name == "qdrant.PrefetchQuery"]
    for holder in holders:
        must = holder.filter.must
        first = must[0].field if must else None
        if first is None or first.key != KEY or first.match.keyword != tenant:
            raise _fail("filter.must[0]")
        if len(must) > 2 or (len(must) == 2 and not must[1].HasField("filter")):
            raise _fail("filter.must")


def _milvus_grpc(body: bytes, route: Route, tenant: str) -> None:
    method = route.path.rsplit("/", 1)[1]
    if method == "Query":
        _milvus_expression(_decode(body, "milvus.proto.milvus.QueryRequest").expr, tenant)
        return
    if method == "Search":
        searches = [_decode(body, "milvus.proto.milvus.SearchRequest")]
    else:
        searches = list(_decode(body, "milvus.proto.milvus.HybridSearchRequest").requests)
    for search in searches:
        if search.WhichOneof("search_input") == "ids" or search.search_by_primary_keys:
            raise _fail("search by primary key")
        for holder in [search, *search.sub_reqs]:
            if holder.dsl_type != 1:
                raise _fail("dsl_type")
            _milvus_expression(holder.dsl, tenant)


def _pinecone_grpc(body: bytes, route: Route, tenant: str) -> None:
    request = _decode(body, "QueryRequest")
    if request.id:
        raise _fail("query by record id")
    for holder in [request, *request.queries]:
        value = json_format.MessageToDict(holder.filter) if holder.HasField("filter") else None
        _dollar_and(value, tenant, "filter")


def _weaviate_grpc(body: bytes, route: Route, tenant: str) -> None:
    request = _decode(body, "weaviate.v1.SearchRequest")
    if request.tenant not in ("", tenant):
        raise _fail("another tenant")
    filters = request.filters
    first = filters.filters[0] if filters.operator == 7 and len(filters.filters) == 2 else filters
    if first.operator != 1 or first.value_text != tenant or first.target.property != KEY:
        raise _fail("filters")
    if first.filters or first.on or first.target.WhichOneof("target") != "property":
        raise _fail("filters")


# -- targets, routes and seed requests -----------------------------------------------


def _grpc_body(full_name: str, value: dict[str, Any]) -> bytes:
    """``value`` (protobuf JSON) as a framed request, encoded with the database's own
    client classes where the tests have them (the gate's copies are trimmed)."""
    message = _vendor_class(full_name)()
    json_format.ParseDict(value, message)
    return frame(message.SerializeToString())


def _vendor_class(full_name: str) -> Any:
    package, _, name = full_name.rpartition(".")
    if package == "qdrant":
        from qdrant_client import grpc as qdrant

        return getattr(qdrant, name)
    if package == "milvus.proto.milvus":
        from pymilvus.grpc_gen import milvus_pb2

        return getattr(milvus_pb2, name)
    if package == "weaviate.v1":
        from weaviate.proto.v1 import search_get_pb2

        return getattr(search_get_pb2, name)
    return grpc_messages.message_class(full_name)


_APP_FILTER: Final = {"must": [{"key": "lang", "match": {"value": "en"}}]}
_QDRANT_SEARCH: Final = {"vector": [0.1, 0.2], "limit": 5, "filter": _APP_FILTER}
_PREFETCH: Final = {"query": [0.1, 0.2], "limit": 20, "prefetch": {"query": [0.3], "limit": 50}}


def _qdrant_seeds() -> dict[str, list[Any]]:
    query = {"query": [0.1, 0.2], "limit": 5, "prefetch": [_PREFETCH], "filter": _APP_FILTER}
    recommend = {"positive": [[0.1, 0.2]], "negative": [[0.3, 0.1]], "limit": 5}
    return {
        "search": [_QDRANT_SEARCH, {"vector": [0.1], "top": 3}],
        "search/batch": [{"searches": [_QDRANT_SEARCH, {"vector": [0.2], "limit": 2}]}],
        "search/groups": [{**_QDRANT_SEARCH, "group_by": "doc", "group_size": 2}],
        "query": [query, {"query": {"recommend": {"positive": [[0.1]]}}, "offset": 0}],
        "query/batch": [{"searches": [query, {"query": [0.5]}]}],
        "query/groups": [{**query, "group_by": "doc", "with_lookup": "docs2"}],
        "recommend": [recommend],
        "recommend/batch": [{"searches": [recommend]}],
        "recommend/groups": [{**recommend, "group_by": "doc"}],
        "discover": [{"target": [0.1], "context": [{"positive": [0.2], "negative": [0.3]}]}],
        "discover/batch": [{"searches": [{"target": [0.1], "limit": 3}]}],
        "scroll": [{"limit": 10, "filter": _APP_FILTER, "offset": 3}],
    }


_WHERE: Final = {"$or": [{"lang": {"$eq": "en"}}, {"year": {"$gt": 2020}}]}


def _chroma_seeds() -> dict[str, list[Any]]:
    return {
        "query": [{"query_embeddings": [[0.1, 0.2]], "n_results": 3, "where": _WHERE}],
        "get": [{"ids": ["a"], "where": {"lang": "en"}, "limit": 5}, {"limit": 2, "offset": 0}],
        "search": [
            {"searches": [{"filter": _WHERE, "limit": {"limit": 5}, "rank": {"$knn": {}}}]},
            {"searches": [{"filter": {}, "group_by": {"keys": ["doc"]}}]},
        ],
    }


_PINECONE_FILTER: Final = {"genre": {"$in": ["a", "b"]}}


def _pinecone_seeds() -> dict[str, list[Any]]:
    return {
        "/query": [
            {"vector": [0.1, 0.2], "topK": 5, "filter": _PINECONE_FILTER, "namespace": "ns"},
            {"queries": [{"values": [0.1], "filter": {"a": 1}}, {"values": [0.2]}], "topK": 3},
        ],
        "/records/namespaces/ns/search": [
            {"query": {"inputs": {"text": "q"}, "top_k": 5, "filter": _PINECONE_FILTER}},
            {"query": {"vector": {"values": [0.1]}, "top_k": 3}, "rerank": {"model": "m"}},
        ],
    }


def _milvus_seeds() -> dict[str, list[Any]]:
    search = {"collectionName": "docs", "data": [[0.1]], "limit": 5, "filter": 'lang == "en"'}
    return {
        "search": [search, {**search, "filter": '(a in ["x)", "y"]) or b == \'(\''}],
        "query": [{"collectionName": "docs", "filter": "year > 2020", "limit": 10}],
        "hybrid_search": [{"collectionName": "docs", "search": [search, search], "limit": 3}],
        "advanced_search": [{"collectionName": "docs", "search": [search]}],
    }


def _elasticsearch_seeds() -> dict[str, list[bytes]]:
    knn = {"field": "v", "query_vector": [0.1], "k": 3, "filter": {"term": {"lang": "en"}}}
    search = {"query": {"match": {"text": "q"}}, "size": 5, "knn": knn}
    retriever = {
        "retriever": {
            "rrf": {
                "retrievers": [
                    {"standard": {"query": {"match_all": {}}}},
                    {"knn": {"field": "v", "query_vector": [0.1], "k": 2, "num_candidates": 5}},
                ]
            }
        }
    }
    hybrid = {"query": {"hybrid": {"queries": [{"match": {"t": "q"}}, {"term": {"a": "b"}}]}}}
    lines = [{"index": "docs"}, search, {}, {"query": {"match_all": {}}}]
    return {
        "/docs/_search": [orjson.dumps(b) for b in (search, retriever, hybrid, {})],
        "/_msearch": [b"".join(orjson.dumps(line) + b"\n" for line in lines)],
        "/docs/_knn_search": [orjson.dumps({"knn": {"field": "v"}, "filter": {"term": {"a": 1}}})],
    }


def _weaviate_seeds() -> dict[str, list[Any]]:
    query = (
        '{ Get { Docs(limit: 5, where: {path: ["lang"], operator: Equal, valueText: "en"}) '
        "{ text _additional { id } } Other(nearVector: {vector: [0.1]}) { text } } }"
    )
    return {
        "/v1/graphql": [
            {"query": query},
            {"query": "query Q($l: Int) { Get { Docs(limit: $l) { text } } }"},
        ],
        "/v1/graphql/batch": [[{"query": query}, {"query": "{ Get { Docs { text } } }"}]],
    }


def _generic_seeds() -> dict[str, list[Any]]:
    return {
        "/api/retrieve": [{"query": "q", "filter": {"lang": "en"}}, {"query": "q"}],
        "/api/retrieve/batch": [{"queries": [{"q": "a", "filter": {"x": 1}}, {"q": "b"}]}],
    }


_TEMPLATE: Final = {"$and": [{"{tenant_key}": {"$eq": "{tenant}"}}, "{filter}"]}


def _qdrant_grpc_seeds() -> dict[str, list[tuple[str, Any]]]:
    app = {"must": [{"field": {"key": "lang", "match": {"keyword": "en"}}}]}
    search = {"collectionName": "docs", "vector": [0.1, 0.2], "limit": "5", "filter": app}
    nearest = {"nearest": {"dense": {"data": [0.1, 0.2]}}}
    prefetch = {"query": nearest, "limit": "20", "prefetch": [{"query": nearest, "filter": app}]}
    query = {"collectionName": "docs", "query": nearest, "prefetch": [prefetch], "limit": "5"}
    recommend = {"collectionName": "docs", "positiveVectors": [{"data": [0.1]}], "limit": "3"}
    return {
        "Search": [("qdrant.SearchPoints", search)],
        "SearchBatch": [
            ("qdrant.SearchBatchPoints", {"collectionName": "docs", "searchPoints": [search]})
        ],
        "SearchGroups": [("qdrant.SearchPointGroups", {**search, "groupBy": "d", "groupSize": 2})],
        "Scroll": [("qdrant.ScrollPoints", {"collectionName": "docs", "filter": app})],
        "Recommend": [("qdrant.RecommendPoints", recommend)],
        "RecommendBatch": [
            (
                "qdrant.RecommendBatchPoints",
                {"collectionName": "docs", "recommendPoints": [recommend]},
            )
        ],
        "Discover": [
            (
                "qdrant.DiscoverPoints",
                {
                    "collectionName": "docs",
                    "target": {"single": {"vector": {"data": [0.1]}}},
                    "limit": "3",
                },
            )
        ],
        "Query": [("qdrant.QueryPoints", query)],
        "QueryBatch": [
            ("qdrant.QueryBatchPoints", {"collectionName": "docs", "queryPoints": [query]})
        ],
        "QueryGroups": [("qdrant.QueryPointGroups", {**query, "groupBy": "doc"})],
    }


def _milvus_grpc_seeds() -> dict[str, list[tuple[str, Any]]]:
    search = {
        "collectionName": "docs",
        "dsl": 'lang == "en"',
        "dslType": "BoolExprV1",
        "searchParams": [{"key": "topk", "value": "5"}],
        "nq": "1",
    }
    return {
        "Search": [("milvus.proto.milvus.SearchRequest", search)],
        "HybridSearch": [
            (
                "milvus.proto.milvus.HybridSearchRequest",
                {
                    "collectionName": "docs",
                    "requests": [search, search],
                    "rankParams": [{"key": "limit", "value": "3"}],
                },
            )
        ],
        "Query": [
            (
                "milvus.proto.milvus.QueryRequest",
                {
                    "collectionName": "docs",
                    "expr": "year > 1",
                    "queryParams": [{"key": "limit", "value": "4"}],
                },
            )
        ],
    }


def _pinecone_grpc_seeds() -> dict[str, list[tuple[str, Any]]]:
    return {
        "Query": [
            (
                "QueryRequest",
                {"namespace": "ns", "topK": 5, "vector": [0.1], "filter": {"genre": {"$eq": "a"}}},
            ),
            ("QueryRequest", {"topK": 2, "queries": [{"values": [0.1], "filter": {"a": 1}}]}),
        ],
        "Fetch": [("FetchRequest", {"ids": ["a"], "namespace": "ns"})],
    }


def _weaviate_grpc_seeds() -> dict[str, list[tuple[str, Any]]]:
    filters = {"operator": "OPERATOR_EQUAL", "valueText": "en", "target": {"property": "lang"}}
    return {
        "Search": [
            (
                "weaviate.v1.SearchRequest",
                {
                    "collection": "Docs",
                    "limit": 5,
                    "filters": filters,
                    "nearVector": {"vectorBytes": "AAAAPw=="},
                },
            ),
            (
                "weaviate.v1.SearchRequest",
                {"collection": "Docs", "limit": 3, "bm25Search": {"query": "q"}},
            ),
        ]
    }


@dataclass(frozen=True)
class _Rewriter:
    name: str
    rewriter: ResponseFormat
    prefix: str  # the route path before a seeds key
    check: Checker
    seeds: Callable[[], Mapping[str, Sequence[Any]]]
    kind: str = "json"
    collections_only: Sequence[str] = ()  # seed keys of routes read for collections only


_REWRITERS: Final = (
    _Rewriter("qdrant", QdrantFormat(), "/collections/docs/points/", _qdrant, _qdrant_seeds),
    _Rewriter(
        "chroma",
        ChromaFormat(),
        "/api/v2/tenants/t/databases/d/collections/c/",
        _chroma,
        _chroma_seeds,
    ),
    _Rewriter("pinecone", PineconeFormat(), "", _pinecone, _pinecone_seeds),
    _Rewriter("milvus", MilvusFormat(), "/v2/vectordb/entities/", _milvus, _milvus_seeds),
    _Rewriter(
        "elasticsearch", ElasticsearchFormat(), "", _elasticsearch, _elasticsearch_seeds, "raw"
    ),
    _Rewriter("weaviate", WeaviateFormat(), "", _weaviate, _weaviate_seeds),
    _Rewriter(
        "generic",
        GenericFormat(**INHOUSE, tenant_filter_at="$.filter", tenant_filter=_TEMPLATE),
        "",
        _generic("$.filter"),
        lambda: {k: v for k, v in _generic_seeds().items() if k == "/api/retrieve"},
    ),
    _Rewriter(
        "generic-batched",
        GenericFormat(
            **{**BATCHES, "name": "batched"},
            tenant_filter_at="$.queries[*].filter",
            tenant_filter=_TEMPLATE,
        ),
        "",
        _generic("$.queries[*].filter"),
        lambda: {k: v for k, v in _generic_seeds().items() if k == "/api/retrieve/batch"},
    ),
    _Rewriter(
        "qdrant_grpc",
        QdrantGrpcFormat(),
        "/qdrant.Points/",
        _qdrant_grpc,
        _qdrant_grpc_seeds,
        "grpc",
    ),
    _Rewriter(
        "milvus_grpc",
        MilvusGrpcFormat(),
        "/milvus.proto.milvus.MilvusService/",
        _milvus_grpc,
        _milvus_grpc_seeds,
        "grpc",
    ),
    _Rewriter(
        "pinecone_grpc",
        PineconeGrpcFormat(),
        "/VectorService/",
        _pinecone_grpc,
        _pinecone_grpc_seeds,
        "grpc",
        collections_only=("Fetch",),
    ),
    _Rewriter(
        "weaviate_grpc",
        WeaviateGrpcFormat(),
        "/weaviate.v1.Weaviate/",
        _weaviate_grpc,
        _weaviate_grpc_seeds,
        "grpc",
    ),
)


def _encode(rewriter: _Rewriter, seed: Any) -> bytes:
    if rewriter.kind == "grpc":
        full_name, value = seed
        return _grpc_body(full_name, value)
    return seed if isinstance(seed, bytes) else orjson.dumps(seed)


def _target(rewriter: _Rewriter) -> Target:
    keys = list(rewriter.seeds())
    routes = [Route("POST", rewriter.prefix + key) for key in keys]
    pushed = [
        Variant(
            rewriter.rewriter, route, None if key in rewriter.collections_only else rewriter.check
        )
        for key, route in zip(keys, routes, strict=True)
    ]
    # The same routes read for the collections they name only (no tenant key).
    variants = [*pushed, *(Variant(rewriter.rewriter, route, None) for route in routes)]

    def make_seeds() -> list[bytes]:
        out = []
        for index, key in enumerate(keys):
            for number, seed in enumerate(rewriter.seeds()[key]):
                body = _encode(rewriter, seed)
                out.append(bytes([index, number, 1]) + body)
                out.append(bytes([index, 1 + number, 2]) + body)
        return out

    kind = "grpc" if rewriter.kind == "grpc" else "json"
    if rewriter.name == "elasticsearch":
        kind = "ndjson"
    return Target(f"request-{rewriter.name}", partial(_run, variants), make_seeds, kind, HEADER)


def request_inputs() -> Iterator[tuple[str, ResponseFormat, Route, bytes]]:
    """Every seed and kept corpus input of the request targets, as the target's name,
    the rewriter, the route the input selects and the body."""
    for rewriter in _REWRITERS:
        name = f"request-{rewriter.name}"
        routes = [Route("POST", rewriter.prefix + key) for key in rewriter.seeds()]
        kept = sorted((CORPUS / name).iterdir()) if (CORPUS / name).is_dir() else []
        for data in [*_target(rewriter).seeds(), *(path.read_bytes() for path in kept)]:
            (which, *_), body = header(data, HEADER)
            # Each route is a variant twice (pushed down, collections only).
            yield name, rewriter.rewriter, routes[pick(routes * 2, which) % len(routes)], body


def targets() -> list[Target]:
    """The request rewriter targets, one per rewriter (generic: two configurations)."""
    return [_target(rewriter) for rewriter in _REWRITERS]
