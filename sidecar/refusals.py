"""Every refusal the gate answers with, and its statuses, in one table.

A refusal tells the client what happened in a short machine-readable code and
nothing about data it may not see: no chunk text, no counts, no upstream error
text. The codes and their statuses are part of the interface
(docs/architecture.md, "Error bodies", which a test checks against
``TABLE``). The request path and the response path return a :class:`Refusal`;
``sidecar.envoy`` turns it into Envoy's answer in one place, an HTTP status
and body or a gRPC status. Identity providers, the request policy and the
format adapters add codes of their own (``token_expired``,
``generated_from_rejected_chunks``, ...): :func:`identity_refusal` and
:func:`Refusal.with_code` give them the statuses of their kind.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

import orjson


class GrpcStatus(IntEnum):
    """The gRPC status codes the gate sends (grpc/doc/statuscodes.md).

    Clients retry some: pymilvus retries every status but DEADLINE_EXCEEDED,
    PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT, ALREADY_EXISTS,
    RESOURCE_EXHAUSTED and UNIMPLEMENTED, for minutes. So only an outage of
    what the gate depends on is UNAVAILABLE; anything else the gate refuses
    is a status no client retries, since asking again gets the same answer.
    """

    OK = 0
    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


_GRPC_FOR_HTTP = {
    400: GrpcStatus.INVALID_ARGUMENT,
    401: GrpcStatus.UNAUTHENTICATED,
    403: GrpcStatus.PERMISSION_DENIED,
    404: GrpcStatus.NOT_FOUND,
    405: GrpcStatus.UNIMPLEMENTED,
    413: GrpcStatus.RESOURCE_EXHAUSTED,
    503: GrpcStatus.UNAVAILABLE,
}


def grpc_status_for(http_status: int) -> GrpcStatus:
    """The gRPC status of an answer the gate would send with ``http_status``.

    A status without an equivalent is PERMISSION_DENIED: the gate releases
    nothing of the answer, and no client retries it (an upstream body the gate
    cannot read, a gate error: asking again gets the same refusal).
    """
    return _GRPC_FOR_HTTP.get(http_status, GrpcStatus.PERMISSION_DENIED)


@dataclass(frozen=True, slots=True)
class Refusal:
    """One way the gate refuses: its code, the HTTP status and the gRPC status it goes out as.

    ``reasons`` are the request policy's (``forbidden`` only). ``details`` is
    Envoy's response-code detail for access logs (``%RESPONSE_CODE_DETAILS%``).
    """

    code: str
    http_status: int
    grpc_status: GrpcStatus
    reasons: tuple[str, ...] = ()

    @property
    def details(self) -> str:
        """``retrieval_gate_<code>``: what Envoy's access log says answered the request."""
        return f"retrieval_gate_{self.code}"

    def body(self, decision_id: str | None = None) -> bytes:
        """The JSON error body: the code, the decision id and the policy's reasons when any."""
        return error_body(self.code, decision_id=decision_id, reasons=self.reasons)

    def with_code(self, code: str) -> Refusal:
        """The same statuses under an adapter's or a provider's own ``code``."""
        return replace(self, code=code)

    def with_reasons(self, reasons: Sequence[str]) -> Refusal:
        """The same refusal carrying the request policy's ``reasons``."""
        return replace(self, reasons=tuple(reasons))

    def at_status(self, http_status: int) -> Refusal:
        """The same code with another HTTP status (an upstream's own, kept for the client)."""
        return replace(self, http_status=http_status, grpc_status=grpc_status_for(http_status))


# Every refusal with a fixed status, for the documentation's table (checked by a test).
_FIXED: list[Refusal] = []


def _refusal(code: str, http_status: int, *, fixed: bool = True) -> Refusal:
    refusal = Refusal(code, http_status, grpc_status_for(http_status))
    if fixed:
        _FIXED.append(refusal)
    return refusal


# Request path.
PATH_NOT_CANONICAL = _refusal("path_not_canonical", 400)
# HEAD or OPTIONS on a route that returns chunks: an existence and size oracle.
METHOD_NOT_ALLOWED = _refusal("method_not_allowed", 405)
IDENTITY_MISSING = _refusal("identity_missing", 401)
# The identity provider cannot be reached: an outage, not the caller's fault.
JWKS_UNAVAILABLE = _refusal("jwks_unavailable", 503)
# The metadata store has not been reached since the gate started: nothing can be decided.
METADATA_UNAVAILABLE = _refusal("metadata_unavailable", 503)
REQUEST_BODY_MALFORMED = _refusal("request_body_malformed", 400)
# A search the gate cannot restrict to the caller's tenant (formats say the same
# for what they find in a body: formats.base.NOT_FILTERABLE).
REQUEST_NOT_FILTERABLE = _refusal("request_not_filterable", 400)
POLICY_ERROR = _refusal("policy_error", 403)  # the request policy could not be evaluated
FORBIDDEN = _refusal("forbidden", 403)  # the request policy refused; its reasons go along
# Response path.
REJECTED_CHUNKS = _refusal("rejected_chunks", 403)  # strict mode: a chunk was rejected
# An adapter's own code for a body it cannot release (``formats.base.Unreleasable``).
UNRELEASABLE = _refusal("unreleasable", 403, fixed=False)
UPSTREAM_BODY_MALFORMED = _refusal("upstream_body_malformed", 502)
UPSTREAM_BODY_UNREADABLE = _refusal("upstream_body_unreadable", 502)
# More hits than ``max_hits``: deciding them would stall every other caller.
UPSTREAM_TOO_MANY_HITS = _refusal("upstream_too_many_hits", 502)
# A non-2xx upstream answer on a filtered route: its text can quote documents.
# The client keeps the upstream's status (``at_status``); 502 when it has none.
UPSTREAM_ERROR = _refusal("upstream_error", 502, fixed=False)
# The database failed the search because the collection has no field named by
# ``tenant_key``, the field the gate pushed the tenant into: the gate's or the
# collection's configuration, which names no data (every caller of the
# collection gets it). 500: no client retries it (see GrpcStatus).
TENANT_FIELD_MISSING = _refusal("tenant_field_missing", 500)
AUDIT_UNAVAILABLE = _refusal("audit_unavailable", 500)
# The gate itself.
GATE_INTERNAL_ERROR = _refusal("gate_internal_error", 500)
GATE_MISCONFIGURED = _refusal("gate_misconfigured", 500)

TABLE: tuple[Refusal, ...] = tuple(_FIXED)


def identity_refusal(code: str, *, outage: bool) -> Refusal:
    """The refusal for an identity failure with ``code``: 401, or 503 for an ``outage``
    (the identity provider unreachable)."""
    return (JWKS_UNAVAILABLE if outage else IDENTITY_MISSING).with_code(code)


def code_of(refusal: Refusal | None) -> str | None:
    """``refusal``'s code, for spans, logs and audit records; None for no refusal."""
    return None if refusal is None else refusal.code


def error_body(code: str, *, decision_id: str | None = None, reasons: Sequence[str] = ()) -> bytes:
    """``{"error": code}``, with the decision id and the request policy's reasons when given."""
    document: dict[str, object] = {"error": code}
    if decision_id is not None:
        document["decision_id"] = decision_id
    if reasons:
        document["reasons"] = list(reasons)
    return orjson.dumps(document)
