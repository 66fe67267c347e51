"""The interface every policy engine implements, and the input document it is given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord


class PolicyError(Exception):
    """The policy could not be loaded or evaluated.

    Callers deny: every affected chunk gets POLICY_ERROR, and a request whose
    request policy fails is refused.
    """


class PolicyEngine(Protocol):
    """A chunk policy engine, with the two capabilities callers plan around."""

    @property
    def version(self) -> str:
        """Identifies the loaded policy (a digest of its sources) for audit records."""
        ...

    @property
    def time_pure(self) -> bool:
        """True when the loaded policy declares that its verdicts may be cached per
        (caller, record) until the record's next validity boundary (policies/README.md,
        "Verdict cache"); False evaluates every chunk of every response."""
        ...

    @property
    def remote(self) -> bool:
        """True when ``evaluate`` waits on the network (an OPA server): callers then
        run it off their event loop."""
        ...

    def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
        """Evaluate the chunk policy once for a whole response.

        ``policy_input`` follows the contract in policies/README.md. Returns
        reasons per chunk id; an empty list admits the chunk. Raises PolicyError
        on any engine failure.
        """
        ...


class RequestPolicyEngine(Protocol):
    """The request policy (``policies/request.rego``): may this caller use this route?"""

    @property
    def version(self) -> str:
        """Changes whenever the policy's answers may change (sources, data, revision)."""
        ...

    @property
    def time_pure(self) -> bool:
        """True when the policy's answer depends only on its input and the policy, so
        that it may be kept per input and policy version."""
        ...

    @property
    def remote(self) -> bool:
        """True when ``evaluate`` waits on the network: callers run it off their loop."""
        ...

    def evaluate(self, request_input: Mapping[str, Any]) -> list[str]:
        """Reasons to refuse the request (empty: allowed); raises PolicyError."""
        ...


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)


# Rego engines hold numbers as 64-bit integers: a moment outside 1677-2262 would
# fail the whole batch's evaluation, so it is held at the nearest end, which
# keeps its order against any "now" the gate will see.
_NS_MIN, _NS_MAX = -(2**63), 2**63 - 1


def to_epoch_ns(moment: datetime) -> int:
    """Nanoseconds since the Unix epoch, exact to the microsecond (no float rounding),
    held within the 64-bit range (a validity boundary in 2999 stays in the future)."""
    return min(max((moment - _EPOCH) // _ONE_MICROSECOND * 1000, _NS_MIN), _NS_MAX)


def policy_input(caller: Caller, records: Sequence[ChunkRecord], now: datetime) -> dict[str, Any]:
    """Build the policy input document (contract in policies/README.md)."""
    return {
        "caller": caller.to_document(),
        "now_ns": to_epoch_ns(now),
        "chunks": [
            {
                "id": r.chunk_id,
                "doc_id": r.doc_id,
                "version": r.version,
                "tenant_id": r.tenant_id,
                "allowed_principals": list(r.allowed_principals),
                "status": r.status.value,
                "effective_at_ns": to_epoch_ns(r.effective_at),
                "expires_at_ns": None if r.expires_at is None else to_epoch_ns(r.expires_at),
                "requires_signature": r.requires_signature,
                "source_uri": r.source_uri,
            }
            for r in records
        ],
    }
