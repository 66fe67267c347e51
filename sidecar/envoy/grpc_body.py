"""gRPC bodies as Envoy buffers them: recognised by content type, decompressed per message.

A gRPC message is compressed or not per frame (its flag), with the algorithm
the ``grpc-encoding`` header names; a server may compress even when the
client asked for identity. The adapters read only uncompressed frames, so the
sidecar decodes every compressed one first, with the same limits as
compressed HTTP bodies; a frame that does not decode is an error, never
passed unread.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.envoy.content_encoding import UndecodableBody, decode
from sidecar.formats import grpc_frames
from sidecar.formats.base import MalformedBody

# grpc-web frames its trailers into the body and is not what the adapters read.
_GRPC = "application/grpc"
# gRPC's names for the codings content_encoding decodes.
_CODINGS = {"gzip": "gzip", "deflate": "deflate", "zstd": "zstd"}


def is_grpc(headers: Mapping[str, str]) -> bool:
    """True for a gRPC request: ``content-type: application/grpc`` or ``application/grpc+...``."""
    content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return content_type == _GRPC or content_type.startswith(_GRPC + "+")


def uncompressed(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` with every compressed frame decompressed (``encoding``: ``grpc-encoding``).

    Returns ``body`` itself when no frame is compressed. Raises UndecodableBody
    for an unknown encoding, data that does not decode, a body over ``limit``
    once decoded, or bytes that are not gRPC frames.
    """
    try:
        spans = grpc_frames.frame_spans(body)
    except MalformedBody as exc:
        raise UndecodableBody(str(exc)) from None
    if not any(compressed for compressed, _, _ in spans):
        return body
    coding = _CODINGS.get(encoding.strip().lower())
    if coding is None:
        raise UndecodableBody("gRPC message in an unknown grpc-encoding")
    parts: list[bytes] = []
    size = 0
    for compressed, start, end in spans:
        message = body[start:end]
        plain = decode(message, (coding,), limit - size) if compressed else message
        size += len(plain)
        if size > limit:
            raise UndecodableBody("gRPC body is over the size limit once decompressed")
        parts.append(grpc_frames.frame(plain))
    return b"".join(parts)
