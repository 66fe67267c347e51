"""The gate's own gRPC service (``retrieval_gate.v1.Gate``), for applications outside a mesh.

Protocol translation only, like the Envoy servicers beside it. The caller
comes from the end user's credential in the call's metadata (``authorization:
Bearer <jwt>`` for identity ``jwt``), established by a
:class:`~sidecar.access.RequestAccess` with the configured identity provider
and request policy; no field of the request names a tenant or a principal.
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

from sidecar import refusals
from sidecar.access import AccessDenied, RequestAccess, RequestPolicyEvaluator
from sidecar.core.hits import Candidate, Route, RouteKind
from sidecar.core.reasons import Reason
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.envoy.grpc_status import GrpcCode, grpc_code_for
from sidecar.identity import AuthRequest, IdentityProvider
from sidecar.wire import gate_pb2, gate_pb2_grpc

log = logging.getLogger(__name__)

# The route the request policy, the route settings (mode) and the spans see.
GATE_ROUTE = Route("POST", "/retrieval_gate.v1.Gate/Filter")
# The metrics' and audit records' ``format``: one fixed value, never the client's.
GATE_FORMAT = "gate"
# Headers that carry the trace context (W3C), passed to the decision span.
_TRACE_HEADERS = ("traceparent", "tracestate")
_STATUS = {code.value[0]: code for code in grpc.StatusCode}

# What a caller may be told as decided: reasons about the candidate it sent (no
# id, no such record), about the store's availability, and about the state and
# integrity of a record its tenant and principals may read. Any other reason
# leaves the caller's right to the record unproven: TENANT_MISMATCH and
# PRINCIPAL_MISMATCH deny it, POLICY_ERROR means the policy did not decide, and
# POLICY_DENY or an operator's custom reason may be about entitlement too.
_TOLD: frozenset[str] = frozenset(
    reason.value
    for reason in (
        Reason.MALFORMED_CHUNK,
        Reason.MISSING_METADATA,
        Reason.METADATA_UNAVAILABLE,
        Reason.STATUS_DRAFT,
        Reason.STATUS_SUPERSEDED,
        Reason.STATUS_REVOKED,
        Reason.STATUS_QUARANTINED,
        Reason.NOT_YET_EFFECTIVE,
        Reason.EXPIRED,
        Reason.HASH_MISMATCH,
        Reason.PAYLOAD_HASH_MISMATCH,
        Reason.SIGNATURE_MISSING,
    )
)
_UNKNOWN_ID: tuple[str, ...] = (Reason.MISSING_METADATA.value,)


def gate_route_kind(route: Route) -> RouteKind | None:
    """The Filter call returns chunks the gate filters; nothing else is a route here."""
    return RouteKind.FILTERED if route == GATE_ROUTE else None


def gate_access(
    identity: IdentityProvider, request_policy: RequestPolicyEvaluator | None
) -> RequestAccess:
    """The request path of the Gate service: the sidecar's identity and request policy.

    A separate ``RequestAccess`` so that the Filter route is FILTERED for this
    service only: on the Envoy path no format reads that path's responses, and
    the request policy must not believe it filtered there.
    """
    return RequestAccess(identity, request_policy, route_kind=gate_route_kind, collections=_none)


def _none(route: Route) -> tuple[str, ...]:
    """The Filter path names no collection; the request's ``collection`` field does."""
    return ()


def _headers(context: grpc.aio.ServicerContext) -> dict[str, str]:
    """The call's text metadata, as lowercase headers (binary ``-bin`` entries dropped)."""
    headers: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if isinstance(value, str) and not key.endswith("-bin"):
            headers[key.lower()] = value
    return headers


def told_reasons(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """The reasons the caller is told for one candidate: as decided, or an unknown id's.

    A record the caller may not read is answered exactly as an id the store
    does not have (``MISSING_METADATA`` alone): that it exists, its status and
    validity, and whether the caller's text is its text (``HASH_MISMATCH``)
    would each leak what the gate withholds. All the reasons are replaced,
    not only the one that proves it: the others were computed from the record.
    """
    if all(reason in _TOLD for reason in reasons):
        return reasons
    return _UNKNOWN_ID


async def _abort(context: grpc.aio.ServicerContext, code: GrpcCode, message: str) -> NoReturn:
    """End the call with ``code``; ``message`` is the gate's short error body."""
    await context.abort(_STATUS[int(code)], message)
    raise AssertionError("grpc.aio's abort raises")


class GateServicer(gate_pb2_grpc.GateServicer):
    """``retrieval_gate.v1.Gate``: decisions on candidates an application already holds."""

    def __init__(self, response_filter: ResponseFilter, access: RequestAccess) -> None:
        """``access``: from :func:`gate_access`, so that the Filter route is known."""
        self._filter = response_filter
        self._access = access

    async def Filter(
        self, request: gate_pb2.FilterRequest, context: grpc.aio.ServicerContext
    ) -> gate_pb2.FilterResponse:
        headers = _headers(context)
        collection = request.collection or None
        try:
            admission = await self._access.admit(AuthRequest("POST", GATE_ROUTE.path, headers))
            caller = admission.caller
            assert caller is not None  # only OPEN_PROBES admit without a caller
            if collection is not None:
                self._access.check_body_collections(caller, GATE_ROUTE, [collection])
        except AccessDenied as exc:
            log.info("Gate/Filter refused: %s %s", exc.status, exc.code)
            self._filter.count_request_refusal(exc.status)
            await _abort(context, grpc_code_for(exc.status), exc.body().decode())
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
            trace_headers={k: headers[k] for k in _TRACE_HEADERS if k in headers},
        )
        if answer.status != 200:
            assert answer.code is not None
            body = refusals.error_body(answer.code, decision_id=answer.decision_id)
            await _abort(context, grpc_code_for(answer.status), body.decode())
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
