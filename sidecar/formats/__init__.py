"""Format adapters (responses, and search requests), and the lookup that picks one.

One module per database; ``registry`` builds the configured set."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.formats.base import (
    Candidate,
    MalformedBody,
    MalformedRequest,
    ParsedBody,
    Replacement,
    RequestRewrite,
    RequestRewriter,
    ResponseFormat,
    Route,
    RouteKind,
    Unreleasable,
)
from sidecar.formats.chroma import ChromaFormat
from sidecar.formats.elasticsearch import ElasticsearchFormat
from sidecar.formats.generic import GenericFormat
from sidecar.formats.milvus import MilvusFormat
from sidecar.formats.pinecone import PineconeFormat
from sidecar.formats.qdrant import QdrantFormat
from sidecar.formats.weaviate import WeaviateFormat

__all__ = [
    "Candidate",
    "ChromaFormat",
    "ElasticsearchFormat",
    "GenericFormat",
    "MalformedBody",
    "MalformedRequest",
    "MilvusFormat",
    "ParsedBody",
    "PineconeFormat",
    "QdrantFormat",
    "Replacement",
    "RequestRewrite",
    "RequestRewriter",
    "ResponseFormat",
    "Route",
    "RouteKind",
    "Unreleasable",
    "WeaviateFormat",
    "classify",
]


# For routes that several formats claim: the strictest answer wins.
_STRICTNESS = {RouteKind.READ: 0, RouteKind.WRITE: 1, RouteKind.CONTENT: 2}


def classify(
    route: Route, formats: Sequence[ResponseFormat]
) -> tuple[ResponseFormat, RouteKind] | None:
    """The format that owns ``route`` and what the route does; None if no format knows it.

    Every format is asked, because the databases' path spaces overlap at the
    edges (an Elasticsearch index named ``collections`` looks like Qdrant's
    collection routes). A route that exactly one format filters is that
    format's. Otherwise the strictest answer wins (content over write over
    read), and a route that two formats would filter is content: the gate
    cannot tell which body it will get.
    """
    claims = [(fmt, kind) for fmt in formats if (kind := fmt.route_kind(route)) is not None]
    if not claims:
        return None
    filtering = [claim for claim in claims if claim[1] is RouteKind.FILTERED]
    if len(filtering) == 1:
        return filtering[0]
    if filtering:
        return filtering[0][0], RouteKind.CONTENT
    return max(claims, key=lambda claim: _STRICTNESS[claim[1]])
