"""The caller: who is asking, as established from verified identity.

Identity providers (``sidecar.identity``) build a :class:`Caller` from what
Envoy verified; the decision core reads only this.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class IdentityError(Exception):
    """Identity is missing or unusable; the request must not be served.

    ``code`` is a short machine-readable reason (``token_expired``, ...) that
    the client sees in the 401 body; the message is for the sidecar's log.
    ``outage``: the identity provider could not be reached (503, not 401: an
    outage is not the caller's fault, and a client may retry it).
    """

    def __init__(self, code: str, message: str, *, outage: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.outage = outage


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    principals: frozenset[str]
    # Set from a verified scope (claim mapping's drafts_scope): may read drafts.
    drafts_allowed: bool = False

    def principals_digest(self) -> str:
        """SHA-256 of the sorted principal set, for audit records (no raw principals)."""
        joined = "\n".join(sorted(self.principals)).encode()
        return hashlib.sha256(joined).hexdigest()

    def to_document(self) -> dict[str, Any]:
        """The caller as a JSON object: what policies read as ``input.caller``, and
        what travels from an ext_authz check to the response path."""
        return {
            "tenant": self.tenant,
            "principals": sorted(self.principals),
            "drafts_allowed": self.drafts_allowed,
        }

    @classmethod
    def from_document(cls, data: Mapping[str, Any]) -> Caller:
        """Inverse of :meth:`to_document`; raises IdentityError on any defect."""
        tenant = data.get("tenant")
        principals = data.get("principals")
        if not isinstance(tenant, str) or not tenant:
            raise IdentityError("identity_missing", "caller document has no tenant")
        if not isinstance(principals, Iterable) or isinstance(principals, str | bytes):
            raise IdentityError("identity_missing", "caller document has no principals")
        names = frozenset(p for p in principals if isinstance(p, str) and p)
        return cls(
            tenant=tenant, principals=names, drafts_allowed=data.get("drafts_allowed") is True
        )
