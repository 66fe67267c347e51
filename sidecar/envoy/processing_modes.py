"""The processing modes the gate asks Envoy for, per stream (``mode_override``).

Envoy's filter configuration sends the request headers only; the answer to
them says what else the stream needs (needs ``allow_mode_override``). An
override replaces the whole mode, so each is spelled out in full.
"""

from __future__ import annotations

from sidecar.wire import envoy_processing_mode_pb2 as processing_mode

_Mode = processing_mode.ProcessingMode
ProcessingMode = processing_mode.ProcessingMode


def _whole_mode(
    response_headers: _Mode.HeaderSendMode,
    bodies: _Mode.BodySendMode,
    *,
    request_body: _Mode.BodySendMode | None = None,
    response_trailers: _Mode.HeaderSendMode = _Mode.SKIP,
) -> ProcessingMode:
    """A mode override with every field spelled out; ``request_body`` defaults to ``bodies``."""
    return _Mode(
        request_header_mode=_Mode.SEND,
        response_header_mode=response_headers,
        request_body_mode=bodies if request_body is None else request_body,
        response_body_mode=bodies,
        request_trailer_mode=_Mode.SKIP,
        response_trailer_mode=response_trailers,
    )


# Sent with the response-headers answer for responses the gate will not read,
# so Envoy neither buffers nor sends their bodies.
SKIP_RESPONSE_BODY = _Mode(response_body_mode=_Mode.NONE)
# Routes the gate does not filter: the stream ends at the request headers.
HEADERS_ONLY = _whole_mode(_Mode.SKIP, _Mode.NONE)
# A route the gate does not filter whose request body it reads (``ReadCollections``).
REQUEST_BODY_ONLY = _whole_mode(_Mode.SKIP, _Mode.NONE, request_body=_Mode.BUFFERED)
# An answer read for the collection names it gives, never changed: up to Envoy's
# buffer limit (BUFFERED would fail a larger one; this sends a part of it, which
# is not read, and lets the rest through).
READ_RESPONSE_BODY = _whole_mode(_Mode.SEND, _Mode.BUFFERED_PARTIAL, request_body=_Mode.NONE)

# A filtered route, by (gRPC call, request body read). gRPC answers' trailers
# are read too; a plain HTTP route whose request body is not read keeps the
# filter's configured mode (None: no override).
FILTER_MODES: dict[tuple[bool, bool], ProcessingMode | None] = {
    (True, True): _whole_mode(_Mode.SEND, _Mode.BUFFERED, response_trailers=_Mode.SEND),
    (True, False): _whole_mode(
        _Mode.SEND, _Mode.BUFFERED, request_body=_Mode.NONE, response_trailers=_Mode.SEND
    ),
    (False, True): _whole_mode(_Mode.SEND, _Mode.BUFFERED),
    (False, False): None,
}
