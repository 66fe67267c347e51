"""Format adapters (responses, and search requests), and the lookup that picks one."""

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
)
from sidecar.formats.qdrant import QdrantFormat

__all__ = [
    "Candidate",
    "MalformedBody",
    "MalformedRequest",
    "ParsedBody",
    "QdrantFormat",
    "Replacement",
    "RequestRewrite",
    "RequestRewriter",
    "ResponseFormat",
    "Route",
    "detect",
]


def detect(route: Route, formats: Sequence[ResponseFormat]) -> ResponseFormat | None:
    """Return the first of ``formats`` that handles ``route``, or None if none does.

    Order matters when formats overlap: list the most specific first.
    """
    return next((fmt for fmt in formats if fmt.handles(route)), None)
