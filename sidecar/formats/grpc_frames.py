"""gRPC's length-prefixed message framing, as a body carries it over HTTP/2.

Every message is a 5-byte prefix (a compressed flag, then the length as a
big-endian 32-bit integer) and the message bytes. Envoy hands the sidecar a
buffered body as one run of such frames. The sidecar decompresses frames
before an adapter sees them (``sidecar.envoy.grpc_body``), so here a
compressed flag is as malformed as a truncated frame: an adapter never reads
bytes it cannot see through.
"""

from __future__ import annotations

import struct

from sidecar.formats.base import MalformedBody

# The flag as a number (0 or 1; anything else is refused), then the length.
PREFIX = struct.Struct(">BI")
PREFIX_BYTES = PREFIX.size  # 5


def frame_spans(body: bytes) -> list[tuple[bool, int, int]]:
    """``(compressed, start, end)`` of every message of ``body``, without copying any.

    MalformedBody unless ``body`` is exact frames.
    """
    spans: list[tuple[bool, int, int]] = []
    offset = 0
    while offset < len(body):
        if len(body) - offset < PREFIX_BYTES:
            raise MalformedBody("gRPC body ends inside a frame prefix")
        flag, length = PREFIX.unpack_from(body, offset)
        if flag > 1:
            raise MalformedBody("gRPC frame has an unknown flag")
        start = offset + PREFIX_BYTES
        offset = start + length
        if offset > len(body):
            raise MalformedBody("gRPC body ends inside a message")
        spans.append((flag == 1, start, offset))
    return spans


def messages(body: bytes) -> list[bytes]:
    """The uncompressed messages of ``body``; MalformedBody unless it is exact flag-0 frames."""
    spans = frame_spans(body)
    if any(compressed for compressed, _, _ in spans):
        raise MalformedBody("gRPC message is compressed")
    return [body[start:end] for _, start, end in spans]


def frame(message: bytes) -> bytes:
    """``message`` as one uncompressed frame."""
    return PREFIX.pack(0, len(message)) + message
