"""The route of the gate's own service (``retrieval_gate.v1.Gate/Filter``), as admission sees it.

Applications outside a mesh send candidates they already hold; the request
policy sees one route, which returns chunks the gate filters, and the
collection the request names.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.core.hits import Route, RouteKind
from sidecar.core.policy import RequestPolicyEngine
from sidecar.identity import IdentityProvider
from sidecar.request.admission import RequestAdmission

# The route the request policy, the route settings (mode) and the spans see.
GATE_ROUTE = Route("POST", "/retrieval_gate.v1.Gate/Filter")


def gate_route_kind(route: Route) -> RouteKind | None:
    """The Filter call returns chunks the gate filters; nothing else is a route here."""
    return RouteKind.FILTERED if route == GATE_ROUTE else None


def gate_admission(
    identity: IdentityProvider,
    request_policy: RequestPolicyEngine | None,
    count_refusal: Callable[[int], None],
) -> RequestAdmission:
    """The request path of the Gate service: the sidecar's identity and request policy.

    A separate admission so that the Filter route is FILTERED for this
    service only: on the Envoy path no format reads that path's responses, and
    the request policy must not believe it filtered there.
    """
    return RequestAdmission(
        identity,
        request_policy,
        route_kind=gate_route_kind,
        collections=_none,
        count_refusal=count_refusal,
    )


def _none(route: Route) -> tuple[str, ...]:
    """The Filter path names no collection; the request's ``collection`` field does."""
    return ()
