"""What the gRPC adapters share: method routes and unary reply framing.

A gRPC call is ``POST /{package}.{Service}/{Method}`` with a body of
length-prefixed messages; the adapters are ordinary ``ResponseFormat``s whose
routes are method paths and whose bodies are frames.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from sidecar.core.hits import Route
from sidecar.formats import grpc_frames, grpc_messages
from sidecar.formats.base import MalformedBody
from sidecar.formats.body import HitBody, Selection


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
