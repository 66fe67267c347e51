"""What the gate did with one response; label values, so add, never rename."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    """What became of one response (the ``outcome`` label of ``retrieval_gate_responses_total``)."""

    FILTERED = "filtered"
    ABSTAINED = "abstained"  # every candidate rejected: a valid, empty answer
    BLOCKED = "blocked"  # strict mode refused the whole response
    PASSTHROUGH = "passthrough"  # not inspected, or audit mode
    ERROR = "error"
