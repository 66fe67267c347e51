"""Pinecone data-plane requests: tenant push-down, over-fetch, and the namespaces they name.

Push-down ANDs ``{tenant_key: {"$eq": tenant}}`` with the app's metadata
filter as ``{"$and": [condition, app_filter]}`` (the condition alone when the
app sent none, or ``{}``). Pinecone's filter language nests any filter
expression in ``$and``, so the app's filter keeps exactly its meaning and
can only narrow the result; the tenant is a JSON string value, never text
in an expression. The filter sits at ``filter`` in ``POST /query`` (and in
each entry of the deprecated multi-query ``queries``, which may carry its
own), and at ``query.filter`` in ``POST /records/namespaces/{ns}/search``.

A query by record ``id`` (``id`` of ``/query``, ``query.id`` of a records
search) is refused under push-down: its query vector is a stored record's,
which the filter does not cover, so it would tell whether another tenant's
record exists and where it lies.

Over-fetch raises ``topK`` (``query.top_k`` for a records search) so that
rejected hits can be replaced; the response is trimmed back to the app's
number. Not over-fetched: the deprecated multi-query (a limit per query in
``results``), and a records search that reranks (``rerank``: more
candidates would change what the reranker ranks first).

A ``/query`` body names namespaces, the nearest thing to a collection inside
an index: ``namespace``, and that of each ``queries`` entry (``""`` or
absent: the request's, or the default namespace ``__default__``). They go
to the request policy, and so does the path's namespace of a records search.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats.base import MalformedRequest, UnfilterableRequest
from sidecar.formats.rewriter import SearchRewriter

DEFAULT_NAMESPACE: Final = "__default__"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A filtered endpoint: ``/query``, or a records search (``records``)."""

    records: bool


QUERY: Final = Endpoint(records=False)
RECORDS: Final = Endpoint(records=True)


def endpoint(route: Route) -> Endpoint | None:
    """The filtered endpoint ``route`` calls, if any."""
    if route.method.upper() != "POST":
        return None
    # Lower case: a case variant of a route must not be claimed less strictly
    # than the route itself, whatever the host's router does with it.
    match route.path.removesuffix("/").lower().split("/"):
        case ["", "query"]:
            return QUERY
        case ["", "records", "namespaces", namespace, "search"] if namespace:
            return RECORDS
    return None


class PineconeRequests(SearchRewriter[Endpoint]):
    """Rewrites ``POST /query`` and records searches of a Pinecone index host."""

    def route_collections(self, route: Route) -> list[str] | None:
        """The namespace a records search's path names (``ResponseFormat.route_collections``), as
        written: the body does not repeat it. None for other routes."""
        if endpoint(route) is RECORDS:
            return [route.path.removesuffix("/").split("/")[3]]
        return None

    def _request_endpoint(self, route: Route) -> Endpoint | None:
        return endpoint(route)

    def _push_down(
        self, request: dict[str, Any], endpoint: Endpoint, tenant_key: str, tenant: str
    ) -> None:
        condition = {tenant_key: {"$eq": tenant}}
        if endpoint.records:
            query = _records_query(request)
            _refuse_id(query, "query.id")
            query["filter"] = _restricted(query.get("filter"), condition, "query.filter")
            return
        _refuse_id(request, "id")
        request["filter"] = _restricted(request.get("filter"), condition, "filter")
        for i, entry in enumerate(_queries(request)):
            entry["filter"] = _restricted(entry.get("filter"), condition, f"queries[{i}].filter")

    def _overfetches(self, endpoint: Endpoint) -> bool:
        return True

    def _names_collections(self, endpoint: Endpoint) -> bool:
        return not endpoint.records

    def _collections(self, request: dict[str, Any]) -> list[str]:
        """The namespaces a query reads, the default one by its name (a records
        search's are replaced by its path's in ``rewrite_request``)."""
        top = _namespace(request)
        # A multi-query entry without a namespace of its own reads the request's.
        named = [top, *(_namespace(entry) or top for entry in _queries(request))]
        return list(dict.fromkeys(namespace or DEFAULT_NAMESPACE for namespace in named))

    def _overfetch(
        self, request: dict[str, Any], endpoint: Endpoint, factor: Decimal, cap: int
    ) -> int | None:
        # A records search keeps its limit in ``query``.
        if endpoint.records:
            if request.get("rerank") is not None:
                return None
            return super()._overfetch(_records_query(request), endpoint, factor, cap)
        return super()._overfetch(request, endpoint, factor, cap)

    def _limit(self, request: dict[str, Any], endpoint: Endpoint) -> tuple[str, Any] | None:
        if endpoint.records:
            field = "top_k"
        elif request.get("queries") is not None:
            return None
        else:
            field = "topK"
        asked = request.get(field)
        # Pinecone requires the limit: a request without one is its to refuse.
        return None if asked is None else (field, asked)


def _restricted(app_filter: Any, condition: dict[str, Any], where: str) -> dict[str, Any]:
    if app_filter is None or app_filter == {}:
        return condition
    if not isinstance(app_filter, dict):
        raise MalformedRequest(f"{where!r} is not a JSON object")
    return {"$and": [condition, app_filter]}


def _refuse_id(request: dict[str, Any], where: str) -> None:
    if request.get("id") is not None:
        raise UnfilterableRequest(
            f"{where!r}: a query by record id searches with a stored vector "
            "the tenant filter does not cover",
        )


def _records_query(request: dict[str, Any]) -> dict[str, Any]:
    query = request.get("query")
    if not isinstance(query, dict):
        raise MalformedRequest("'query' is not a JSON object")
    return query


def _queries(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The entries of the deprecated multi-query ``queries``."""
    queries = request.get("queries")
    if queries is None:
        return []
    if not isinstance(queries, list) or not all(isinstance(entry, dict) for entry in queries):
        raise MalformedRequest("'queries' is not a list of JSON objects")
    return queries


def _namespace(request: dict[str, Any]) -> str | None:
    namespace = request.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise MalformedRequest("'namespace' is not a string")
    return namespace
