"""What the request path plans for one exchange, decided once at its request headers.

A plan is a value, never a set of flags: the servicer picks how it handles
the rest of the stream from the plan's type alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.caller import Caller
from sidecar.core.hits import Route
from sidecar.core.modes import RoutePolicy
from sidecar.formats.base import ResponseFormat
from sidecar.refusals import Refusal


@dataclass(frozen=True, slots=True)
class Refused:
    """The request never reaches the database: the client gets ``refusal``."""

    refusal: Refusal


@dataclass(frozen=True, slots=True)
class PassThrough:
    """Admitted, on a route whose answers the gate does not read: nothing more to see."""

    strip_headers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ReadCollections:
    """Admitted, on a route the gate does not filter whose body it must read first.

    A gRPC path names no collection (a Qdrant upsert's ``collection_name`` is
    in its body), so the request policy's ownership check needs the body; a
    REST body can ask what no tenant condition reaches (an Elasticsearch
    point in time's ``index_filter``), which is refused. The body is passed
    on unchanged once the policy allowed what it names. ``grpc``: a gRPC call.
    """

    strip_headers: tuple[str, ...]
    route: Route
    caller: Caller
    fmt: ResponseFormat
    grpc: bool


@dataclass(frozen=True, slots=True)
class ReadNames:
    """Admitted, on a route whose successful answer says which names collection ids stand
    for (Chroma's collection routes): the answer is read, never changed, so that
    the request policy and the metrics can name the collections later requests
    address by id (``RequestPath.learn_names``)."""

    strip_headers: tuple[str, ...]
    route: Route


@dataclass(frozen=True, slots=True)
class Filter:
    """Admitted, on a route whose answers ``fmt`` filters under ``policy``.

    ``reads_body``: the request body is read, for the collections it names,
    the tenant push-down and over-fetch (``RequestPath.read_body``).
    ``query_string`` is the request's URL parameters, as sent.
    """

    strip_headers: tuple[str, ...]
    route: Route
    caller: Caller
    fmt: ResponseFormat
    policy: RoutePolicy
    query_string: str
    reads_body: bool


Plan = Refused | PassThrough | ReadCollections | ReadNames | Filter
