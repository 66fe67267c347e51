"""Every error body the gate sends, built in one place.

A refusal tells the client what happened in a short machine-readable code and
nothing about data it may not see: no chunk text, no counts, no upstream error
text. The codes are part of the interface (docs/architecture.md, "Error
bodies"); identity providers, the request policy and the format adapters add
codes of their own (``token_expired``, ``generated_from_rejected_chunks``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import orjson

# Request path.
PATH_NOT_CANONICAL: Final = "path_not_canonical"
# HEAD or OPTIONS on a route that returns chunks: an existence and size oracle.
METHOD_NOT_ALLOWED: Final = "method_not_allowed"
IDENTITY_MISSING: Final = "identity_missing"
REQUEST_BODY_MALFORMED: Final = "request_body_malformed"
# A search the gate cannot restrict to the caller's tenant (formats say the same
# for what they find in a body: base.NOT_FILTERABLE).
REQUEST_NOT_FILTERABLE: Final = "request_not_filterable"
POLICY_ERROR: Final = "policy_error"  # the request policy could not be evaluated
FORBIDDEN: Final = "forbidden"  # the request policy refused; its reasons go along
# Response path.
REJECTED_CHUNKS: Final = "rejected_chunks"  # strict mode: a chunk was rejected
UPSTREAM_BODY_MALFORMED: Final = "upstream_body_malformed"
UPSTREAM_BODY_UNREADABLE: Final = "upstream_body_unreadable"
# More hits than ``max_hits``: deciding them would stall every other caller.
UPSTREAM_TOO_MANY_HITS: Final = "upstream_too_many_hits"
# A non-2xx upstream answer on a filtered route: its text can quote documents.
UPSTREAM_ERROR: Final = "upstream_error"
AUDIT_UNAVAILABLE: Final = "audit_unavailable"
# The gate itself.
GATE_INTERNAL_ERROR: Final = "gate_internal_error"
GATE_MISCONFIGURED: Final = "gate_misconfigured"


def error_body(code: str, *, decision_id: str | None = None, reasons: Sequence[str] = ()) -> bytes:
    """``{"error": code}``, with the decision id and the request policy's reasons when given."""
    document: dict[str, object] = {"error": code}
    if decision_id is not None:
        document["decision_id"] = decision_id
    if reasons:
        document["reasons"] = list(reasons)
    return orjson.dumps(document)
