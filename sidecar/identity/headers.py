"""Development-only identity from request headers."""

from __future__ import annotations

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest

TENANT_HEADER = "x-gate-tenant"
PRINCIPALS_HEADER = "x-gate-principals"


class TrustedHeaders:
    """Believes ``x-gate-tenant`` and ``x-gate-principals`` (comma-separated).

    Any client can set these headers, so this mode grants whatever the client
    claims. It exists to try the gate before an identity provider is wired in.
    """

    strip_headers: tuple[str, ...] = (TENANT_HEADER, PRINCIPALS_HEADER)

    async def identify(self, request: AuthRequest) -> Caller:
        headers = request.headers
        tenant = headers.get(TENANT_HEADER, "").strip()
        if not tenant:
            raise IdentityError("identity_missing", f"no {TENANT_HEADER} header")
        principals = frozenset(
            p.strip() for p in headers.get(PRINCIPALS_HEADER, "").split(",") if p.strip()
        )
        if not principals:
            raise IdentityError("identity_missing", f"no {PRINCIPALS_HEADER} header")
        return Caller(tenant=tenant, principals=principals)
