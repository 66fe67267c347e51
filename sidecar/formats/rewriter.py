"""The skeleton of every request rewriter: tenant push-down and over-fetch (a template method).

``SearchRewriter`` owns what is the same for every database: which routes
are rewritten (those with an endpoint), unchanged bodies for the others and
when there is nothing to apply, reading and writing the JSON body
(MalformedRequest when it cannot be read), and the over-fetch arithmetic:
the factor as configured (1.1, not 1.100000000000000088...), so that
rounding up does not add a hit, capped, and never below what the app asked
for. A database supplies, in a small subclass:

- ``_request_endpoint(route)``: the search endpoint a route calls, or None;
- ``_sub_requests(document, endpoint)``: the requests of a batch body;
- ``_push_down(request, endpoint, tenant_key, tenant)``: AND the tenant
  condition into one request's filter;
- ``_overfetches(endpoint)`` and ``_limit(request, endpoint)``: whether, and
  through which field, a request's limit may be raised;
- ``_collections(request, endpoint)`` where a request can name collections
  beyond its path (for the request policy's ownership check);
- ``_echoes(endpoint)`` and ``_echo(document, endpoint)`` where the answer
  repeats what the request asked (``RequestRewrite.echo``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from decimal import Decimal
from typing import Any, Generic, TypeVar

import orjson

from sidecar.core.hits import Route
from sidecar.formats.base import (
    MalformedRequest,
    RequestCapabilities,
    RequestRewrite,
    has_duplicate_keys,
    unchanged_request,
)

EndpointT = TypeVar("EndpointT")


class SearchRewriter(RequestCapabilities, ABC, Generic[EndpointT]):
    """A request rewriter: the rewrite is shared, a database's request shapes are its own."""

    def rewrites_request(self, route: Route) -> bool:
        """True when requests on ``route`` carry a query the gate may rewrite.

        Only then is the request body worth reading.
        """
        return self._request_endpoint(route) is not None

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
        """Restrict a search request to ``tenant`` and raise its limits.

        See ``ResponseFormat.rewrite_request``. Raises ValueError if
        ``overfetch_factor`` is not finite (a configuration error, not the
        client's).
        """
        endpoint = self._request_endpoint(route)
        if endpoint is None:
            return unchanged_request(body)
        if not math.isfinite(overfetch_factor):
            raise ValueError("overfetch_factor is not a finite number")
        overfetch = overfetch_factor > 1 and self._overfetches(endpoint)
        names = self._names_collections(endpoint)
        if tenant_key is None and not overfetch and not names:
            return unchanged_request(body, echo=self._echo_of(body, endpoint))
        factor = Decimal(repr(overfetch_factor)) if overfetch else None

        document = _load(body)
        # Read before the rewrite: what the app asked and named, not what the gate adds.
        echo = self._echo(document, endpoint)
        requests = self._sub_requests(document, endpoint)
        collections = self._named(requests) if names else ()
        if tenant_key is None and not overfetch:
            return unchanged_request(body, collections, echo)
        limits: list[int | None] = []
        for request in requests:
            if tenant_key is not None:
                self._push_down(request, endpoint, tenant_key, tenant)
            limits.append(
                None
                if factor is None
                else self._overfetch(request, endpoint, factor, overfetch_cap)
            )

        overfetched = any(limit is not None for limit in limits)
        return RequestRewrite(
            dump_request(document),
            tuple(limits) if overfetched else (),
            tenant_filter=tenant_key is not None,
            overfetched=overfetched,
            collections=collections,
            echo=echo,
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The collections the body names beyond the path, as ``rewrite_request`` reads
        them; the body is read only where the endpoint's requests can name one."""
        endpoint = self._request_endpoint(route)
        if endpoint is None or not self._names_collections(endpoint):
            return ()
        return self._named(self._sub_requests(_load(body), endpoint))

    def _named(self, requests: list[dict[str, Any]]) -> tuple[str, ...]:
        """The collections ``requests`` name, each once, in the order they name them."""
        return tuple(
            dict.fromkeys(name for request in requests for name in self._collections(request))
        )

    @abstractmethod
    def _request_endpoint(self, route: Route) -> EndpointT | None:
        """The search endpoint ``route`` calls; None for routes whose requests are not rewritten."""

    def _sub_requests(self, document: dict[str, Any], endpoint: EndpointT) -> list[dict[str, Any]]:
        """The requests in ``document``, in the order their results come back."""
        return [document]

    @abstractmethod
    def _push_down(
        self, request: dict[str, Any], endpoint: EndpointT, tenant_key: str, tenant: str
    ) -> None:
        """Restrict ``request`` (in place) to hits whose ``tenant_key`` is ``tenant``."""

    @abstractmethod
    def _overfetches(self, endpoint: EndpointT) -> bool:
        """True when the requests of ``endpoint`` may have their limit raised."""

    @abstractmethod
    def _limit(self, request: dict[str, Any], endpoint: EndpointT) -> tuple[str, Any] | None:
        """The field holding the number of results ``request`` asks for, and that number
        (the database's default where the field is absent); None to leave it alone."""

    def _names_collections(self, endpoint: EndpointT) -> bool:
        """True when requests of ``endpoint`` can name collections beyond the path."""
        return False

    def _echo_of(self, body: bytes, endpoint: EndpointT) -> object:
        """``_echo`` of a body nothing is applied to, which goes on as it came: one
        that cannot be read echoes nothing (the database refuses it)."""
        if not self._echoes(endpoint):
            return None
        try:
            document = _load(body)
        except MalformedRequest:
            return None
        return self._echo(document, endpoint)

    def _echoes(self, endpoint: EndpointT) -> bool:
        """True when answers on ``endpoint`` repeat what the request asked."""
        return False

    def _echo(self, document: dict[str, Any], endpoint: EndpointT) -> object:
        """What the answer to ``document`` repeats of it (``RequestRewrite.echo``);
        None: nothing."""
        return None

    def _collections(self, request: dict[str, Any]) -> list[str]:
        """The collections one (sub-)request names beyond the path.

        Raises MalformedRequest when a place that names one holds no name.
        """
        return []

    def _overfetch(
        self, request: dict[str, Any], endpoint: EndpointT, factor: Decimal, cap: int
    ) -> int | None:
        """Raise the limit of ``request`` in place; the app's limit, or None if unchanged."""
        found = self._limit(request, endpoint)
        if found is None:
            return None
        field, asked = found
        if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
            raise MalformedRequest(f"{field!r} is not a non-negative integer")
        raised = min(cap, math.ceil(factor * asked))
        if raised <= asked:
            return None
        request[field] = raised
        return asked


def load_request(body: bytes, what: str = "request body") -> Any:
    """``body`` decoded as a JSON value; raises MalformedRequest naming ``what``.

    A body with a key repeated in an object is refused: the gate reads the
    last of two keys, and a database that reads the first would see another
    filter or collection than the one checked.
    """
    try:
        document = orjson.loads(body)
        readable = True
    except orjson.JSONDecodeError:
        readable = False
    # Raised outside the handler so that nothing is chained: a decode error's
    # .doc attribute holds the whole body.
    if not readable:
        raise MalformedRequest(f"{what} is not valid UTF-8 JSON")
    if has_duplicate_keys(body, document):
        raise MalformedRequest(f"an object of the {what} has the same key twice")
    return document


def _load(body: bytes) -> dict[str, Any]:
    document = load_request(body)
    if not isinstance(document, dict):
        raise MalformedRequest("request body is not a JSON object")
    return document


def dump_request(document: Any) -> bytes:
    """``document`` as the request body sent on; raises MalformedRequest past orjson's
    nesting limit."""
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        # Only nesting past orjson's depth limit gets here; databases refuse
        # requests that deep themselves.
        pass
    raise MalformedRequest("request body is nested too deeply")
