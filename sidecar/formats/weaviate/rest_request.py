"""Weaviate GraphQL requests: tenant push-down, over-fetch and the classes a query reads.

``POST /v1/graphql`` takes ``{"query": ..., "variables": ..., "operationName":
...}``; ``POST /v1/graphql/batch`` a JSON list of those. Each query is
rewritten on its syntax tree by ``rest_graphql``; the rest of the request
is left as it was.

The body is not one JSON object with a limit field, so this is not a
``SearchRewriter``: one query holds any number of class fields, each with its
own limit, and push-down and over-fetch must work on the same parsed tree. The
over-fetch arithmetic is the same (the factor as configured, rounded up,
capped, never below the app's number).

``RequestRewrite.limits`` has one entry per class field of the query, ordered
by response key (alias or class name): Weaviate writes ``data.Get`` as a Go
map, whose keys come out sorted, not in query order. Batches are pushed down
but never over-fetched: a response without ``Get`` (a failed query) would
leave the limits of the others unplaceable.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestCapabilities,
    RequestRewrite,
    unchanged_request,
)
from sidecar.formats.rewriter import dump_request, load_request
from sidecar.formats.weaviate.rest_graphql import Options, query_collections, rewrite_query


def graphql_endpoint(route: Route) -> bool | None:
    """Whether a POST to Weaviate's GraphQL endpoint is the batch one; None for
    any other route."""
    if route.method.upper() != "POST":
        return None
    path = route.path.removesuffix("/")
    if path == "/v1/graphql":
        return False
    if path == "/v1/graphql/batch":
        return True
    return None


class WeaviateRequests(RequestCapabilities):
    """The request side of Weaviate's GraphQL endpoint and its batch."""

    def rewrites_request(self, route: Route) -> bool:
        """True for POST ``/v1/graphql`` and ``/v1/graphql/batch``."""
        return graphql_endpoint(route) is not None

    def rewrite_request(
        self,
        body: bytes,
        route: Route,
        *,
        tenant: str,
        tenant_key: str | None,
        overfetch_factor: float,
        overfetch_cap: int,
    ) -> RequestRewrite:
        """Restrict every ``Get`` class field to ``tenant`` and raise their limits.

        See ``ResponseFormat.rewrite_request``. The classes the queries read
        (class fields and the classes their cross-references name) are given as
        ``collections`` even when nothing else is applied. Raises
        UnfilterableRequest for a query the tenant condition cannot reach,
        MalformedRequest for a body that is not a GraphQL request, and
        ValueError if ``overfetch_factor`` is not finite.
        """
        batch = graphql_endpoint(route)
        if batch is None:
            return unchanged_request(body)
        if not math.isfinite(overfetch_factor):
            raise ValueError("overfetch_factor is not a finite number")
        factor = Decimal(repr(overfetch_factor)) if overfetch_factor > 1 and not batch else None
        options = Options(tenant, tenant_key, factor, overfetch_cap)

        document = _load(body)
        collections: dict[str, None] = {}
        limits: list[int | None] = []
        for request, query, variables in _queries(document, batch):
            rewritten = rewrite_query(query, variables, options)
            request["query"] = rewritten.query
            collections.update(dict.fromkeys(rewritten.collections))
            limits.extend(asked for _, asked in rewritten.limits)

        overfetched = any(asked is not None for asked in limits)
        changed = tenant_key is not None or overfetched
        return RequestRewrite(
            dump_request(document) if changed else body,
            tuple(limits) if overfetched else (),
            tenant_filter=tenant_key is not None,
            overfetched=overfetched,
            collections=tuple(collections),
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The classes the queries read, as ``rewrite_request`` gives them; nothing is
        rewritten. Raises MalformedRequest (UnfilterableRequest) as it does."""
        batch = graphql_endpoint(route)
        if batch is None:
            return ()
        collections: dict[str, None] = {}
        for _, query, variables in _queries(_load(body), batch):
            collections.update(dict.fromkeys(query_collections(query, variables)))
        return tuple(collections)


def _queries(document: Any, batch: bool) -> Iterator[tuple[dict[str, Any], str, dict[str, Any]]]:
    """Each request of ``document`` with its query and variables, checked as it comes
    (so a batch's first problem is the one refused)."""
    requests = document if batch else [document]
    if not isinstance(requests, list) or not all(isinstance(r, dict) for r in requests):
        raise MalformedRequest("a GraphQL batch is not a list of JSON objects")
    for request in requests:
        query, variables = request.get("query"), request.get("variables")
        if not isinstance(query, str):
            raise MalformedRequest("'query' is not a string")
        if not isinstance(variables, dict | None):
            raise MalformedRequest("'variables' is not a JSON object")
        yield request, query, variables or {}


def _load(body: bytes) -> Any:
    document = load_request(body)
    if not isinstance(document, dict | list):
        raise MalformedRequest("request body is not a JSON object or list")
    return document
