"""From verified token claims to a Caller: which claim is the tenant, which give principals.

Error messages name claims but never quote their values: claim values are
often personal data (user ids, e-mail addresses, group names).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sidecar.core.caller import Caller, IdentityError

DEFAULT_PRINCIPAL_CLAIMS: Mapping[str, str] = {"sub": "user", "groups": "group", "roles": "role"}


def _default_principal_claims() -> dict[str, str]:
    return dict(DEFAULT_PRINCIPAL_CLAIMS)


@dataclass(frozen=True)
class ClaimMapping:
    """How a verified claim set becomes a :class:`Caller`.

    ``principal_claims`` maps a claim name to a principal prefix: a string claim
    gives one principal ``prefix:value``, a list claim one per string entry;
    claims of other types are ignored. ``drafts_scope``, when set, is the OAuth
    scope that allows the caller to read drafts; scopes are read from
    ``scope_claims`` as a space-separated string or a list.
    """

    tenant_claim: str = "tenant"
    principal_claims: Mapping[str, str] = field(default_factory=_default_principal_claims)
    drafts_scope: str | None = None
    scope_claims: tuple[str, ...] = ("scope", "scp")

    def __post_init__(self) -> None:
        if not self.tenant_claim:
            raise ValueError("claim mapping: the tenant claim name must not be empty")
        if not self.principal_claims:
            raise ValueError("claim mapping: at least one principal claim is required")
        if not all(name and prefix for name, prefix in self.principal_claims.items()):
            raise ValueError("claim mapping: principal claim names and prefixes must not be empty")

    def caller_from_claims(self, claims: Mapping[str, Any]) -> Caller:
        """Build the caller, or raise IdentityError (``tenant_missing``, ``principals_missing``)."""
        tenant = claims.get(self.tenant_claim)
        if not isinstance(tenant, str) or not tenant.strip():
            raise IdentityError(
                "tenant_missing", f"token has no usable tenant claim {self.tenant_claim!r}"
            )
        principals = frozenset(
            f"{prefix}:{value}"
            for claim, prefix in self.principal_claims.items()
            for value in _strings(claims.get(claim))
        )
        if not principals:
            raise IdentityError(
                "principals_missing",
                f"token has none of the principal claims {sorted(self.principal_claims)}",
            )
        return Caller(
            tenant=tenant, principals=principals, drafts_allowed=self._allows_drafts(claims)
        )

    def _allows_drafts(self, claims: Mapping[str, Any]) -> bool:
        if self.drafts_scope is None:
            return False
        return any(self.drafts_scope in _scopes(claims.get(name)) for name in self.scope_claims)


def _strings(value: Any) -> Iterator[str]:
    """The non-empty strings of a string or list claim; anything else gives none."""
    if isinstance(value, str):
        if value:
            yield value
    elif isinstance(value, list):
        yield from (entry for entry in value if isinstance(entry, str) and entry)


def _scopes(value: Any) -> set[str]:
    # OAuth's `scope` is one space-separated string; some issuers (Azure's `scp`
    # in some token versions, Okta) send a list instead.
    if isinstance(value, str):
        return set(value.split())
    return set(_strings(value))
