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

from sidecar.core.answer_check import Claim
from sidecar.core.hits import Candidate
from sidecar.enforcement.answer_verification import (
    AnswerVerifier,
    VerificationFailed,
    VerificationRefused,
)
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
    """``retrieval_gate.v1.Gate``: decisions on candidates an application already holds,
    and verification of the answers made from them."""

    def __init__(
        self,
        response_filter: ResponseFilter,
        admission: RequestAdmission,
        verifier: AnswerVerifier | None = None,
    ) -> None:
        """``admission``: from :func:`~sidecar.request.gate_route.gate_admission`, so that
        the Filter route is known. ``verifier``: None when there is no audit trail
        to verify answers against (VerifyAnswer is then UNIMPLEMENTED)."""
        self._filter = response_filter
        self._admission = admission
        self._verifier = verifier

    async def VerifyAnswer(
        self, request: gate_pb2.VerifyAnswerRequest, context: grpc.aio.ServicerContext
    ) -> gate_pb2.VerifyAnswerResponse:
        headers = _headers(context)
        try:
            # The caller is admitted exactly as for Filter: who may retrieve may verify.
            admitted = await self._admission.admit(AuthRequest("POST", GATE_ROUTE.path, headers))
        except RequestRefused as exc:
            log.info("Gate/VerifyAnswer refused: %s", exc.refusal.code)
            await _abort(context, exc.refusal)
        caller = admitted.caller
        assert caller is not None  # only OPEN_PROBES admit without a caller
        if self._verifier is None:
            await context.abort(
                grpc.StatusCode.UNIMPLEMENTED, "no audit log configured: nothing to verify against"
            )
            raise AssertionError("grpc.aio's abort raises")
        claims = [Claim(tuple(c.chunk_ids), tuple(c.quotes)) for c in request.claims]
        try:
            verification = await self._verifier.verify(
                caller,
                headers.get("x-request-id", ""),
                list(request.decision_ids),
                claims,
                [(chunk.id, chunk.text) for chunk in request.chunks],
            )
        except VerificationRefused as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise AssertionError("grpc.aio's abort raises") from None
        except VerificationFailed as exc:
            await _abort(context, exc.refusal)
        check = verification.check
        return gate_pb2.VerifyAnswerResponse(
            verification_id=verification.verification_id,
            supported=check.supported,
            claims=[
                gate_pb2.ClaimVerdict(
                    position=position,
                    verdict=verdict.verdict.value,
                    chunk_id=verdict.chunk_id or "",
                    quote=verdict.quote,
                )
                for position, verdict in enumerate(check.claims)
            ],
            unknown_decision_ids=list(check.unknown_decisions),
        )

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
