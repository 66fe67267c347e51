"""What a response is made of, as the decision core sees it: the route and its hits.

Adapters (``sidecar.formats``) produce these from a database's body; the
decision core reads them. Nothing here knows a database's wire format.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RouteKind(StrEnum):
    """What a request on a route does, as far as the gate is concerned.

    The request policy decides which kinds a caller may use; only FILTERED
    responses are read by the gate.
    """

    FILTERED = "filtered"  # responses carry hits that the adapter filters
    # Reads that return no chunk content and count or name no stored object
    # (schemas, collection names, states, health).
    READ = "read"
    # Returns chunk content, or counts or names stored objects, where the gate
    # cannot filter it (exports, snapshots, statistics, import descriptions).
    CONTENT = "content"
    WRITE = "write"  # changes the database


@dataclass(frozen=True, slots=True)
class Route:
    """The parts of the HTTP request an adapter may look at."""

    method: str
    path: str  # without the query string


def path_under(path: str, prefix: str) -> bool:
    """True when ``path`` is ``prefix`` or below it, by whole path segments.

    ``/collections/public`` covers ``/collections/public/points/search`` but
    not ``/collections/public-hr/...``; a prefix ending in ``/`` covers what
    is below it.
    """
    if not path.startswith(prefix):
        return False
    return prefix.endswith("/") or len(path) == len(prefix) or path[len(prefix)] == "/"


@dataclass(frozen=True, slots=True)
class Candidate:
    """One hit in a response body.

    ``position`` numbers hits across the whole body in document order (a batch
    response numbers through all of its sub-results). ``chunk_id`` or ``text``
    is None when the hit does not carry a usable value; the gate then rejects it
    as MALFORMED_CHUNK with ``problem`` as the audit detail.

    ``fields`` is the canonical JSON of the hit's integrity-checked payload
    fields (``integrity.canonical_fields``), or None when the format declares
    none. When it is set, the gate admits the hit only if the record has a
    ``payload_sha256`` equal to its hash.
    """

    position: int
    chunk_id: str | None
    text: str | None
    problem: str | None = None
    fields: str | None = None


@dataclass(frozen=True, slots=True)
class Replacement:
    """Authoritative content that takes a hit's place (a superseded chunk's successor)."""

    chunk_id: str
    text: str
