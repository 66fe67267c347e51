"""Envoy External Processing servicer: the request path and the response path.

One gRPC stream per HTTP request. The request headers come first: the stream
establishes the caller (or reads the caller an ext_authz filter put in dynamic
metadata), asks the request policy, strips client identity headers and, for
routes whose responses it does not read, tells Envoy to send nothing more.
On search routes it then sees the response headers (status, encoding) and the
whole response body (BUFFERED). What to do with a body lives in
:class:`~sidecar.enforcement.response_filter.ResponseFilter`, who may call in
:class:`~sidecar.access.RequestAccess`; this module only translates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import grpc
from google.protobuf import json_format

from sidecar import refusals
from sidecar.access import AccessDenied, RequestAccess, path_problem
from sidecar.core.caller import Caller, IdentityError
from sidecar.core.hits import Route
from sidecar.core.modes import Mode, RoutePolicy
from sidecar.enforcement.response_filter import FilterResult, ResponseFilter
from sidecar.envoy import grpc_body
from sidecar.envoy.content_encoding import UndecodableBody, decode, parse_content_encoding
from sidecar.envoy.grpc_status import GrpcCode, as_grpc
from sidecar.envoy.messages import header_dict, immediate, set_headers
from sidecar.formats.base import (
    MalformedRequest,
    RequestRewrite,
    ResponseFormat,
    UnfilterableRequest,
)
from sidecar.identity import AuthRequest
from sidecar.tracing import trace_context
from sidecar.wire import envoy_processing_mode_pb2 as processing_mode
from sidecar.wire import ext_proc_pb2 as ext_proc
from sidecar.wire import ext_proc_pb2_grpc as ext_proc_grpc

log = logging.getLogger(__name__)

# Where an ext_authz filter in front (a mesh's, or the sidecar's own
# Authorization service) leaves the caller it established.
IDENTITY_NAMESPACE = "envoy.filters.http.ext_authz"
# Where Envoy puts the values of the filter's `request_attributes`, whatever
# the filter is named.
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"

_CONTINUE = ext_proc.CommonResponse()
# Sent with the response-headers answer for responses the gate will not read,
# so Envoy neither buffers nor sends their bodies (needs allow_mode_override).
_Mode = processing_mode.ProcessingMode
_SKIP_BODY = _Mode(response_body_mode=_Mode.NONE)


def _whole_mode(
    response_headers: _Mode.HeaderSendMode,
    bodies: _Mode.BodySendMode,
    *,
    request_body: _Mode.BodySendMode | None = None,
    response_trailers: _Mode.HeaderSendMode = _Mode.SKIP,
) -> processing_mode.ProcessingMode:
    """A mode override with every field spelled out: an override replaces the whole mode.

    ``request_body`` defaults to ``bodies``.
    """
    return _Mode(
        request_header_mode=_Mode.SEND,
        response_header_mode=response_headers,
        request_body_mode=bodies if request_body is None else request_body,
        response_body_mode=bodies,
        request_trailer_mode=_Mode.SKIP,
        response_trailer_mode=response_trailers,
    )


# What a non-2xx upstream status that cannot be kept becomes.
_BAD_GATEWAY = 502

# The upstream response headers a client of a filtered route gets (outside
# audit mode); every other one is removed. An allowlist, as for bodies: a header
# the gate does not know can describe unfiltered data (an ETag or a length over
# every tenant's hits, a database's timing or shard header). Envoy's own
# (server, x-envoy-*) and the gate's (x-retrieval-gate-*, set later) are not
# upstream headers.
RESPONSE_HEADERS_KEPT = frozenset(
    {
        # Clients pick their decoder by it (JSON, Elasticsearch's vendor type).
        "content-type",
        # Framing; the gate sets it to the length of the body it sends.
        "content-length",
        # An origin server must send it (RFC 9110, 6.6.1); it says only the time.
        "date",
        # elasticsearch-py refuses a 2xx answer without it; a constant, "Elasticsearch".
        "x-elastic-product",
    }
)

# A filtered gRPC answer also needs its response headers' counterpart: the
# trailers (grpc-status, and whatever else the server puts there).
GRPC_RESPONSE_HEADERS_KEPT = RESPONSE_HEADERS_KEPT | {"grpc-encoding"}
GRPC_TRAILERS_KEPT = frozenset({"grpc-status"})

# Sent with the request-headers answer on routes the gate does not filter: the
# stream ends there, one message for the whole request.
_NOTHING_MORE = _whole_mode(_Mode.SKIP, _Mode.NONE)
# Sent with the request-headers answer when the gate rewrites the query.
_WITH_REQUEST_BODY = _whole_mode(_Mode.SEND, _Mode.BUFFERED)
# The same for gRPC calls, whose trailers the gate reads too.
_GRPC_WITH_REQUEST_BODY = _whole_mode(_Mode.SEND, _Mode.BUFFERED, response_trailers=_Mode.SEND)
_GRPC_RESPONSE_ONLY = _whole_mode(
    _Mode.SEND, _Mode.BUFFERED, request_body=_Mode.NONE, response_trailers=_Mode.SEND
)
# A gRPC call the gate does not filter, whose body names its collections.
_REQUEST_BODY_ONLY = _whole_mode(_Mode.SKIP, _Mode.NONE, request_body=_Mode.BUFFERED)


@dataclass
class _Exchange:
    """What one stream has learned so far about its HTTP exchange."""

    route: Route | None = None
    request_id: str = ""
    caller: Caller | None = None
    identity_error: IdentityError | None = None  # ext_authz metadata that did not read
    metadata: dict[str, dict[str, object]] | None = None  # forwarded filter metadata
    attributes: dict[str, object] | None = None  # Envoy's request attributes (request_attributes)
    fmt: ResponseFormat | None = None  # set while the response body must be filtered
    rewriter: ResponseFormat | None = None  # set when the request body is to be rewritten
    rewrite: RequestRewrite | None = None  # what the rewrite did, for the response side
    codings: tuple[str, ...] = ()  # the response body's content codings, as applied
    upstream_status: int | None = None  # set for a non-2xx upstream answer to be replaced
    query_string: str = ""  # the request's URL parameters, as sent
    trace_headers: dict[str, str] | None = None  # traceparent, tracestate: the decision's parent
    grpc: bool = False  # a gRPC call: refusals are gRPC statuses, bodies are frames
    collections_only: bool = False  # the request body is read for its collections, not rewritten
    request_grpc_encoding: str = ""  # how the request's compressed frames are compressed
    grpc_encoding: str = ""  # the same for the response's


class ExternalProcessorServicer(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(
        self, response_filter: ResponseFilter, access: RequestAccess, *, max_body_bytes: int
    ) -> None:
        """``max_body_bytes`` bounds a compressed body once decoded (Envoy bounds it as sent)."""
        self._filter = response_filter
        self._access = access
        self._max_body_bytes = max_body_bytes

    async def Process(
        self,
        request_iterator: AsyncIterator[ext_proc.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        exchange = _Exchange()
        async for request in request_iterator:
            try:
                answer = await self._handle(exchange, request)
            except Exception:
                # Never let a bug turn into "continue": answer with an error instead.
                log.exception("ext_proc message handling failed")
                answer = _refuse(500, refusals.GATE_INTERNAL_ERROR, "retrieval_gate_error")
                yield as_grpc(answer) if exchange.grpc else answer
                return
            # A gRPC client reads a refusal from grpc-status, never from an HTTP body.
            yield as_grpc(answer) if exchange.grpc else answer
            if _last_answer(exchange, request.WhichOneof("request"), answer):
                return

    async def _handle(
        self, exchange: _Exchange, request: ext_proc.ProcessingRequest
    ) -> ext_proc.ProcessingResponse:
        if request.HasField("metadata_context") and exchange.metadata is None:
            self._read_metadata(exchange, request)
        if ATTRIBUTES_KEY in request.attributes and exchange.attributes is None:
            exchange.attributes = json_format.MessageToDict(request.attributes[ATTRIBUTES_KEY])
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return self._counted(await self._on_request_headers(exchange, request.request_headers))
        if exchange.route is None and not _local_reply(request):
            # Admission happens on the request headers: an upstream answer on a
            # stream without them (request_header_mode SKIP) was never admitted.
            log.error("ext_proc stream without request headers; send them (request_header_mode)")
            return _refuse(500, refusals.GATE_MISCONFIGURED, "retrieval_gate_no_headers")
        if kind == "response_headers":
            return self._on_response_headers(exchange, request.response_headers)
        if kind == "response_body":
            return await self._on_response_body(exchange, request.response_body)
        if kind == "request_body":
            return self._counted(self._on_request_body(exchange, request.request_body))
        if kind == "request_trailers":
            return ext_proc.ProcessingResponse(request_trailers=ext_proc.TrailersResponse())
        return self._on_response_trailers(exchange, request.response_trailers)

    def _counted(self, answer: ext_proc.ProcessingResponse) -> ext_proc.ProcessingResponse:
        """``answer``, with a refusal of the request (before the database) counted."""
        if answer.HasField("immediate_response"):
            self._filter.count_request_refusal(answer.immediate_response.status.code)
        return answer

    @staticmethod
    def _read_metadata(exchange: _Exchange, request: ext_proc.ProcessingRequest) -> None:
        namespaces = request.metadata_context.filter_metadata
        exchange.metadata = {
            name: json_format.MessageToDict(value) for name, value in namespaces.items()
        }
        if IDENTITY_NAMESPACE in exchange.metadata:
            try:
                exchange.caller = Caller.from_document(exchange.metadata[IDENTITY_NAMESPACE])
            except IdentityError as exc:
                exchange.identity_error = exc

    async def _on_request_headers(
        self, exchange: _Exchange, message: ext_proc.HttpHeaders
    ) -> ext_proc.ProcessingResponse:
        headers = header_dict(message.headers)
        path, _, exchange.query_string = headers.get(":path", "/").partition("?")
        exchange.route = Route(method=headers.get(":method", "GET"), path=path)
        exchange.request_id = headers.get("x-request-id", "")
        exchange.trace_headers = trace_context(headers)
        exchange.grpc = grpc_body.is_grpc(headers)
        exchange.request_grpc_encoding = headers.get("grpc-encoding", "")
        if path_problem(path) is not None:
            # Admission refuses these too; an ext_authz in front should have.
            return _refuse(400, refusals.PATH_NOT_CANONICAL, "retrieval_gate_bad_path")
        mutation = ext_proc.HeaderMutation()
        if exchange.identity_error is not None:
            # An ext_authz in front admitted the request but left no readable caller.
            log.warning("unreadable caller identity in metadata: %s", exchange.identity_error)
            return _refuse(401, refusals.IDENTITY_MISSING, "retrieval_gate_no_identity")
        if exchange.caller is None:
            # No ext_authz in front: the request is admitted here, before the upstream.
            try:
                admission = await self._access.admit(
                    AuthRequest(
                        exchange.route.method,
                        path,
                        headers,
                        exchange.metadata or {},
                        exchange.attributes or {},
                    )
                )
            except AccessDenied as exc:
                log.info("request refused: %s %s", exc.status, exc.code)
                return immediate(exc.status, exc.body(), f"retrieval_gate_{exc.code}")
            mutation.remove_headers.extend(admission.strip_headers)
            if admission.caller is None:
                # A probe that needs no caller (a gRPC health check): nothing to read.
                self._filter.count_passthrough("none")
                return _headers_answer_for_request(mutation)
            exchange.caller = admission.caller
        exchange.fmt = self._filter.format_for(exchange.route)
        if exchange.fmt is None:
            self._filter.count_passthrough("none")
            reader = self._filter.collections_reader(exchange.route) if exchange.grpc else None
            if reader is not None and not message.end_of_stream:
                # A gRPC path names no collection: the policy's check needs the body.
                exchange.rewriter, exchange.collections_only = reader, True
                return _headers_answer_for_request(mutation, _REQUEST_BODY_ONLY)
            return _headers_answer_for_request(mutation)
        problem = self._filter.request_problem(exchange.fmt, exchange.route, exchange.query_string)
        if problem is not None:
            log.info("request refused: %s", problem)
            return _refuse(400, refusals.REQUEST_NOT_FILTERABLE, "retrieval_gate_unfilterable")
        # Ask for an uncompressed body; one that comes compressed anyway is decoded.
        mutation.remove_headers.append(
            "grpc-accept-encoding" if exchange.grpc else "accept-encoding"
        )
        exchange.rewriter = self._filter.rewriter_for(exchange.fmt, exchange.route)
        if exchange.rewriter is not None and message.end_of_stream:
            if self._filter.pushes_down(exchange.route):
                # Envoy cannot add a body to a request that has none, and a search
                # without one (GET /_search) is a search of every tenant's documents.
                log.info("request refused: a search without a body on a push-down route")
                return _refuse(400, refusals.REQUEST_NOT_FILTERABLE, "retrieval_gate_no_body")
            exchange.rewriter = None
        response = ext_proc.ProcessingResponse(
            request_headers=ext_proc.HeadersResponse(
                response=ext_proc.CommonResponse(header_mutation=mutation)
            )
        )
        if exchange.grpc:
            with_body = exchange.rewriter is not None
            response.mode_override.CopyFrom(
                _GRPC_WITH_REQUEST_BODY if with_body else _GRPC_RESPONSE_ONLY
            )
        elif exchange.rewriter is not None:
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
            return _refuse(500, refusals.GATE_MISCONFIGURED, "retrieval_gate_not_buffered")
        body = message.body
        if exchange.grpc:
            try:
                body = grpc_body.uncompressed(
                    body, exchange.request_grpc_encoding, self._max_body_bytes
                )
            except UndecodableBody:
                return _refuse(400, refusals.REQUEST_BODY_MALFORMED, "retrieval_gate_bad_request")
        if exchange.collections_only:
            return self._check_collections_only(rewriter, route, caller, body)
        try:
            rewrite = self._filter.rewrite_request(
                rewriter, route, caller, body, exchange.query_string
            )
        except UnfilterableRequest as exc:
            log.info("request refused: %s", exc.code)
            return _refuse(400, exc.code, "retrieval_gate_unfilterable_request")
        except MalformedRequest:
            return _refuse(400, refusals.REQUEST_BODY_MALFORMED, "retrieval_gate_bad_request")
        except ValueError as exc:
            # Settings the format cannot use, e.g. a tenant_key that is no Milvus field name.
            log.error("requests on %s cannot be rewritten as configured: %s", route.path, exc)
            return _refuse(500, refusals.GATE_MISCONFIGURED, "retrieval_gate_misconfigured")
        try:
            # Collections the body names beyond the path pass the same ownership check.
            self._access.check_body_collections(caller, route, rewrite.collections)
        except AccessDenied as exc:
            log.info("request refused: %s %s", exc.status, exc.code)
            return immediate(exc.status, exc.body(), f"retrieval_gate_{exc.code}")
        exchange.rewrite = rewrite
        # gRPC frames carry their own lengths, and gRPC requests no content-length.
        length = {} if exchange.grpc else {"content-length": str(len(rewrite.body))}
        common = ext_proc.CommonResponse(
            header_mutation=ext_proc.HeaderMutation(set_headers=set_headers(length))
        )
        common.body_mutation.body = rewrite.body
        return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse(response=common))

    def _check_collections_only(
        self, reader: ResponseFormat, route: Route, caller: Caller, body: bytes
    ) -> ext_proc.ProcessingResponse:
        """Pass a request body unchanged once the collections it names passed the policy."""
        try:
            collections = self._filter.body_collections(reader, route, body)
            self._access.check_body_collections(caller, route, collections)
        except MalformedRequest:
            return _refuse(400, refusals.REQUEST_BODY_MALFORMED, "retrieval_gate_bad_request")
        except AccessDenied as exc:
            log.info("request refused: %s %s", exc.status, exc.code)
            return immediate(exc.status, exc.body(), f"retrieval_gate_{exc.code}")
        return ext_proc.ProcessingResponse(request_body=ext_proc.BodyResponse())

    def _on_response_headers(
        self, exchange: _Exchange, message: ext_proc.HttpHeaders
    ) -> ext_proc.ProcessingResponse:
        headers = header_dict(message.headers)
        fmt, route = exchange.fmt, exchange.route
        if fmt is None or route is None:
            # Envoy's own answer (a local reply): nothing of the upstream's.
            self._filter.count_passthrough("none")
            return _headers_answer(_CONTINUE, skip_body=True)
        policy = self._filter.policy_for(route)
        status = headers.get(":status", "")
        if not status.startswith("2"):
            return self._on_upstream_error(exchange, fmt, headers, message.end_of_stream, policy)
        if exchange.grpc and headers.get("grpc-status", "0") != "0":
            # A trailers-only gRPC error: its grpc-message can quote documents.
            return self._on_grpc_error(exchange, fmt, headers, policy)
        # Audit mode changes nothing the client gets; otherwise only allowlisted
        # upstream headers reach it.
        kept = GRPC_RESPONSE_HEADERS_KEPT if exchange.grpc else RESPONSE_HEADERS_KEPT
        common = _CONTINUE if policy.mode is Mode.AUDIT else _allowlisted(headers, kept)
        if message.end_of_stream:
            # An empty answer: no hits to filter.
            self._filter.count_passthrough(fmt.name, route)
            exchange.fmt = None
            return _headers_answer(common, skip_body=True)
        exchange.grpc_encoding = headers.get("grpc-encoding", "")
        try:
            # The gate asked for no compression; an upstream that compresses anyway
            # gets its body decoded, and the filtered body goes out uncompressed.
            exchange.codings = parse_content_encoding(headers.get("content-encoding", ""))
        except UndecodableBody as exc:
            exchange.fmt = None
            return self._unreadable(
                exchange, fmt, str(exc), _headers_answer(common, skip_body=True)
            )
        return _headers_answer(common, skip_body=False)

    def _on_upstream_error(
        self,
        exchange: _Exchange,
        fmt: ResponseFormat,
        headers: Mapping[str, str],
        end_of_stream: bool,
        policy: RoutePolicy,
    ) -> ext_proc.ProcessingResponse:
        """A non-2xx upstream answer on a filtered route: its body is read for the audit record.

        With ``pass_upstream_errors`` the route keeps the upstream's answer as
        it is, unread and counted as a pass.
        """
        if policy.pass_upstream_errors:
            self._filter.count_passthrough(fmt.name, exchange.route)
            exchange.fmt = None
            return _headers_answer(_CONTINUE, skip_body=True)
        status = headers.get(":status", "")
        exchange.upstream_status = int(status) if status.isdigit() else _BAD_GATEWAY
        if end_of_stream:
            passed = _headers_answer(_CONTINUE, skip_body=False)
            return self._upstream_error(exchange, fmt, b"", passed)
        try:
            exchange.codings = parse_content_encoding(headers.get("content-encoding", ""))
        except UndecodableBody:
            exchange.codings = ()  # the audit record then keeps the body's bytes as they came
        # The body is needed (buffered) for the audit record; the answer comes with it.
        return _headers_answer(_CONTINUE, skip_body=False)

    def _on_grpc_error(
        self,
        exchange: _Exchange,
        fmt: ResponseFormat,
        headers: Mapping[str, str],
        policy: RoutePolicy,
    ) -> ext_proc.ProcessingResponse:
        """A gRPC error status from the upstream: the client gets the status, the gate's message.

        The upstream's grpc-message goes to the audit record, like the text of
        an HTTP error; ``pass_upstream_errors`` passes it as it came.
        """
        if policy.pass_upstream_errors:
            self._filter.count_passthrough(fmt.name, exchange.route)
            exchange.fmt = None
            return _headers_answer(_CONTINUE, skip_body=True)
        code = headers.get("grpc-status", "")
        exchange.upstream_status = _BAD_GATEWAY
        text = f"grpc-status {code}: {headers.get('grpc-message', '')}".encode()
        passed = _headers_answer(_CONTINUE, skip_body=True)
        answer = self._upstream_error(exchange, fmt, text, passed)
        if answer.HasField("immediate_response"):
            # The client keeps the upstream's status (its retry logic reads it).
            grpc_code = int(code) if code.isdigit() and 0 < int(code) < 17 else GrpcCode.UNAVAILABLE
            answer.immediate_response.grpc_status.status = grpc_code
        return answer

    def _upstream_error(
        self,
        exchange: _Exchange,
        fmt: ResponseFormat,
        body: bytes,
        passed: ext_proc.ProcessingResponse,
    ) -> ext_proc.ProcessingResponse:
        """The gate's answer for an upstream error, or ``passed`` in audit mode."""
        assert exchange.route is not None and exchange.caller is not None
        assert exchange.upstream_status is not None
        result = self._filter.upstream_error(
            fmt,
            exchange.route,
            exchange.caller,
            exchange.request_id,
            exchange.upstream_status,
            body,
            exchange.trace_headers,
        )
        if result.body is None:
            return passed
        # Only a final status can answer; an interim (1xx) one should never come here.
        if not 300 <= result.status <= 599:
            result.status = _BAD_GATEWAY
        return _immediate(result, "retrieval_gate_upstream_error")

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
            fmt, exchange.route, exchange.caller, exchange.request_id, why, exchange.trace_headers
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
            # Every admitted request has a caller; this stream skipped its headers.
            return _refuse(401, refusals.IDENTITY_MISSING, "retrieval_gate_no_identity")
        if not message.end_of_stream and not exchange.grpc:
            # Only BUFFERED mode hands over the whole body; passing a part on
            # would let unfiltered chunks through. (A gRPC body is followed by its
            # trailers, so it never ends the stream; its frames say where it ends.)
            log.error("response body arrived in parts; configure response_body_mode BUFFERED")
            return _refuse(500, refusals.GATE_MISCONFIGURED, "retrieval_gate_not_buffered")
        passed = ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse())
        if exchange.upstream_status is not None:
            try:
                body = await self._decoded(exchange, message.body)
            except UndecodableBody:
                body = message.body  # for the audit record only
            return self._upstream_error(exchange, fmt, body, passed)
        try:
            body = await self._decoded(exchange, message.body)
        except UndecodableBody as exc:
            return self._unreadable(exchange, fmt, str(exc), passed)
        result = await self._filter.filter(
            fmt, route, caller, exchange.request_id, body, exchange.rewrite, exchange.trace_headers
        )
        answer = self._body_answer(result, grpc=exchange.grpc)
        if result.body is not None:
            # The new body is not compressed; an untouched one keeps its coding.
            mutation = answer.response_body.response.header_mutation
            if exchange.codings:
                mutation.remove_headers.append("content-encoding")
            if exchange.grpc_encoding:
                mutation.remove_headers.append("grpc-encoding")
        return answer

    async def _decoded(self, exchange: _Exchange, body: bytes) -> bytes:
        """``body`` without its content codings (for gRPC, its frames decompressed);
        raises UndecodableBody."""
        if exchange.grpc and not exchange.codings:
            if exchange.grpc_encoding in ("", "identity"):
                # Nothing can be compressed: only the framing is checked, on the loop.
                return grpc_body.uncompressed(body, "", self._max_body_bytes)
            return await asyncio.to_thread(
                grpc_body.uncompressed, body, exchange.grpc_encoding, self._max_body_bytes
            )
        if not exchange.codings:
            return body
        # In a thread: decoding a large body must not stall every other stream.
        return await asyncio.to_thread(decode, body, exchange.codings, self._max_body_bytes)

    def _on_response_trailers(
        self, exchange: _Exchange, message: ext_proc.HttpTrailers
    ) -> ext_proc.ProcessingResponse:
        """A filtered gRPC answer's trailers: only grpc-status reaches the client.

        Trailers are metadata the server chose to send after the messages (a
        grpc-message, rich error details, a database's own counters); like
        response headers, what the gate does not know is removed.
        """
        answer = ext_proc.TrailersResponse()
        if exchange.grpc and exchange.route is not None:
            policy = self._filter.policy_for(exchange.route)
            if policy.mode is not Mode.AUDIT:
                names = header_dict(message.trailers)
                answer.header_mutation.remove_headers.extend(
                    name for name in names if name not in GRPC_TRAILERS_KEPT
                )
        return ext_proc.ProcessingResponse(response_trailers=answer)

    @staticmethod
    def _body_answer(result: FilterResult, *, grpc: bool) -> ext_proc.ProcessingResponse:
        if result.status != 200:
            return _immediate(result, f"retrieval_gate_{result.outcome}")
        common = ext_proc.CommonResponse(
            header_mutation=ext_proc.HeaderMutation(set_headers=set_headers(result.headers))
        )
        if result.body is not None:
            common.body_mutation.body = result.body
            if not grpc:
                # Envoy keeps the upstream content-length and rejects a body of
                # another length (gRPC answers have none: frames carry lengths).
                common.header_mutation.set_headers.extend(
                    set_headers({"content-length": str(len(result.body))})
                )
        return ext_proc.ProcessingResponse(response_body=ext_proc.BodyResponse(response=common))


def _immediate(result: FilterResult, details: str) -> ext_proc.ProcessingResponse:
    """``result`` (not a 200) as the whole answer: its status, body and gate headers."""
    response = immediate(result.status, result.body or b"", details)
    response.immediate_response.headers.set_headers.extend(set_headers(result.headers))
    return response


def _headers_answer(
    common: ext_proc.CommonResponse, skip_body: bool
) -> ext_proc.ProcessingResponse:
    """The response-headers answer; ``skip_body``: Envoy neither buffers nor sends the body."""
    answer = ext_proc.ProcessingResponse(response_headers=ext_proc.HeadersResponse(response=common))
    if skip_body:
        answer.mode_override.CopyFrom(_SKIP_BODY)
    return answer


def _last_answer(
    exchange: _Exchange, kind: str | None, answer: ext_proc.ProcessingResponse
) -> bool:
    """True when Envoy sends nothing more on this stream after ``answer`` to a ``kind`` message.

    The servicer then ends the stream itself (status OK). Left to Envoy, the
    stream would be cancelled after the last answer (an Envoy without the
    graceful close of ``sidecar.runtime.bootstrap.ENVOY_RUNTIME``), and
    grpcio's asyncio server leaks about 100 bytes of native memory per
    cancelled stream (grpc/grpc#43360): 2.3 MiB a minute at 340 requests/s in
    the soak. Ending it earlier than this would make Envoy skip the rest: a
    body unfiltered.
    """
    if answer.HasField("immediate_response") or kind == "response_trailers":
        return True
    overridden = answer.HasField("mode_override")
    if kind == "request_headers" and overridden and answer.mode_override == _NOTHING_MORE:
        return True  # a route whose answer the gate does not read
    if kind == "request_body" and exchange.collections_only:
        return True  # _REQUEST_BODY_ONLY: the collections were all it needed
    if exchange.grpc:
        return False  # a gRPC answer's trailers come after its body
    if kind == "response_headers":
        # _SKIP_BODY equals an unset mode (NONE is 0): only a set one says "no body".
        return overridden and answer.mode_override == _SKIP_BODY
    return kind == "response_body"


def _headers_answer_for_request(
    mutation: ext_proc.HeaderMutation, mode: processing_mode.ProcessingMode = _NOTHING_MORE
) -> ext_proc.ProcessingResponse:
    """The request-headers answer of a route whose answer the gate does not read."""
    return ext_proc.ProcessingResponse(
        request_headers=ext_proc.HeadersResponse(
            response=ext_proc.CommonResponse(header_mutation=mutation)
        ),
        mode_override=mode,
    )


def _allowlisted(headers: Mapping[str, str], kept: frozenset[str]) -> ext_proc.CommonResponse:
    """Remove every upstream response header that is not in ``kept``."""
    removed = [
        name
        for name in headers
        if name not in kept and not name.startswith(":")  # pseudo-headers stay
    ]
    return ext_proc.CommonResponse(header_mutation=ext_proc.HeaderMutation(remove_headers=removed))


def _local_reply(request: ext_proc.ProcessingRequest) -> bool:
    """True for the response headers of an error Envoy answered itself.

    An earlier filter's refusal (a mesh's ext_authz, a rejected path) never
    reached this filter's request side, so its stream starts with the
    response; those are never 2xx and never carry upstream content.
    """
    if request.WhichOneof("request") != "response_headers":
        return False
    headers = header_dict(request.response_headers.headers)
    # A gRPC error Envoy answers itself is HTTP 200 with a grpc-status.
    return not headers.get(":status", "").startswith("2") or headers.get("grpc-status", "0") != "0"


def _refuse(status: int, code: str, details: str) -> ext_proc.ProcessingResponse:
    """An immediate error answer with the gate's error body (``sidecar.refusals``)."""
    return immediate(status, refusals.error_body(code), details)
