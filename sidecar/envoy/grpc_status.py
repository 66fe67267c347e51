"""The gate's refusals as gRPC answers: a status a gRPC client acts on, not an HTTP body.

A refused gRPC call gets a trailers-only answer (Envoy builds it from an
``ImmediateResponse`` with ``grpc_status``): HTTP 200, ``grpc-status``, and
the gate's short error body (``sidecar.refusals``) as ``grpc-message``.

Which status matters: clients retry some. pymilvus retries every status but
DEADLINE_EXCEEDED, PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT,
ALREADY_EXISTS, RESOURCE_EXHAUSTED and UNIMPLEMENTED, up to 75 times over
about three and a half minutes. So only an outage of what the gate depends on
(HTTP 503: the metadata store, the policy engine) is UNAVAILABLE, which a
client should retry; anything else the gate refuses is a status no client
retries: asking again would get the same answer.
"""

from __future__ import annotations

from enum import IntEnum

from sidecar.wire import ext_proc_pb2 as ext_proc


class GrpcCode(IntEnum):
    """The gRPC status codes the gate sends (grpc/doc/statuscodes.md)."""

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


_FOR_HTTP = {
    400: GrpcCode.INVALID_ARGUMENT,
    401: GrpcCode.UNAUTHENTICATED,
    403: GrpcCode.PERMISSION_DENIED,
    404: GrpcCode.NOT_FOUND,
    405: GrpcCode.UNIMPLEMENTED,
    413: GrpcCode.RESOURCE_EXHAUSTED,
    503: GrpcCode.UNAVAILABLE,
}


def grpc_code_for(http_status: int) -> GrpcCode:
    """The gRPC status of a refusal the gate would answer with ``http_status``.

    A status without an equivalent is PERMISSION_DENIED: the gate releases
    nothing of the answer, and no client retries it (an upstream body the gate
    cannot read, a gate error: asking again gets the same refusal).
    """
    return _FOR_HTTP.get(http_status, GrpcCode.PERMISSION_DENIED)


def as_grpc(answer: ext_proc.ProcessingResponse) -> ext_proc.ProcessingResponse:
    """``answer`` with its immediate response, if any, turned into a trailers-only gRPC answer.

    A ``grpc_status`` already set (an upstream's own status, kept) stays; the
    JSON content type goes, since Envoy marks the answer ``application/grpc``.
    """
    if not answer.HasField("immediate_response"):
        return answer
    immediate = answer.immediate_response
    if not immediate.HasField("grpc_status"):
        immediate.grpc_status.status = grpc_code_for(immediate.status.code)
    kept = [h for h in immediate.headers.set_headers if h.header.key.lower() != "content-type"]
    del immediate.headers.set_headers[:]
    immediate.headers.set_headers.extend(kept)
    return answer
