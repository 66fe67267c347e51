"""Rejection reasons: a closed set, in evaluation order.

The values are Prometheus label values and audit-record fields, so they are part
of the public interface: add, never rename.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum


class Reason(StrEnum):
    MALFORMED_CHUNK = "MALFORMED_CHUNK"
    MISSING_METADATA = "MISSING_METADATA"
    METADATA_UNAVAILABLE = "METADATA_UNAVAILABLE"
    TENANT_MISMATCH = "TENANT_MISMATCH"
    PRINCIPAL_MISMATCH = "PRINCIPAL_MISMATCH"
    STATUS_DRAFT = "STATUS_DRAFT"
    STATUS_SUPERSEDED = "STATUS_SUPERSEDED"
    STATUS_REVOKED = "STATUS_REVOKED"
    STATUS_QUARANTINED = "STATUS_QUARANTINED"
    NOT_YET_EFFECTIVE = "NOT_YET_EFFECTIVE"
    EXPIRED = "EXPIRED"
    HASH_MISMATCH = "HASH_MISMATCH"
    PAYLOAD_HASH_MISMATCH = "PAYLOAD_HASH_MISMATCH"
    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    POLICY_DENY = "POLICY_DENY"
    POLICY_ERROR = "POLICY_ERROR"


BUILTIN_ORDER: tuple[str, ...] = tuple(reason.value for reason in Reason)

# Reasons that leave the caller's right to read the record proven (or are about
# the candidate, or the store, not a record): about the id sent (malformed, no
# such record), the store's availability, and the state and integrity of a
# record its tenant and principals may read. Any other reason leaves that right
# unproven: TENANT_MISMATCH and PRINCIPAL_MISMATCH deny it, POLICY_ERROR means
# the policy did not decide, and POLICY_DENY or an operator's custom reason may
# be about entitlement too.
READ_RIGHT_PROVEN: frozenset[str] = frozenset(
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


def may_read(reasons: Iterable[str]) -> bool:
    """True when none of ``reasons`` leaves the caller's right to the record unproven."""
    return all(reason in READ_RIGHT_PROVEN for reason in reasons)


class ReasonOrder:
    """Ranks built-in and operator-declared reasons.

    Declared custom reasons rank after ``SIGNATURE_MISSING`` and before
    ``POLICY_DENY``: they are policy verdicts, more specific than a bare deny.
    """

    def __init__(self, custom: Iterable[str] = ()) -> None:
        custom_list = [c for c in dict.fromkeys(custom) if c not in BUILTIN_ORDER]
        deny_at = BUILTIN_ORDER.index(Reason.POLICY_DENY)
        ordered = [*BUILTIN_ORDER[:deny_at], *custom_list, *BUILTIN_ORDER[deny_at:]]
        self._rank = {name: i for i, name in enumerate(ordered)}
        self.custom: frozenset[str] = frozenset(custom_list)

    def known(self, reason: str) -> bool:
        """True when ``reason`` may be used as a metric label value."""
        return reason in self._rank

    def sort(self, reasons: Iterable[str]) -> tuple[str, ...]:
        """Deduplicate and order reasons; the first one is the primary reason."""
        return tuple(sorted({str(r) for r in reasons}, key=self._rank.__getitem__))
