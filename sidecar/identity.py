"""The caller: who is asking, as established from verified identity."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


class IdentityError(Exception):
    """Identity is missing or unusable; the request must not be served."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    principals: frozenset[str]

    def principals_digest(self) -> str:
        """SHA-256 of the sorted principal set, for audit records (no raw principals)."""
        joined = "\n".join(sorted(self.principals)).encode()
        return hashlib.sha256(joined).hexdigest()

    def to_metadata(self) -> dict[str, Any]:
        """The form carried in Envoy dynamic metadata from ext_authz to ext_proc."""
        return {"tenant": self.tenant, "principals": sorted(self.principals)}

    @classmethod
    def from_metadata(cls, data: Mapping[str, Any]) -> Caller:
        """Inverse of :meth:`to_metadata`; raises IdentityError on any defect."""
        tenant = data.get("tenant")
        principals = data.get("principals")
        if not isinstance(tenant, str) or not tenant:
            raise IdentityError("identity_missing", "identity metadata has no tenant")
        if not isinstance(principals, Iterable) or isinstance(principals, str | bytes):
            raise IdentityError("identity_missing", "identity metadata has no principals")
        names = frozenset(p for p in principals if isinstance(p, str) and p)
        return cls(tenant=tenant, principals=names)


class IdentityProvider(Protocol):
    """Turns request headers (as Envoy's ext_authz sees them) into a Caller."""

    @property
    def strip_headers(self) -> tuple[str, ...]:
        """Headers to remove before the request goes upstream."""
        ...

    def identify(self, headers: Mapping[str, str]) -> Caller:
        """Return the caller, or raise IdentityError (the request is refused)."""
        ...


TENANT_HEADER = "x-gate-tenant"
PRINCIPALS_HEADER = "x-gate-principals"


class TrustedHeaders:
    """Development only: believes ``x-gate-tenant`` and ``x-gate-principals``.

    Any client can set these headers, so this mode grants whatever the client
    claims. It exists to try the gate before an identity provider is wired in.
    """

    strip_headers: tuple[str, ...] = (TENANT_HEADER, PRINCIPALS_HEADER)

    def identify(self, headers: Mapping[str, str]) -> Caller:
        tenant = headers.get(TENANT_HEADER, "").strip()
        if not tenant:
            raise IdentityError("identity_missing", f"no {TENANT_HEADER} header")
        principals = frozenset(
            p.strip() for p in headers.get(PRINCIPALS_HEADER, "").split(",") if p.strip()
        )
        if not principals:
            raise IdentityError("identity_missing", f"no {PRINCIPALS_HEADER} header")
        return Caller(tenant=tenant, principals=principals)
