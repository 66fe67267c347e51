"""Weaviate's GraphQL API: routes, the format's options and its hit layout.

Responses of ``POST /v1/graphql`` and ``/v1/graphql/batch`` are parsed and
rendered by ``rest_body``; their requests are rewritten (tenant push-down,
over-fetch) by ``rest_request`` and ``rest_graphql``.

A hit is a ``Get`` result object. Weaviate objects have no free-form metadata
object: a hit holds the class properties the query selected beside
``_additional``, so the hit itself is the free-form object the layout projects
(the text, the id, hashed and releasable properties), and a substituted hit is
not marked with ``SUBSTITUTED_FOR``.
"""

from __future__ import annotations

from typing import Any, Final

from sidecar.core.hits import Route, RouteKind
from sidecar.formats.base import MalformedBody, ResponseAdapter, load_json, load_object
from sidecar.formats.hits import Field, FieldPath, HitLayout, Hits
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions
from sidecar.formats.weaviate import errors as weaviate_errors
from sidecar.formats.weaviate.rest_body import (
    Parser,
    Release,
    WeaviateBody,
    reported,
    sub_results,
)
from sidecar.formats.weaviate.rest_request import WeaviateRequests, graphql_endpoint

GENERATIVE_MODES: Final = ("strip", "block")

# A hit's own keys: the rest of a result object is its properties.
_HIT_KEYS: Final = frozenset({"_additional", "__typename"})

# First path segments under /v1 whose every route hands out stored values the
# gate does not check: backups and exports of whole collections, the REST
# Search API (/v1/search/{c}/..., /v1/aggregate/{c}) and MCP tool calls.
# /v1/nodes too: its verbose output counts every shard's objects.
_CONTENT_ROOTS: Final = frozenset({"backups", "export", "search", "aggregate", "mcp", "nodes"})
# First path segments whose GET/HEAD read metadata only; other methods write.
_READ_ROOTS: Final = frozenset(
    {
        ".well-known",
        "meta",
        "schema",
        "cluster",
        "aliases",
        "users",
        "authz",
        "replication",
        "namespaces",
        "tasks",
        "classifications",
    }
)


def generative_option(value: object) -> str:
    """The ``generative`` option, checked: one of ``GENERATIVE_MODES``."""
    if not isinstance(value, str) or value not in GENERATIVE_MODES:
        raise ValueError(f"generative must be one of {', '.join(GENERATIVE_MODES)}")
    return value


def own_properties(options: AdapterOptions) -> tuple[FieldPath, ...]:
    """The text property, then the id property when the chunk id is one."""
    return ((options.text_field,), *([(options.id_field,)] if options.id_field else []))


def released_properties(options: AdapterOptions) -> tuple[FieldPath, ...]:
    """Every property an object may send: its own, then the hashed and releasable ones,
    each once."""
    fields = options.fields
    return tuple(dict.fromkeys([*own_properties(options), *fields.hashed, *fields.releasable]))


class WeaviateFormat(ResponseAdapter[bool], WeaviateRequests):
    """Adapter for Weaviate's GraphQL search responses (``/v1/graphql`` and its batch);
    rewrites their requests.

    The chunk id is the object UUID (``_additional.id``), or the property
    ``id_field`` when set; the chunk text is the property ``text_field``.
    ``generative`` says what to do with generated text computed from objects
    the gate removed: "strip" clears it, "block" refuses the response.
    """

    name = "weaviate"

    def __init__(
        self, options: AdapterOptions = DEFAULT_OPTIONS, *, generative: str = "strip"
    ) -> None:
        """The text, the id (None: the object UUID) and the released fields are
        properties; every other property is dropped."""
        self.text_field = options.text_field
        self.id_field = options.id_field
        self.generative = generative_option(generative)
        chunk_id = options.id_at(Field(("id",), "_additional.id", "_additional"), "property")
        text = options.text_at("property")
        self._layout = HitLayout(
            "result object", chunk_id, text, None, hit_keys=_HIT_KEYS, fields=options.fields
        )
        self._release = Release(
            self._layout.released,
            frozenset(released_properties(options)),
            self.generative == "block",
        )

    def route_kind(self, route: Route) -> RouteKind | None:
        """What a route under ``/v1`` does; None for paths outside Weaviate's API.

        FILTERED: POST ``/v1/graphql`` and ``/v1/graphql/batch``. CONTENT: REST
        object reads, backups, exports, the REST search and aggregate API and
        MCP (all return stored values past the per-chunk check), GETs of
        module-defined endpoints, and what names or counts every tenant's
        objects: nodes, a class's tenants, its shards (objects queued for
        indexing) and a classification (objects classified). READ: GET/HEAD
        of metadata, schema, cluster, user and role endpoints, permission
        checks and tokenisation. WRITE: everything else on those roots,
        batches and object changes. The gRPC twin (``grpc``) classifies the
        same operations alike.
        """
        segments = route.path.removesuffix("/").split("/")
        if segments[:2] != ["", "v1"] or not all(segments[2:]):
            return None
        rest = segments[2:]
        method = route.method.upper()
        reads = method in ("GET", "HEAD")
        if not rest:
            # The root lists the endpoints.
            return RouteKind.READ if reads else RouteKind.WRITE
        root = rest[0]
        if root == "graphql":
            if method == "POST" and rest[1:] in ([], ["batch"]):
                return RouteKind.FILTERED
            return RouteKind.CONTENT if reads else RouteKind.WRITE
        if root in _CONTENT_ROOTS:
            return RouteKind.CONTENT
        if root == "schema" and rest[2:3] in (["tenants"], ["shards"]) and reads:
            # The names of a multi-tenant class's tenants (who else uses it),
            # and its shards with the objects each has queued for indexing.
            return RouteKind.CONTENT
        if root == "classifications" and rest[1:] and reads:
            # A classification's counts of the objects it classified.
            return RouteKind.CONTENT
        if root in ("objects", "modules"):
            return RouteKind.CONTENT if reads else RouteKind.WRITE
        if root == "batch":
            return RouteKind.WRITE
        tokenizes_property = rest[2:3] == ["properties"] and rest[4:] == ["tokenize"]
        if root == "tokenize" or (root == "schema" and tokenizes_property and method == "POST"):
            # Tokenises the text in the request (with a property's tokenization);
            # touches no stored object.
            return RouteKind.READ
        if root in _READ_ROOTS:
            if reads or (root == "authz" and rest[-1] == "has-permission"):
                return RouteKind.READ
            return RouteKind.WRITE
        return None

    def _shape(self, route: Route) -> bool | None:
        """Whether the route is the batch endpoint; None for routes not filtered."""
        return graphql_endpoint(route)

    def _load(self, body: bytes, shape: bool) -> Any:
        if not shape:
            return load_object(body)
        document = load_json(body)
        if not isinstance(document, list):
            raise MalformedBody("a GraphQL batch response is not a JSON list")
        return document

    def missing_field(self, error_text: str) -> str | None:
        """The property a Weaviate error names as missing from the class (``errors``)."""
        return weaviate_errors.missing_field(error_text)

    def _read(self, document: Any, shape: bool) -> WeaviateBody:
        hits = Hits(self._layout)
        parser = Parser(hits)
        if shape:
            responses = tuple(parser.response(item) for item in document)
            # Batches are never over-fetched.
            return WeaviateBody(
                hits, responses, True, self._release, reported_error=reported(responses)
            )
        response = parser.response(document)
        # A plain query has one limit per class result.
        return WeaviateBody(
            hits,
            (response,),
            False,
            self._release,
            sub_results=sub_results(response),
            reported_error=reported((response,)),
        )
