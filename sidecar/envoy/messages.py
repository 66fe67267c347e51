"""Envoy's wire messages read, and the gate's answers built: one helper per kind of answer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sidecar.envoy.processing_modes import SKIP_RESPONSE_BODY, ProcessingMode
from sidecar.refusals import Refusal
from sidecar.wire import envoy_core_pb2 as core
from sidecar.wire import envoy_http_status_pb2 as http_status
from sidecar.wire import ext_proc_pb2 as ext_proc


def header_dict(header_map: core.HeaderMap) -> dict[str, str]:
    """Headers as a dict of lowercase names; repeated headers joined with ", " (RFC 9110).

    Joining matters for list headers the gate acts on: two content-encoding
    lines mean two codings, and reading only one would misdecode the body.
    """
    headers: dict[str, str] = {}
    for h in header_map.headers:
        # Envoy fills raw_value (bytes) and leaves value empty in recent versions.
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        name = h.key.lower()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def set_headers(headers: Mapping[str, str]) -> list[core.HeaderValueOption]:
    """Header options that overwrite (never append to) existing values."""
    return [
        core.HeaderValueOption(
            header=core.HeaderValue(key=name, raw_value=value.encode()),
            append_action=core.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for name, value in headers.items()
    ]


def immediate(status: int, body: bytes, details: str) -> ext_proc.ProcessingResponse:
    """Answer the client directly; Envoy never forwards the upstream body."""
    return ext_proc.ProcessingResponse(
        immediate_response=ext_proc.ImmediateResponse(
            status=http_status.HttpStatus(code=status),  # type: ignore[arg-type]
            headers=ext_proc.HeaderMutation(
                set_headers=set_headers({"content-type": "application/json"})
            ),
            body=body,
            details=details,
        )
    )


def refusal_answer(
    refusal: Refusal,
    *,
    grpc: bool,
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    grpc_status: int | None = None,
) -> ext_proc.ProcessingResponse:
    """``refusal`` as Envoy's immediate answer: the one place a refusal becomes a status.

    An HTTP client gets the HTTP status and the JSON error body (or ``body``:
    a database's own answer for a missing hit). A gRPC client reads a refusal
    from ``grpc-status``, never from an HTTP body: Envoy builds a
    trailers-only answer, with the error body as ``grpc-message`` and without
    the JSON content type. ``grpc_status`` replaces the refusal's own (an
    upstream's status, kept for the client's retry logic). ``headers``: the
    gate's own (the decision id).
    """
    answer = immediate(
        refusal.http_status, refusal.body() if body is None else body, refusal.details
    )
    immediate_response = answer.immediate_response
    if grpc:
        immediate_response.grpc_status.status = (
            refusal.grpc_status if grpc_status is None else grpc_status
        )
        del immediate_response.headers.set_headers[:]
    if headers:
        immediate_response.headers.set_headers.extend(set_headers(headers))
    return answer


def request_headers_answer(
    strip_headers: Sequence[str], mode: ProcessingMode | None
) -> ext_proc.ProcessingResponse:
    """The answer to admitted request headers: the headers to strip, and what the stream
    needs next (``mode``; None keeps the filter's own)."""
    answer = ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(
                header_mutation=ext_proc.HeaderMutation(remove_headers=strip_headers)
            )
        )
    )
    if mode is not None:
        answer.mode_override.CopyFrom(mode)
    return answer


def headers_answer(
    common: ext_proc.CommonResponse, *, skip_body: bool
) -> ext_proc.ProcessingResponse:
    """The response-headers answer; ``skip_body``: Envoy neither buffers nor sends the body."""
    answer = ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(response=common))
    if skip_body:
        answer.mode_override.CopyFrom(SKIP_RESPONSE_BODY)
    return answer


def kept_only(headers: Mapping[str, str], kept: frozenset[str] | None) -> ext_proc.CommonResponse:
    """Remove every upstream response header that is not in ``kept`` (None: keep all)."""
    if kept is None:
        return ext_proc.CommonResponse()
    removed = [
        name
        for name in headers
        if name not in kept and not name.startswith(":")  # pseudo-headers stay
    ]
    return ext_proc.CommonResponse(header_mutation=ext_proc.HeaderMutation(remove_headers=removed))


def body_answer(
    body: bytes | None,
    headers: Mapping[str, str],
    *,
    request: bool,
    grpc: bool = False,
    remove: Sequence[str] = (),
) -> ext_proc.ProcessingResponse:
    """A body answer setting ``headers``, replacing the body with ``body`` (None: as it
    came) and removing ``remove`` (codings the new body no longer has).

    A replaced HTTP response body gets its own content-length: Envoy keeps the
    upstream's and rejects a body of another length (gRPC answers have none:
    frames carry lengths). A rewritten request sets it in ``headers``.
    """
    common = ext_proc.CommonResponse()
    # A message field set from another message is a copy: change it in place.
    mutation = common.header_mutation
    mutation.set_headers.extend(set_headers(headers))
    if body is not None:
        common.body_mutation.body = body
        mutation.remove_headers.extend(remove)
        if not request and not grpc:
            mutation.set_headers.extend(set_headers({"content-length": str(len(body))}))
    if request:
        return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(response=common))
    return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse(response=common))
