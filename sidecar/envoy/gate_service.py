"""The gate's own gRPC service (``retrieval_gate.v1.Gate``), for applications outside a mesh.

Protocol translation only, like the Envoy servicers beside it. The caller
comes from the end user's credential in the call's metadata (``authorization:
Bearer <jwt>`` for identity ``jwt``), established by a
:class:`~sidecar.request.admission.RequestAdmission` with the configured
identity provider and request policy; no field of the request names a tenant or a principal.
The candidates are decided, released and recorded by the same
:class:`~sidecar.enforcement.response_filter.ResponseFilter` as a search body
on the Envoy path: same policy, metrics and audit records. The audit record
keeps every reason; the caller is told them only for records it may read
(:func:`told_reasons`).
"""

from __future__ import annotations

import logging
from typing import NoReturn

import grpc

from sidecar.core.hits import Candidate
from sidecar.enforcement.candidates import told_reasons
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.identity import AuthRequest
from sidecar.refusals import Refusal
from sidecar.request.admission import RequestAdmission, RequestRefused
from sidecar.request.gate_route import GATE_ROUTE
from sidecar.tracing import trace_context
from sidecar.wire import gate_pb2, gate_pb2_grpc

log = logging.getLogger(__name__)

# The metrics' and audit records' ``format``: one fixed value, never the client's.
GATE_FORMAT = "gate"
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata, as lowercase headers (binary ``-bin`` entries dropped)."""
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str) and not key.endswith("-bin"):
            headers[key.lower()] = value
    return headers


async def _abort(
    context: grpc.aio.ServicerContext, refusal: Refusal, decision_id: str | None = None
) -> NoReturn:
    """End the call with ``refusal``'s gRPC status and its short error body as the message."""
    await context.abort(_STATUS[int(refusal.grpc_status)], refusal.body(decision_id).decode())
    raise AssertionError("grpc.aio's abort raises")


class GateServicer(gate_pb2_grpc.GateServicer):
    """``retrieval_gate.v1.Gate``: decisions on candidates an application already holds."""

    def __init__(self, response_filter: ResponseFilter, admission: RequestAdmission) -> None:
        """``admission``: from :func:`~sidecar.request.gate_route.gate_admission`, so that
        the Filter route is known."""
        self._filter = response_filter
        self._admission = admission

    async def Filter(
        self, request: gate_pb2.FilterRequest, context: grpc.aio.ServicerContext
    ) -> gate_pb2.FilterResponse:
        headers = _headers(context)
        collection = request.collection or None
        try:
            admitted = await self._admission.admit(AuthRequest("POST", GATE_ROUTE.path, headers))
            caller = admitted.caller
            assert caller is not None  # only OPEN_PROBES admit without a caller
            if collection is not None:
                await self._admission.check_collections(caller, GATE_ROUTE, [collection])
        except RequestRefused as exc:
            log.info("Gate/Filter refused: %s", exc.refusal.code)
            await _abort(context, exc.refusal)
        candidates = [
            # An empty id is no id: the gate rejects the candidate as MALFORMED_CHUNK.
            Candidate(position, sent.id or None, sent.text)
            for position, sent in enumerate(request.candidates)
        ]
        answer = await self._filter.decide_candidates(
            GATE_ROUTE,
            caller,
            headers.get("x-request-id", ""),
            candidates,
            format_name=GATE_FORMAT,
            collection=collection,
            trace_headers=trace_context(headers),
        )
        if answer.refusal is not None:
            await _abort(context, answer.refusal, answer.decision_id)
        return gate_pb2.FilterResponse(
            decision_id=answer.decision_id,
            decisions=[
                gate_pb2.CandidateDecision(
                    position=decision.position,
                    id=decision.chunk_id or "",
                    admitted=decision.position in answer.released,
                    reasons=list(told_reasons(decision.reasons)),
                )
                for decision in answer.decisions
            ],
        )
