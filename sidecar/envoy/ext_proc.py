"""Envoy External Processing servicer: one processor per stream, one method per phase.

One gRPC stream per HTTP request. At the request headers the request path
(:class:`~sidecar.request.request_path.RequestPath`) plans the exchange, and
the plan's type picks the stream's processor: a refusal ends the stream, a
route whose answers the gate does not read ends it too, a gRPC call that
names its collections in its body gets a processor for that body alone, an
answer that names collections one that reads it as it passes, and a
filtered route gets one that hands the request body to the request path and
the response to :class:`~sidecar.enforcement.response_filter.ResponseFilter`.
This module only translates: Envoy's messages in, Envoy's answers out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc
from google.protobuf import json_format

from sidecar import refusals
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.envoy import grpc_body
from sidecar.envoy.messages import (
    header_dict,
    refusal_answer,
    request_headers_answer,
)
from sidecar.envoy.processing_modes import (
    FILTER_MODES,
    HEADERS_ONLY,
    READ_RESPONSE_BODY,
    REQUEST_BODY_ONLY,
)
from sidecar.envoy.processors import CollectionsReader, FilteringProcessor, NameReader, Processor
from sidecar.identity import AuthRequest
from sidecar.request.plans import PassThrough, ReadCollections, ReadNames, Refused
from sidecar.request.request_path import RequestPath
from sidecar.wire import ext_proc_pb2 as ext_proc
from sidecar.wire import ext_proc_pb2_grpc as ext_proc_grpc

log = logging.getLogger(__name__)

# Where Envoy puts the values of the filter's `request_attributes`, whatever
# the filter is named.
ATTRIBUTES_KEY = "envoy.filters.http.ext_proc"

_Answer = ext_proc.ProcessingResponse


class ExternalProcessorServicer(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(
        self,
        request_path: RequestPath,
        response_filter: ResponseFilter,
        *,
        max_body_bytes: int,
        ready: Callable[[], bool] | None = None,
    ) -> None:
        """``max_body_bytes`` bounds a compressed body once decoded (Envoy bounds it as sent).

        While ``ready()`` is false (the metadata store not reached since start)
        every stream is refused at its request headers: 503 ``metadata_unavailable``.
        """
        self._path = request_path
        self._filter = response_filter
        self._max_body_bytes = max_body_bytes
        self._ready = ready

    async def Process(
        self,
        request_iterator: AsyncIterator[ext_proc.ProcessingRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[ext_proc.ProcessingResponse]:
        processor: Processor | None = None
        grpc_call = False  # a gRPC client reads a refusal from grpc-status, never from a body
        async for request in request_iterator:
            kind = request.WhichOneof("request") or ""
            try:
                if kind == "request_headers":
                    headers = header_dict(request.request_headers.headers)
                    grpc_call = grpc_body.is_grpc(headers)
                    processor, answer = await self._open(request, headers, grpc_call)
                elif processor is None and not _local_reply(request):
                    # Admission happens on the request headers: an upstream answer on a
                    # stream without them (request_header_mode SKIP) was never admitted.
                    log.error("ext_proc stream without request headers; send them")
                    answer = refusal_answer(refusals.GATE_MISCONFIGURED, grpc=False)
                else:
                    if processor is None:  # Envoy's own answer: nothing of the upstream's
                        self._path.count_unread()
                        processor = Processor()
                    answer = await _phase(processor, kind, request)
            except Exception:
                # Never let a bug turn into "continue": answer with an error instead.
                log.exception("ext_proc message handling failed")
                yield refusal_answer(refusals.GATE_INTERNAL_ERROR, grpc=grpc_call)
                return
            yield answer
            if processor is None or processor.ends_after(kind, answer):
                return

    async def _open(
        self, request: ext_proc.ProcessingRequest, headers: dict[str, str], grpc_call: bool
    ) -> tuple[Processor | None, _Answer]:
        """Plan the exchange at its request headers: the stream's processor and the answer."""
        if self._ready is not None and not self._ready():
            return None, refusal_answer(refusals.METADATA_UNAVAILABLE, grpc=grpc_call)
        message = request.request_headers
        path, _, query_string = headers.get(":path", "/").partition("?")
        plan = await self._path.plan(
            AuthRequest(headers.get(":method", "GET"), path, headers, *_filter_context(request)),
            query_string=query_string,
            grpc=grpc_call,
            has_body=not message.end_of_stream,
        )
        if isinstance(plan, Refused):
            return None, refusal_answer(plan.refusal, grpc=grpc_call)
        if isinstance(plan, PassThrough):
            return None, request_headers_answer(plan.strip_headers, HEADERS_ONLY)
        if isinstance(plan, ReadCollections):
            encoding = headers.get("grpc-encoding", "")
            reader = CollectionsReader(self._path, plan, encoding, self._max_body_bytes)
            return reader, request_headers_answer(plan.strip_headers, REQUEST_BODY_ONLY)
        if isinstance(plan, ReadNames):
            # Asked uncompressed: the answer is read as it comes, never decoded.
            strip = (*plan.strip_headers, "accept-encoding")
            return NameReader(self._path, plan), request_headers_answer(strip, READ_RESPONSE_BODY)
        processor = FilteringProcessor(
            self._path,
            self._filter,
            plan,
            headers,
            grpc=grpc_call,
            max_body_bytes=self._max_body_bytes,
        )
        # Ask for an uncompressed answer; one that comes compressed anyway is decoded.
        strip = (*plan.strip_headers, "grpc-accept-encoding" if grpc_call else "accept-encoding")
        return processor, request_headers_answer(strip, FILTER_MODES[grpc_call, plan.reads_body])


async def _phase(processor: Processor, kind: str, request: ext_proc.ProcessingRequest) -> _Answer:
    """Hand one message after the request headers to its phase's method."""
    if kind == "request_body":
        return await processor.request_body(request.request_body)
    if kind == "response_headers":
        return await processor.response_headers(request.response_headers)
    if kind == "response_body":
        return await processor.response_body(request.response_body)
    if kind == "response_trailers":
        return processor.response_trailers(request.response_trailers)
    return _Answer(request_trailers=ext_proc.TrailersResponse())


def _filter_context(
    request: ext_proc.ProcessingRequest,
) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """The filter metadata (an ext_authz's caller, jwt_authn's payload) and Envoy's
    request attributes (``request_attributes``) sent with the request headers."""
    metadata = {
        name: json_format.MessageToDict(value)
        for name, value in request.metadata_context.filter_metadata.items()
    }
    attributes: dict[str, object] = {}
    if ATTRIBUTES_KEY in request.attributes:
        attributes = json_format.MessageToDict(request.attributes[ATTRIBUTES_KEY])
    return metadata, attributes


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
