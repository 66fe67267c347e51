"""Envoy External Processing servicer: the response path.

One gRPC stream per HTTP request. The stream sees the request headers (route,
request id, the caller identity that ext_authz put in dynamic metadata), then
the response headers (status, encoding), then the whole response body
(BUFFERED mode). Everything about what to do with a body lives in
:class:`~sidecar.enforcement.ResponseFilter`; this module only translates.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from google.protobuf import json_format

from sidecar.access import path_problem
from sidecar.content_encoding import UndecodableBody, decode, parse_content_encoding
from sidecar.enforcement import FilterResult, ResponseFilter
from sidecar.envoy.messages import header_dict, immediate, set_headers
from sidecar.formats import (
    MalformedRequest,
    RequestRewrite,
    RequestRewriter,
    ResponseFormat,
    Route,
)
from sidecar.identity import Caller, IdentityError
from sidecar.wire import envoy_processing_mode_pb2 as processing_mode
from sidecar.wire import ext_proc_pb2 as ext_proc
from sidecar.wire import ext_proc_pb2_grpc as ext_proc_grpc

log = logging.getLogger(__name__)

IDENTITY_NAMESPACE = "envoy.filters.http.ext_authz"

_CONTINUE = ext_proc.CommonResponse()
# Sent with the response-headers answer for responses the gate will not read,
# so Envoy neither buffers nor sends their bodies (needs allow_mode_override).
_SKIP_BODY = processing_mode.ProcessingMode(response_body_mode=processing_mode.ProcessingMode.NONE)
# Sent with the request-headers answer when the gate rewrites the query. An
# override replaces the whole mode, so every field is spelled out.
_WITH_REQUEST_BODY = processing_mode.ProcessingMode(
    request_header_mode=processing_mode.ProcessingMode.SEND,
    response_header_mode=processing_mode.ProcessingMode.SEND,
    request_body_mode=processing_mode.ProcessingMode.BUFFERED,
    response_body_mode=processing_mode.ProcessingMode.BUFFERED,
    request_trailer_mode=processing_mode.ProcessingMode.SKIP,
    response_trailer_mode=processing_mode.ProcessingMode.SKIP,
)


@dataclass
class _Exchange:
    """What one stream has learned so far about its HTTP exchange."""

    route: Route | None = None
    request_id: str = ""
    caller: Caller | None = None
    identity_error: IdentityError | None = None
    fmt: ResponseFormat | None = None  # set while the response body must be filtered
    rewriter: RequestRewriter | None = None  # set when the request body is to be rewritten
    rewrite: RequestRewrite | None = None  # what the rewrite did, for the response side
    codings: tuple[str, ...] = ()  # the response body's content codings, as applied


class ExternalProcessorServicer(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, response_filter: ResponseFilter, *, max_body_bytes: int) -> None:
        """``max_body_bytes`` bounds a compressed body once decoded (Envoy bounds it as sent)."""
        self._filter = response_filter
        self._max_body_bytes = max_body_bytes

    async def Process(
        self,
        request_iterator: AsyncIterator[ext_proc.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        exchange = _Exchange()
        async for request in request_iterator:
            try:
                yield await self._handle(exchange, request)
            except Exception:
                # Never let a bug turn into "continue": answer with an error instead.
                log.exception("ext_proc message handling failed")
                yield immediate(500, b'{"error":"gate_internal_error"}', "retrieval_gate_error")
                return

    async def _handle(
        self, exchange: _Exchange, request: ext_proc.ProcessingRequest
    ) -> ext_proc.ProcessingResponse:
        if request.HasField("metadata_context") and exchange.caller is None:
            self._read_identity(exchange, request)
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return self._on_request_headers(exchange, request.request_headers)
        if kind == "response_headers":
            return self._on_response_headers(exchange, request.response_headers)
        if kind == "response_body":
            return await self._on_response_body(exchange, request.response_body)
        if kind == "request_body":
            return self._on_request_body(exchange, request.request_body)
        if kind == "request_trailers":
            return ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
        return ext_proc.ProcessingResponse(response_trailers=ext_proc.TrailersResponse())

    @staticmethod
    def _read_identity(exchange: _Exchange, request: ext_proc.ProcessingRequest) -> None:
        namespaces = request.metadata_context.filter_metadata
        if IDENTITY_NAMESPACE not in namespaces:
            return
        data = json_format.MessageToDict(namespaces[IDENTITY_NAMESPACE])
        try:
            exchange.caller = Caller.from_metadata(data)
        except IdentityError as exc:
            exchange.identity_error = exc

    def _on_request_headers(
        self, exchange: _Exchange, message: ext_proc.HttpHeaders
    ) -> ext_proc.ProcessingResponse:
        headers = header_dict(message.headers)
        path = headers.get(":path", "/").split("?", 1)[0]
        exchange.route = Route(method=headers.get(":method", "GET"), path=path)
        exchange.request_id = headers.get("x-request-id", "")
        if path_problem(path) is not None:
            # ext_authz refuses these already; never guess what such a path means.
            return immediate(400, b'{"error":"path_not_canonical"}', "retrieval_gate_bad_path")
        exchange.fmt = self._filter.format_for(exchange.route)
        mutation = ext_proc.HeaderMutation()
        if exchange.fmt is not None:
            if exchange.caller is None:
                # ext_authz should have refused already; without a verified caller
                # there is nobody to filter for, so nothing is served.
                error = exchange.identity_error
                log.warning("no caller identity on a search route (%s)", error or "no metadata")
                return immediate(401, b'{"error":"identity_missing"}', "retrieval_gate_no_identity")
            # A compressed body cannot be inspected, so ask upstream for identity encoding.
            mutation.remove_headers.append("accept-encoding")
            if not message.end_of_stream:
                exchange.rewriter = self._filter.rewriter_for(exchange.fmt, exchange.route)
        response = ext_proc.ProcessingResponse(
            request_headers=ext_proc.HeadersResponse(
                response=ext_proc.CommonResponse(header_mutation=mutation)
            )
        )
        if exchange.rewriter is not None:
            response.mode_override.CopyFrom(_WITH_REQUEST_BODY)
        return response

    def _on_request_body(
        self, exchange: _Exchange, message: ext_proc.HttpBody
    ) -> ext_proc.ProcessingResponse:
        rewriter, route, caller = exchange.rewriter, exchange.route, exchange.caller
        if rewriter is None or route is None or caller is None:
            return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())
        if not message.end_of_stream:
            log.error("request body arrived in parts; the gate needs it BUFFERED")
            return immediate(500, b'{"error":"gate_misconfigured"}', "retrieval_gate_not_buffered")
        try:
            rewrite = self._filter.rewrite_request(rewriter, route, caller, message.body)
        except MalformedRequest:
            return immediate(
                400, b'{"error":"request_body_malformed"}', "retrieval_gate_bad_request"
            )
        exchange.rewrite = rewrite
        common = ext_proc.CommonResponse(
            header_mutation=ext_proc.HeaderMutation(
                set_headers=set_headers({"content-length": str(len(rewrite.body))})
            )
        )
        common.body_mutation.body = rewrite.body
        return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(response=common))

    def _on_response_headers(
        self, exchange: _Exchange, message: ext_proc.HttpHeaders
    ) -> ext_proc.ProcessingResponse:
        headers = header_dict(message.headers)
        fmt = exchange.fmt
        status = headers.get(":status", "")
        if fmt is None or not status.startswith("2") or message.end_of_stream:
            # Not a search, or an upstream error: the client gets it untouched.
            self._filter.count_passthrough(fmt.name if fmt else "none")
            exchange.fmt = None
            return ext_proc.ProcessingResponse(
                response_headers=ext_proc.HeadersResponse(response=_CONTINUE),
                mode_override=_SKIP_BODY,
            )
        try:
            # The gate asked for no compression; an upstream that compresses anyway
            # gets its body decoded, and the filtered body goes out uncompressed.
            exchange.codings = parse_content_encoding(headers.get("content-encoding", ""))
        except UndecodableBody as exc:
            exchange.fmt = None
            return self._unreadable(
                exchange,
                fmt,
                str(exc),
                ext_proc.ProcessingResponse(
                    response_headers=ext_proc.HeadersResponse(response=_CONTINUE),
                    mode_override=_SKIP_BODY,
                ),
            )
        return ext_proc.ProcessingResponse(
            response_headers=ext_proc.HeadersResponse(response=_CONTINUE)
        )

    def _unreadable(
        self,
        exchange: _Exchange,
        fmt: ResponseFormat,
        why: str,
        passed: ext_proc.ProcessingResponse,
    ) -> ext_proc.ProcessingResponse:
        """The error answer for a body the gate cannot read, or ``passed`` in audit mode."""
        assert exchange.route is not None and exchange.caller is not None
        result = self._filter.reject_unreadable(
            fmt, exchange.route, exchange.caller, exchange.request_id, why
        )
        if result.status != 200:
            return immediate(result.status, result.body or b"", "retrieval_gate_unreadable")
        return passed

    async def _on_response_body(
        self, exchange: _Exchange, message: ext_proc.HttpBody
    ) -> ext_proc.ProcessingResponse:
        fmt, route, caller = exchange.fmt, exchange.route, exchange.caller
        if fmt is None or route is None:
            return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
        if caller is None:
            return immediate(401, b'{"error":"identity_missing"}', "retrieval_gate_no_identity")
        if not message.end_of_stream:
            # Only BUFFERED mode hands over the whole body; passing a part on
            # would let unfiltered chunks through.
            log.error("response body arrived in parts; configure response_body_mode BUFFERED")
            return immediate(500, b'{"error":"gate_misconfigured"}', "retrieval_gate_not_buffered")
        body = message.body
        if exchange.codings:
            try:
                body = decode(body, exchange.codings, self._max_body_bytes)
            except UndecodableBody as exc:
                return self._unreadable(
                    exchange,
                    fmt,
                    str(exc),
                    ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse()),
                )
        result = await self._filter.filter(
            fmt, route, caller, exchange.request_id, body, exchange.rewrite
        )
        answer = self._body_answer(result)
        if exchange.codings and result.body is not None:
            # The new body is not compressed; an untouched one keeps its coding.
            mutation = answer.response_body.response.header_mutation
            mutation.remove_headers.append("content-encoding")
        return answer

    @staticmethod
    def _body_answer(result: FilterResult) -> ext_proc.ProcessingResponse:
        if result.status != 200:
            response = immediate(
                result.status, result.body or b"", f"retrieval_gate_{result.outcome}"
            )
            response.immediate_response.headers.set_headers.extend(set_headers(result.headers))
            return response
        common = ext_proc.CommonResponse(
            header_mutation=ext_proc.HeaderMutation(set_headers=set_headers(result.headers))
        )
        if result.body is not None:
            common.body_mutation.body = result.body
            # Envoy keeps the upstream content-length and rejects a body of another length.
            common.header_mutation.set_headers.extend(
                set_headers({"content-length": str(len(result.body))})
            )
        return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse(response=common))
