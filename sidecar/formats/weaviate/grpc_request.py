"""Weaviate gRPC ``Search`` requests: tenant push-down, over-fetch and the collections named.

The v4 client sends every ``collection.query.*`` call as one
``weaviate.v1.SearchRequest`` to ``/weaviate.v1.Weaviate/Search``. The request
is decoded with the gate's own copy of the message (``proto/vendor/weaviate``),
changed as a message and encoded again: nothing the app sent is spliced as
text, and the tenant is a string field of its own, which no value can break
out of. Push-down sets ``filters`` to

    Filters{operator: AND, filters: [
        Filters{operator: EQUAL, target: {property: <tenant_key>}, value_text: <tenant>},
        <the app's filters, as sent>]}

or the condition alone when the app sent none. ``AND`` keeps the app's
filter exactly as it was (nested, unknown fields and all) and can only narrow
it; Weaviate applies ``filters`` to every search operator (near_*, bm25,
hybrid) and to plain fetches.

With push-down, what the condition cannot reach is refused
(``UnfilterableRequest``), as the GraphQL rewriter refuses it:

- ``near_object`` and the ``uuids`` of a near_text ``move_to``/``move_away``
  (plain or inside hybrid): they name a stored object by id, which Weaviate
  looks up whatever the filter says, so the answer would tell whether another
  tenant's object exists and, through the results, where its vector lies;
- references (``properties.ref_properties``): they return the objects another
  object links to, which the tenant condition on the searched objects does not
  restrict (a single-target reference does not even name their collection);
- a multi-tenancy ``tenant`` other than the caller's tenant;
- a field the gate's copy of the request does not know, anywhere outside
  ``generative`` (the provider settings there are not declared): a newer
  client's search operator the gate cannot vouch for.

Over-fetch raises ``limit`` (0 is the server's ``QUERY_DEFAULTS_LIMIT``, which
the gate cannot know, so it is left alone), but not with ``offset``,
``autocut`` or ``after`` (pages and cut points counted before the response
check), ``group_by`` (its results are groups) or a grouped generative task
(its text would be generated from more objects than the app asked for, and
withheld when the reply is trimmed back).

``RequestRewrite.collections`` names the searched collection, the target
collections of references and of multi-target reference filters, for the
request policy, whether or not anything else is applied.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any, Final

from sidecar.core.hits import Route
from sidecar.formats import grpc_messages
from sidecar.formats.base import (
    MalformedRequest,
    RequestCapabilities,
    RequestRewrite,
    UnfilterableRequest,
    unchanged_request,
)
from sidecar.formats.grpc_adapter import decode_request, encode_unary, grpc_method

SERVICE: Final = "weaviate.v1.Weaviate"
SEARCH_REQUEST: Final = "weaviate.v1.SearchRequest"
# Filters.Operator values (base.proto).
_EQUAL: Final = 1
_AND: Final = 7
# limit is a uint32.
_MAX_LIMIT: Final = 2**32 - 1
# A Weaviate property name (its schema validation).
_PROPERTY_NAME: Final = re.compile(r"[_A-Za-z][_0-9A-Za-z]{0,230}")


def is_search(route: Route) -> bool:
    """True for a call of ``/weaviate.v1.Weaviate/Search``."""
    return grpc_method(route, SERVICE) == "Search"


def refused(what: str) -> UnfilterableRequest:
    """The refusal of a search the tenant condition cannot confine; names no value."""
    return UnfilterableRequest(f"{what} cannot be restricted to the caller's tenant")


class WeaviateGrpcRequests(RequestCapabilities):
    """The request side of Weaviate's gRPC ``Search``."""

    def rewrites_request(self, route: Route) -> bool:
        """True for ``/weaviate.v1.Weaviate/Search``: the only method with a query."""
        return is_search(route)

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
        """Restrict a search to ``tenant`` and raise its limit.

        See ``ResponseFormat.rewrite_request``. Raises UnfilterableRequest for
        a search the condition cannot confine, MalformedRequest for a body that
        is not one SearchRequest, and ValueError when ``overfetch_factor`` is
        not finite or ``tenant_key`` is no Weaviate property name (settings,
        not the client's fault).
        """
        if not is_search(route):
            return unchanged_request(body)
        if not math.isfinite(overfetch_factor):
            raise ValueError("overfetch_factor is not a finite number")
        if tenant_key is not None and not _PROPERTY_NAME.fullmatch(tenant_key):
            raise ValueError("tenant_key is not a Weaviate property name")
        request = decode_request(body, SEARCH_REQUEST)
        collections = _named(request)
        if tenant_key is not None:
            check_confinable(request, tenant)
            push_down(request, tenant_key, tenant)
        asked = None
        if overfetch_factor > 1:
            asked = overfetch(request, Decimal(repr(overfetch_factor)), overfetch_cap)
        if tenant_key is None and asked is None:
            return unchanged_request(body, collections)
        return RequestRewrite(
            encode_unary(request),
            () if asked is None else (asked,),
            tenant_filter=tenant_key is not None,
            overfetched=asked is not None,
            collections=collections,
        )

    def request_collections(self, body: bytes, route: Route) -> tuple[str, ...]:
        """The collections a search names, as ``rewrite_request`` gives them; raises
        MalformedRequest for a body that is not one SearchRequest."""
        if not is_search(route):
            return ()
        return _named(decode_request(body, SEARCH_REQUEST))


def _named(request: Any) -> tuple[str, ...]:
    """The collections ``request`` names, each once."""
    return tuple(dict.fromkeys(collections_named(request)))


def collections_named(request: Any) -> Iterator[str]:
    """The collection ``request`` searches, then those its references and reference
    filters name; MalformedRequest when it names no collection."""
    if not request.collection:
        raise MalformedRequest("the search names no collection")
    yield request.collection
    pending = [request.properties] if request.HasField("properties") else []
    while pending:
        properties = pending.pop()
        for reference in properties.ref_properties:
            if reference.target_collection:
                yield reference.target_collection
            pending.append(reference.properties)
    for target in _filter_targets(request):
        if target.WhichOneof("target") == "multi_target" and target.multi_target.target_collection:
            yield target.multi_target.target_collection


def _filter_targets(request: Any) -> Iterator[Any]:
    """Every FilterTarget of the request's filters, nested references included."""
    pending_filters = [request.filters] if request.HasField("filters") else []
    while pending_filters:
        current = pending_filters.pop()
        pending_filters.extend(current.filters)
        target = current.target if current.HasField("target") else None
        while target is not None:
            yield target
            kind = target.WhichOneof("target")
            if kind == "single_target" and target.single_target.HasField("target"):
                target = target.single_target.target
            elif kind == "multi_target" and target.multi_target.HasField("target"):
                target = target.multi_target.target
            else:
                target = None


def check_confinable(request: Any, tenant: str) -> None:
    """Raise UnfilterableRequest when ``request`` reaches past a tenant condition."""
    if request.HasField("near_object"):
        raise refused("a near_object search (an object named by id)")
    near_texts = [request.near_text] if request.HasField("near_text") else []
    if request.HasField("hybrid_search") and request.hybrid_search.HasField("near_text"):
        near_texts.append(request.hybrid_search.near_text)
    for near_text in near_texts:
        for move in ("move_to", "move_away"):
            if near_text.HasField(move) and getattr(near_text, move).uuids:
                raise refused(f"a near_text {move} towards objects named by id")
    if request.HasField("properties") and request.properties.ref_properties:
        raise refused("a search returning referenced objects")
    if request.tenant and request.tenant != tenant:
        raise refused("a tenant other than the caller's tenant")
    known = type(request)()
    known.CopyFrom(request)
    # Provider settings are not declared (generative.proto is trimmed); they
    # choose a model, never which objects are searched.
    known.ClearField("generative")
    if grpc_messages.has_unknown_fields(known):
        raise refused("a request field the gate does not know")


def push_down(request: Any, tenant_key: str, tenant: str) -> None:
    """AND the tenant condition into ``request.filters`` (in place)."""
    filters_class = type(request.filters)
    try:
        condition = filters_class(operator=_EQUAL, value_text=tenant)
    except ValueError:
        # UnicodeEncodeError (a lone surrogate): its text quotes the tenant, so not chained.
        raise MalformedRequest("the tenant cannot be written as a protobuf string") from None
    condition.target.property = tenant_key
    if request.HasField("filters"):
        combined = filters_class(operator=_AND, filters=[condition, request.filters])
        request.filters.CopyFrom(combined)
    else:
        request.filters.CopyFrom(condition)


def overfetch(request: Any, factor: Decimal, cap: int) -> int | None:
    """Raise ``request.limit`` in place; the app's limit, or None when left alone."""
    if (
        request.limit == 0
        or request.offset
        or request.autocut
        or request.HasField("after")
        or request.HasField("group_by")
        or _grouped_generative(request)
    ):
        return None
    asked = int(request.limit)
    raised = min(cap, _MAX_LIMIT, math.ceil(factor * asked))
    if raised <= asked:
        return None
    request.limit = raised
    return asked


def _grouped_generative(request: Any) -> bool:
    if not request.HasField("generative"):
        return False
    generative = request.generative
    return generative.HasField("grouped") or bool(generative.grouped_response_task)
