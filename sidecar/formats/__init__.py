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
    "detect",
]


def classify(
    route: Route, formats: Sequence[ResponseFormat]
) -> tuple[ResponseFormat, RouteKind] | None:
    """The first of ``formats`` that knows ``route``, and what the route does.

    Order matters when formats overlap: list the most specific first.
    """
    for fmt in formats:
        kind = fmt.route_kind(route)
        if kind is not None:
            return fmt, kind
    return None


def detect(route: Route, formats: Sequence[ResponseFormat]) -> ResponseFormat | None:
    """The format whose responses on ``route`` must be filtered, or None to pass them."""
    found = classify(route, formats)
    if found is None or found[1] is not RouteKind.FILTERED:
        return None
    return found[0]
