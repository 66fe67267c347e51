"""One stream's processor per plan, one method per phase of Envoy's ext_proc stream.

:class:`Processor` reads nothing (a route whose answers the gate does not
read, or Envoy's own reply); :class:`CollectionsReader` reads a gRPC call's
body for the collections it names; :class:`NameReader` reads an answer for
the names it gives collection ids; :class:`FilteringProcessor` hands the
request body to the request path and the response to the response path.
They translate Envoy's messages to those paths' calls and their results to
Envoy's answers; what to answer is the paths' decision.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Generic, TypeVar
from urllib.parse import unquote

from sidecar import refusals
from sidecar.enforcement.response_filter import FilterResult, ResponseFilter
from sidecar.envoy import grpc_body
from sidecar.envoy.content_encoding import UndecodableBody, decode, parse_content_encoding
from sidecar.envoy.messages import (
    body_answer,
    header_dict,
    headers_answer,
    kept_only,
    refusal_answer,
    set_headers,
)
from sidecar.envoy.processing_modes import SKIP_RESPONSE_BODY
from sidecar.formats.base import RequestRewrite
from sidecar.request.plans import Filter, ReadCollections, ReadNames, Refused
from sidecar.request.request_path import RequestPath
from sidecar.tracing import trace_context
from sidecar.wire import ext_proc_pb2 as ext_proc

log = logging.getLogger(__name__)

_Answer = ext_proc.ProcessingResponse
_BODY_UNCHANGED = _Answer(request_body=ext_proc.BodyResponse())
_RESPONSE_BODY_UNCHANGED = _Answer(response_body=ext_proc.BodyResponse())


class Processor:
    """What one stream does after its request headers: one method per phase.

    This base reads nothing: a stream Envoy ends at the request headers, or
    one that began with an answer Envoy wrote itself (an earlier filter's
    refusal never reaches this filter's request side).
    """

    grpc = False

    async def request_body(self, message: ext_proc.HttpBody) -> _Answer:
        return _BODY_UNCHANGED

    async def response_headers(self, message: ext_proc.HttpHeaders) -> _Answer:
        return headers_answer(ext_proc.CommonResponse(), skip_body=True)

    async def response_body(self, message: ext_proc.HttpBody) -> _Answer:
        return _RESPONSE_BODY_UNCHANGED

    def response_trailers(self, message: ext_proc.HttpTrailers) -> _Answer:
        return _Answer(response_trailers=ext_proc.TrailersResponse())

    def ends_after(self, kind: str, answer: _Answer) -> bool:
        """True when Envoy sends nothing more after ``answer`` to a ``kind`` message.

        The servicer then ends the stream itself (status OK). Left to Envoy,
        the stream would be cancelled after the last answer (an Envoy without
        the graceful close of ``sidecar.runtime.bootstrap.ENVOY_RUNTIME``),
        and grpcio's asyncio server leaks about 100 bytes of native memory per
        cancelled stream (grpc/grpc#43360). Ending it earlier than this would
        make Envoy skip the rest: a body unfiltered.
        """
        if answer.HasField("immediate_response") or kind == "response_trailers":
            return True
        if self.grpc:
            return False  # a gRPC answer's trailers come after its body
        if kind == "response_headers":
            # SKIP_RESPONSE_BODY equals an unset mode (NONE is 0): only a set one says "no body".
            return answer.HasField("mode_override") and answer.mode_override == SKIP_RESPONSE_BODY
        return kind == "response_body"


def _percent_encoded(message: bytes) -> str:
    """``message`` as a grpc-message value: printable ASCII but ``%`` as it is, the
    rest percent-encoded (gRPC's encoding of the header)."""
    return "".join(chr(b) if 0x20 <= b <= 0x7E and b != 0x25 else f"%{b:02X}" for b in message)


class NameReader(Processor):
    """A route whose successful answer says which names collection ids stand for: the
    answer is read for them (``RequestPath.learn_names``) and passed unchanged."""

    def __init__(self, path: RequestPath, plan: ReadNames) -> None:
        self._path, self._plan = path, plan

    async def response_headers(self, message: ext_proc.HttpHeaders) -> _Answer:
        status = header_dict(message.headers).get(":status", "")
        # An error, or an answer without a body (HEAD), describes no collection.
        described = status.startswith("2") and not message.end_of_stream
        return headers_answer(ext_proc.CommonResponse(), skip_body=not described)

    async def response_body(self, message: ext_proc.HttpBody) -> _Answer:
        # A part of a body over Envoy's buffer limit is not JSON to read; the rest
        # of it passes unread.
        if message.end_of_stream:
            await self._path.learn_names(self._plan, message.body)
        return _RESPONSE_BODY_UNCHANGED


PlanT = TypeVar("PlanT", ReadCollections, Filter)


class RequestBodyReader(Processor, Generic[PlanT]):
    """Reads a request body for the request path; the base for both that do."""

    def __init__(self, path: RequestPath, plan: PlanT, encoding: str, max_body_bytes: int) -> None:
        """``encoding``: how a gRPC request's compressed frames are compressed;
        ``max_body_bytes`` bounds a compressed body once decoded (Envoy bounds it as sent)."""
        self._path, self._encoding = path, encoding
        self._plan: PlanT = plan
        self._max_body_bytes = max_body_bytes

    async def _read(self, message: ext_proc.HttpBody) -> Refused | RequestRewrite | None:
        if not message.end_of_stream:
            log.error("request body arrived in parts; the gate needs it BUFFERED")
            return self._path.refused(refusals.GATE_MISCONFIGURED)
        body = message.body
        if self.grpc:
            try:
                body = grpc_body.uncompressed(body, self._encoding, self._max_body_bytes)
            except UndecodableBody:
                return self._path.refused(refusals.REQUEST_BODY_MALFORMED)
        return await self._path.read_body(self._plan, body)


class CollectionsReader(RequestBodyReader[ReadCollections]):
    """A route the gate does not filter whose request body it reads first: the
    collections a gRPC call names, what a REST body asks (``ReadCollections``)."""

    def __init__(
        self, path: RequestPath, plan: ReadCollections, encoding: str, max_body_bytes: int
    ) -> None:
        super().__init__(path, plan, encoding, max_body_bytes)
        self.grpc = plan.grpc

    async def request_body(self, message: ext_proc.HttpBody) -> _Answer:
        read = await self._read(message)
        if isinstance(read, Refused):
            return refusal_answer(read.refusal, grpc=self.grpc)
        return _BODY_UNCHANGED

    def ends_after(self, kind: str, answer: _Answer) -> bool:
        return kind == "request_body" or super().ends_after(kind, answer)


class FilteringProcessor(RequestBodyReader[Filter]):
    """A filtered route: the request body rewritten, the response decided and released."""

    def __init__(
        self,
        path: RequestPath,
        response_filter: ResponseFilter,
        plan: Filter,
        headers: dict[str, str],
        *,
        grpc: bool,
        max_body_bytes: int,
    ) -> None:
        super().__init__(path, plan, headers.get("grpc-encoding", ""), max_body_bytes)
        self._filter = response_filter
        self.grpc = grpc
        self._request_id = headers.get("x-request-id", "")
        self._trace_headers = trace_context(headers)
        self._rewrite: RequestRewrite | None = None
        self._codings: tuple[str, ...] = ()  # the response body's content codings
        self._response_encoding = ""  # a gRPC answer's grpc-encoding
        self._upstream_error: int | None = None  # set for a non-2xx answer to be replaced
        self._status = 200  # the answer's HTTP status, once its headers came

    async def request_body(self, message: ext_proc.HttpBody) -> _Answer:
        if not self._plan.reads_body:
            # The plan asked Envoy for no request body; one an operator's Envoy sends
            # anyway carries no query the gate rewrites.
            return _BODY_UNCHANGED
        read = await self._read(message)
        if isinstance(read, Refused):
            return refusal_answer(read.refusal, grpc=self.grpc)
        assert read is not None  # only ReadCollections leaves a body unchanged
        self._rewrite = read
        # gRPC frames carry their own lengths, and gRPC requests no content-length.
        length = {} if self.grpc else {"content-length": str(len(read.body))}
        return body_answer(read.body, length, request=True)

    async def response_headers(self, message: ext_proc.HttpHeaders) -> _Answer:
        headers = header_dict(message.headers)
        plan, has_body = self._plan, not message.end_of_stream
        status = headers.get(":status", "")
        if status.isdigit():
            self._status = int(status)
        # A trailers-only gRPC error: HTTP 200 with its grpc-status in the headers.
        grpc_error = headers.get("grpc-status", "0") if self.grpc else "0"
        start = self._filter.start(
            plan.fmt,
            plan.route,
            status=status,
            grpc=self.grpc,
            grpc_error=grpc_error,
            has_body=has_body,
        )
        self._upstream_error = start.upstream_error
        self._response_encoding = headers.get("grpc-encoding", "")
        if start.upstream_error is not None and status.startswith("2"):
            # A gRPC error. Its grpc-message (percent-encoded, as gRPC sends it) can
            # quote documents: it goes to the audit record.
            grpc_message = unquote(headers.get("grpc-message", ""))
            return self._upstream_answer(grpc_message.encode(), grpc_status=grpc_error)
        if start.upstream_error is not None and not has_body:
            return self._upstream_answer(b"")
        common = kept_only(headers, start.kept_headers)
        if not start.read_body:
            return headers_answer(common, skip_body=True)
        try:
            # The gate asked for no compression; an upstream that compresses anyway
            # gets its body decoded, and the filtered body goes out uncompressed.
            self._codings = parse_content_encoding(headers.get("content-encoding", ""))
        except UndecodableBody as exc:
            if start.upstream_error is None:
                return self._unreadable(str(exc), headers_answer(common, skip_body=True))
            self._codings = ()  # the audit record then keeps the body's bytes as they came
        return headers_answer(common, skip_body=False)

    async def response_body(self, message: ext_proc.HttpBody) -> _Answer:
        if not message.end_of_stream and not self.grpc:
            # Only BUFFERED mode hands over the whole body; passing a part on
            # would let unfiltered chunks through. (A gRPC body is followed by its
            # trailers, so it never ends the stream; its frames say where it ends.)
            log.error("response body arrived in parts; configure response_body_mode BUFFERED")
            return refusal_answer(refusals.GATE_MISCONFIGURED, grpc=self.grpc)
        try:
            body = await self._decoded(message.body)
        except UndecodableBody as exc:
            if self._upstream_error is None:
                return self._unreadable(str(exc), _RESPONSE_BODY_UNCHANGED)
            body = message.body  # for the audit record only
        if self._upstream_error is not None:
            return self._upstream_answer(body, passed=_RESPONSE_BODY_UNCHANGED)
        plan = self._plan
        result = await self._filter.filter(
            plan.fmt,
            plan.route,
            plan.caller,
            self._request_id,
            body,
            self._rewrite,
            self._trace_headers,
        )
        if result.refusal is not None and result.status != 200:
            return self._refused(result)
        # The new body is not compressed; an untouched one keeps its coding.
        removed = ["content-encoding"] if self._codings else []
        if self._response_encoding:
            removed.append("grpc-encoding")
        return body_answer(
            result.body, result.headers, request=False, grpc=self.grpc, remove=removed
        )

    def response_trailers(self, message: ext_proc.HttpTrailers) -> _Answer:
        trailers = header_dict(message.trailers)
        plan = self._plan
        kept = self._filter.kept_trailers(plan.route) if self.grpc else None
        replaced: dict[str, str] = {}
        grpc_error = trailers.get("grpc-status", "0") if self.grpc else "0"
        if grpc_error != "0":
            # A gRPC error after the response headers (not trailers-only).
            result = self._filter.trailers_error(
                plan.fmt,
                plan.route,
                plan.caller,
                self._request_id,
                self._status,
                grpc_error,
                unquote(trailers.get("grpc-message", "")).encode(),
                self._trace_headers,
                rewrite=self._rewrite,
            )
            if result is not None and result.body is not None and result.refusal is not None:
                status = (
                    result.refusal.grpc_status if result.grpc_status is None else result.grpc_status
                )
                replaced = {
                    "grpc-status": str(int(status)),
                    "grpc-message": _percent_encoded(result.body),
                }
        answer = ext_proc.TrailersResponse()
        if kept is not None:
            answer.header_mutation.remove_headers.extend(
                name for name in trailers if name not in kept and name not in replaced
            )
        answer.header_mutation.set_headers.extend(set_headers(replaced))
        return _Answer(response_trailers=answer)

    async def _decoded(self, body: bytes) -> bytes:
        """``body`` without its content codings (for gRPC, its frames decompressed);
        raises UndecodableBody. Decoding a compressed body runs in a thread: a large
        one must not stall every other stream."""
        limit = self._max_body_bytes
        if self.grpc and not self._codings:
            if self._response_encoding in ("", "identity"):
                return grpc_body.uncompressed(body, "", limit)
            return await asyncio.to_thread(
                grpc_body.uncompressed, body, self._response_encoding, limit
            )
        if not self._codings:
            return body
        return await asyncio.to_thread(decode, body, self._codings, limit)

    def _upstream_answer(
        self, body: bytes, grpc_status: str | None = None, passed: _Answer | None = None
    ) -> _Answer:
        """The gate's answer for an upstream error, or ``passed`` in audit mode.

        ``grpc_status``: a gRPC error's status as the upstream sent it, ``body``
        then being its message.
        """
        assert self._upstream_error is not None
        plan = self._plan
        result = self._filter.upstream_error(
            plan.fmt,
            plan.route,
            plan.caller,
            self._request_id,
            self._upstream_error,
            body,
            self._trace_headers,
            rewrite=self._rewrite,
            grpc_status=grpc_status,
        )
        if result.body is None:
            return passed or headers_answer(ext_proc.CommonResponse(), skip_body=True)
        return self._refused(result)

    def _unreadable(self, why: str, passed: _Answer) -> _Answer:
        """The answer for a body the gate cannot read, or ``passed`` in audit mode."""
        plan = self._plan
        result = self._filter.reject_unreadable(
            plan.fmt, plan.route, plan.caller, self._request_id, why, self._trace_headers
        )
        return passed if result.body is None else self._refused(result)

    def _refused(self, result: FilterResult) -> _Answer:
        assert result.refusal is not None
        return refusal_answer(
            result.refusal,
            grpc=self.grpc,
            body=result.body,
            headers=result.headers,
            grpc_status=result.grpc_status,
        )
