"""What the gRPC adapters share: method routes, unary framing and reply release.

A gRPC call is ``POST /{package}.{Service}/{Method}`` with a body of
length-prefixed messages; the adapters are ordinary ``ResponseFormat``s whose
routes are method paths and whose bodies are frames. ``GrpcAdapter`` is what
an adapter of one unary service repeats otherwise: methods classified by
name, filtered replies decoded by the method's reply message.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import Message

from sidecar.core.hits import Route, RouteKind
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedBody, MalformedRequest, ResponseAdapter
from sidecar.formats.body import HitBody, Selection
from sidecar.formats.hits import HitLayout
from sidecar.formats.options import DEFAULT_OPTIONS, AdapterOptions


def grpc_method(route: Route, service: str) -> str | None:
    """The method ``route`` calls on ``service`` (a full name, ``qdrant.Points``); None if none.

    gRPC calls are POSTs; any other method on a gRPC path is no call of the service.
    """
    prefix = f"/{service}/"
    if route.method != "POST" or not route.path.startswith(prefix):
        return None
    method = route.path[len(prefix) :]
    return method if method and "/" not in method else None


def decode_unary(body: bytes, full_name: str) -> Any:
    """The one message of a unary call's body, parsed as ``full_name``.

    MalformedBody for anything but exactly one uncompressed frame that parses.
    """
    found = grpc_frames.messages(body)
    if len(found) != 1:
        raise MalformedBody(f"a unary gRPC body holds one message, not {len(found)}")
    return grpc_messages.decode(full_name, found[0])


def decode_request(body: bytes, full_name: str) -> Any:
    """The request message of a unary call's body, as ``decode_unary`` reads it;
    MalformedRequest where that raises MalformedBody."""
    try:
        return decode_unary(body, full_name)
    except MalformedBody as exc:
        # The frame's or message's problem, which names no value of the request.
        problem = str(exc)
    # Raised outside the handler: nothing of the body is chained.
    raise MalformedRequest(problem)


def encode_unary(message: Message) -> bytes:
    """``message`` as a unary call's body: one uncompressed frame."""
    return grpc_frames.frame(message.SerializeToString())


def released_body(body: bytes, reply: Message, released: Message, *, unknown: bool) -> bytes:
    """The framed body for ``released``, built from ``reply`` (which came as ``body``).

    The bytes that came when nothing was removed, replaced or unknown: the
    client gets exactly what the database sent. Equal messages from a body of
    another length mean a field was sent twice (or encoded unusually), so that
    body is encoded again too. Any unknown field left in ``released`` is
    dropped here.
    """
    if (
        not unknown
        and released == reply
        and reply.ByteSize() == len(body) - grpc_frames.PREFIX_BYTES
    ):
        return body
    if released is reply:
        released = grpc_messages.released(reply)  # the parsed reply stays as it came
    else:
        released.DiscardUnknownFields()
    return encode_unary(released)


@dataclass(eq=False)
class GrpcReply(HitBody):
    """A parsed unary reply, sent as one frame (``released_body``)."""

    body: bytes
    reply: Any
    unknown: bool  # the reply held fields the gate's copy of its messages does not declare

    def _encode(self, document: Any) -> bytes:
        return released_body(self.body, self.reply, document, unknown=self.unknown)


@dataclass(eq=False)
class RebuiltReply(GrpcReply):
    """A ``GrpcReply`` whose adapter rebuilds it with a function."""

    rebuild: Callable[[Selection], Any]

    def _rebuild(self, selection: Selection) -> Any:
        return self.rebuild(selection)


class GrpcAdapter(ResponseAdapter[str]):
    """A ``ResponseAdapter`` for the unary methods of one gRPC ``service``.

    Routes are the service's methods: ``kinds`` says what each one does, and
    ``replies`` names the reply message of each method whose replies are
    filtered. A shape is the method's name; the document ``_read`` gets is
    ``(body, reply)``: the body goes along, so that a reply with nothing
    removed is sent as it came (``released_body``).
    """

    service: str  # the service's full name: "qdrant.Points", "VectorService"
    kinds: Mapping[str, RouteKind]  # what each method of the service does
    replies: Mapping[str, str]  # the reply message's full name, per filtered method

    def route_kind(self, route: Route) -> RouteKind | None:
        """What the method ``route`` calls does (``kinds``); None for paths outside the service.

        A method of the service that ``kinds`` does not list (a newer server's)
        is CONTENT: it may return stored data, and an unknown route would be
        answered by the request policy alone, with its response unread.
        """
        called = grpc_method(route, self.service)
        if called is None:
            return None
        return self.kinds.get(called, RouteKind.CONTENT)

    def route_collections(self, route: Route) -> list[str]:
        """[]: a gRPC path names no collection; the request message does
        (``request_collections``)."""
        return []

    def _shape(self, route: Route) -> str | None:
        called = grpc_method(route, self.service)
        return called if called in self.replies else None

    def _load(self, body: bytes, shape: str) -> tuple[bytes, Any]:
        return body, decode_unary(body, self.replies[shape])


class RestTwin(Protocol):
    """A REST adapter whose hits a gRPC adapter reads as it does."""

    text_field: str
    id_field: str | None

    @property
    def twin_layout(self) -> HitLayout:
        """How the gRPC twin reads and releases a hit: as the JSON hit it stands for."""
        ...


class TwinGrpcAdapter(GrpcAdapter):
    """A ``GrpcAdapter`` whose hits are read and released as its REST ``twin`` reads
    the JSON hits they stand for: the twin's options, with the same meaning."""

    def __init__(self, options: AdapterOptions = DEFAULT_OPTIONS) -> None:
        """``options`` as the REST twin takes them, read by it."""
        rest = self._twin(options)
        self.text_field, self.id_field = rest.text_field, rest.id_field
        self._layout = rest.twin_layout

    @abstractmethod
    def _twin(self, options: AdapterOptions) -> RestTwin:
        """The REST twin, built with ``options``."""
