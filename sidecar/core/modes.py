"""How a route is enforced: the mode, and the per-route policy resolved from settings."""

from __future__ import annotations

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
