"""What every response-format adapter provides.

An adapter turns a vector database's response body into candidates (one per
returned hit, in body order) and renders the body again keeping only the
admitted positions. Adapters know nothing about policy or Envoy.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol


class MalformedBody(Exception):
    """The upstream body is not the shape this format expects; never pass it on."""


@dataclass(frozen=True, slots=True)
class Route:
    """The parts of the HTTP request an adapter may look at."""

    method: str
    path: str  # without the query string


@dataclass(frozen=True, slots=True)
class Candidate:
    """One hit in a response body.

    ``position`` numbers hits across the whole body in document order (a batch
    response numbers through all of its sub-results). ``chunk_id`` or ``text``
    is None when the hit does not carry a usable value; the gate then rejects it
    as MALFORMED_CHUNK with ``problem`` as the audit detail.
    """

    position: int
    chunk_id: str | None
    text: str | None
    problem: str | None = None


class ParsedBody(Protocol):
    @property
    def candidates(self) -> Sequence[Candidate]: ...

    def render(self, keep: Collection[int]) -> bytes:
        """Serialise the body with only the hits whose position is in ``keep``."""
        ...


class ResponseFormat(Protocol):
    @property
    def name(self) -> str:
        """Short stable name, used as the ``format`` metric label."""
        ...

    def handles(self, route: Route) -> bool:
        """True when responses to ``route`` carry hits this format must filter."""
        ...

    def parse(self, body: bytes, route: Route) -> ParsedBody:
        """Parse a successful response body; raise MalformedBody if it is not one."""
        ...
