"""Elasticsearch and OpenSearch search bodies confined to one tenant.

The tenant condition is a term query (``term`` below). Only it and the
structure around it are added; the app's clauses are nested untouched:

- ``query`` becomes ``{"bool": {"filter": [term], "must": [query]}}``: the
  filter does not score, so the app's query ranks as before. A search with
  no query gets ``must: [match_all]`` (what no query means, same scores);
  one with a top-level ``knn`` or a ``retriever`` and no query gets none
  (a query would add every tenant document to the kNN hits).
- kNN searches take the term in their own ``filter`` (ANDed with the app's):
  the top-level ``knn`` (an object or a list), the ``knn`` query and the kNN
  retriever of Elasticsearch, OpenSearch's ``knn`` and ``neural`` queries,
  at any depth. Only there is a filter applied before the k nearest are
  chosen; outside, the number of hits left would count other tenants'
  vectors among the nearest.
- Retrievers: ``standard`` takes the term in its ``filter``, ``knn`` as
  above; ``rrf``, ``linear``, ``text_similarity_reranker`` and ``rescorer``
  are walked into. Any other retriever, and keys of those that the gate does
  not know (``query`` and ``fields``, which make sub-searches server-side),
  are refused.
- OpenSearch's ``hybrid`` query must stay the top-level query: each of its
  ``queries`` is wrapped instead.
- ``_knn_search`` (Elasticsearch 8) takes the term in its top-level ``filter``.

Refused with UnfilterableRequest (400 ``request_not_filterable``), naming the key:
any top-level key not known to be safe, among them ``rank`` and
``sub_searches``; ``runtime_mappings`` and OpenSearch's ``derived`` (a
runtime field can shadow the tenant field itself, and lookup fields read
other indices); ``script_fields``; an inline ``search_pipeline`` (its request
processors rewrite the query); ``suggest`` (suggesters read every tenant's
terms, and a phrase suggester's ``collate`` runs an unfiltered query; the
response drops suggestions by default anyway). Anywhere in the body,
constructs that read documents the filter does not cover are refused too:
terms lookup, ``more_like_this`` on stored documents, ``indexed_shape``,
``percolate`` by id, ``has_child``/``has_parent`` and ``wrapper`` (a query
the gate cannot read).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from sidecar.formats.base import MalformedRequest, UnfilterableRequest

# Top-level keys of a search body that carry no query, or whose queries the
# push-down reaches (query, knn, retriever, and the walk over the body).
_SEARCH_KEYS: Final = frozenset(
    {
        "_source", "aggregations", "aggs", "collapse", "docvalue_fields", "explain", "ext",
        "fields", "from", "highlight", "include_named_queries_score", "indices_boost", "knn",
        "min_score", "pit", "post_filter", "profile", "query", "rescore", "retriever",
        "search_after", "seq_no_primary_term", "size", "slice", "sort", "stats",
        "stored_fields", "terminate_after", "timeout", "track_scores", "track_total_hits",
        "verbose_pipeline", "version",
    }
)  # fmt: skip
_KNN_SEARCH_KEYS: Final = frozenset(
    {"knn", "filter", "_source", "docvalue_fields", "stored_fields", "fields"}
)

# Keys of composite retrievers (any other: refused), and where their
# sub-retrievers are.
_COMPOSITE_RETRIEVERS: Final[Mapping[str, frozenset[str]]] = {
    "rrf": frozenset({"retrievers", "rank_constant", "rank_window_size", "min_score", "filter"}),
    "linear": frozenset({"retrievers", "rank_window_size", "min_score", "filter", "normalizer"}),
    "text_similarity_reranker": frozenset(
        {"retriever", "field", "inference_id", "inference_text", "rank_window_size", "min_score"}
        | {"filter", "chunk_rescorer"}
    ),
    "rescorer": frozenset({"retriever", "rescore", "filter"}),
}


def named(key: str, placeholder: str = "a key") -> str:
    """A client's key for a message: quoted when it looks like a key, else ``placeholder``."""
    return repr(key) if re.fullmatch(r"[A-Za-z0-9_.@-]{1,64}", key) else placeholder


def _restricted(query: Any, term: dict[str, Any]) -> dict[str, Any]:
    """``query`` confined to the tenant, scoring as before."""
    if not isinstance(query, dict):
        raise MalformedRequest("'query' is not a JSON object")
    hybrid = query.get("hybrid")
    if len(query) == 1 and isinstance(hybrid, dict):
        # OpenSearch: a hybrid query must stay the top-level query.
        queries = hybrid.get("queries")
        if not isinstance(queries, list):
            raise MalformedRequest("'hybrid.queries' is not a list")
        return {"hybrid": {**hybrid, "queries": [_restricted(q, term) for q in queries]}}
    return {"bool": {"filter": [term], "must": [query]}}


def _and(term: dict[str, Any], existing: Any, field: str) -> dict[str, Any]:
    """A filter (one query) matching ``term`` and the app's ``existing`` filter, if any."""
    if existing is None:
        return term
    if isinstance(existing, dict):
        return {"bool": {"filter": [term, existing]}}
    if isinstance(existing, list):  # Elasticsearch takes a list of filter queries too
        return {"bool": {"filter": [term, *existing]}}
    raise MalformedRequest(f"{field!r} is not a query or a list of queries")


# -- the walk over a body ------------------------------------------------------


def _nodes(value: Any) -> Iterator[dict[str, Any]]:
    """Every object in ``value``, at any depth. A stack: the depth comes from the client."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            yield item
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def _vector_search(key: str, value: Any) -> dict[str, Any] | None:
    """The object holding the ``filter`` of a kNN-style search under ``key``; None otherwise.

    Elasticsearch's ``knn`` (top-level, query, retriever) is
    ``{"field": name, "query_vector"|"query_vector_builder": ...}``;
    OpenSearch's ``knn`` and ``neural`` queries are ``{field: {"vector": ...}}``
    and ``{field: {"query_text"|"query_image": ...}}``.
    """
    if not isinstance(value, dict):
        return None
    if key == "knn" and isinstance(value.get("field"), str):
        return value if {"query_vector", "query_vector_builder"} & value.keys() else None
    if len(value) != 1:
        return None
    (inner,) = value.values()
    if not isinstance(inner, dict):
        return None
    wanted = {"vector"} if key == "knn" else {"query_text", "query_image"}
    return inner if key in ("knn", "neural") and wanted & inner.keys() else None


def _vector_searches(request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The kNN-style searches of a search request, wherever they are."""
    top = request.get("knn")
    for knn in top if isinstance(top, list) else [] if top is None else [top]:
        # Only objects of the shapes below get the filter: nothing else may pass.
        if _vector_search("knn", knn) is None:
            raise MalformedRequest("a top-level 'knn' is not an object with a field and a vector")
        yield knn
    for node in _nodes(request):
        for key in ("knn", "neural"):
            found = None if node is request else _vector_search(key, node.get(key))
            if found is not None:
                yield found


def k_from_size(request: dict[str, Any]) -> bool:
    """True when a kNN search of ``request`` leaves ``k`` to default to the request's ``size``.

    Only Elasticsearch's kNN searches do (OpenSearch's take a ``k``).
    """
    return any("field" in knn and "k" not in knn for knn in _vector_searches(request))


def _push_into_vector_searches(request: dict[str, Any], term: dict[str, Any]) -> None:
    """Refuse documents read past the filter; put the term into every kNN search's filter."""
    for node in _nodes(request):
        _refuse_lookups(node)
    for search in list(_vector_searches(request)):
        search["filter"] = _and(term, search.get("filter"), "filter")


def _refuse_lookups(node: dict[str, Any]) -> None:
    """Refuse a query object that reads documents the tenant filter does not cover."""
    problem = None
    terms = node.get("terms")
    if isinstance(terms, dict) and any(
        isinstance(v, dict) and {"id", "path"} <= v.keys() for v in terms.values()
    ):
        problem = "a terms lookup"
    for key in ("more_like_this", "mlt"):
        similar = node.get(key)
        if isinstance(similar, dict) and any(
            isinstance(item, dict) and "_id" in item
            for side in ("like", "unlike")
            for item in _as_list(similar.get(side))
        ):
            problem = "more_like_this on stored documents"
    if isinstance(node.get("indexed_shape"), dict):
        problem = "an indexed shape"
    percolate = node.get("percolate")
    if isinstance(percolate, dict) and "id" in percolate:
        problem = "percolate on a stored document"
    for key in ("has_child", "has_parent"):
        if isinstance(node.get(key), dict) and "query" in node[key]:
            problem = f"a {key} query"
    wrapper = node.get("wrapper")
    if isinstance(wrapper, dict) and "query" in wrapper:
        problem = "a wrapper query"
    if problem is not None:
        raise UnfilterableRequest(f"{problem} is not filterable")


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _push_into_retriever(retriever: Any, term: dict[str, Any]) -> None:
    """Confine a retriever tree: standard retrievers get the term in their filter.

    kNN retrievers got it with the other kNN searches. A stack: the depth
    comes from the client.
    """
    pending = [retriever]
    while pending:
        item = pending.pop()
        if not isinstance(item, dict) or len(item) != 1:
            raise MalformedRequest("a retriever is not an object with one key")
        ((kind, spec),) = item.items()
        if not isinstance(spec, dict):
            raise MalformedRequest("a retriever is not an object with one key")
        if kind == "standard":
            spec["filter"] = _and(term, spec.get("filter"), "filter")
        elif kind == "knn":
            if _vector_search("knn", spec) is None:
                raise MalformedRequest("a knn retriever has no field and query vector")
        elif kind in _COMPOSITE_RETRIEVERS:
            unknown = sorted(set(spec) - _COMPOSITE_RETRIEVERS[kind] - {"_name"})
            if unknown:
                raise UnfilterableRequest(
                    f"{named(unknown[0])} of a {kind} retriever is not filterable"
                )
            pending.extend(_sub_retrievers(spec))
        else:
            raise UnfilterableRequest(f"a {named(kind)} retriever is not filterable")


def _sub_retrievers(spec: dict[str, Any]) -> list[Any]:
    if "retriever" in spec:
        return [spec["retriever"]]
    children = spec.get("retrievers")
    if not isinstance(children, list):
        raise MalformedRequest("'retrievers' is not a list")
    # rrf lists retrievers; linear lists {"retriever": ..., "weight": ...}.
    return [
        child["retriever"] if isinstance(child, dict) and "retriever" in child else child
        for child in children
    ]


def confine_search(request: dict[str, Any], term: dict[str, Any]) -> None:
    """Confine a search body (``_search``, a multi-search line) to ``term``, in place."""
    _known_keys(request, _SEARCH_KEYS)
    # Before the query is wrapped: the walk must not see the gate's own clauses.
    _push_into_vector_searches(request, term)
    if "retriever" in request:
        _push_into_retriever(request["retriever"], term)
    if "query" in request:
        request["query"] = _restricted(request["query"], term)
    elif "knn" not in request and "retriever" not in request:
        request["query"] = _restricted({"match_all": {}}, term)


def confine_knn_search(request: dict[str, Any], term: dict[str, Any]) -> None:
    """Confine a ``_knn_search`` body to ``term``, in place.

    Its kNN object takes no filter: the top-level one is applied before the
    k nearest are chosen.
    """
    _known_keys(request, _KNN_SEARCH_KEYS)
    for node in _nodes(request):
        _refuse_lookups(node)
    request["filter"] = _and(term, request.get("filter"), "filter")


def _known_keys(request: dict[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(request) - allowed)
    if unknown:
        raise UnfilterableRequest(f"{named(unknown[0])} is not filterable")
