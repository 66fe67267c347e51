"""How a route is enforced: the mode, and the per-route policy resolved from settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class Mode(StrEnum):
    ENFORCE = "enforce"  # strip rejected chunks
    STRICT = "strict"  # any rejection fails the whole response with 403
    AUDIT = "audit"  # pass everything; count and log what would have been stripped


@dataclass(frozen=True)
class RoutePolicy:
    """What applies to one request path once the route overrides are resolved."""

    mode: Mode
    tenant_key: str | None  # None: no tenant filter is injected upstream
    overfetch_factor: float  # <= 1: no over-fetch
    substitute_superseded: bool  # replace a superseded chunk by its admitted successor
    # Upstream error bodies pass as written; False: the gate writes them.
    pass_upstream_errors: bool = False


# Route policies remembered per request path.
_POLICIES_KEPT = 4096


class RoutePolicies:
    """``route_policy(path)``, remembered per path (bounded), for both paths of a stream.

    Settings never change while the sidecar runs, and resolving the route
    overrides costs more than the rest of a small response's bookkeeping.
    """

    def __init__(self, route_policy: Callable[[str], RoutePolicy]) -> None:
        self._route_policy = route_policy
        self._policies: dict[str, RoutePolicy] = {}

    def for_path(self, path: str) -> RoutePolicy:
        """The policy of the longest route prefix ``path`` is under (see settings)."""
        policy = self._policies.get(path)
        if policy is None:
            if len(self._policies) >= _POLICIES_KEPT:
                self._policies.clear()  # paths are the client's: keep the memo bounded
            policy = self._policies[path] = self._route_policy(path)
        return policy
