"""The decision core's answer: one decision per candidate, and the verdict for a response."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.drift import Drift


@dataclass(frozen=True, slots=True)
class ChunkDecision:
    """One candidate's decision. Its first reason is the primary one, counted in metrics."""

    position: int
    chunk_id: str | None
    reasons: tuple[str, ...]  # canonical order; empty means admitted
    # Why a chunk is MALFORMED_CHUNK, or that its record has no payload hash
    # (PAYLOAD_HASH_MISMATCH); never chunk text or field values.
    detail: str | None = None
    # What kind of difference a HASH_MISMATCH is (sidecar.core.drift), when the
    # record holds the authoritative text to compare with; else None.
    drift: Drift | None = None

    @property
    def admitted(self) -> bool:
        """True when nothing is wrong with the chunk."""
        return not self.reasons


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decisions for one response's candidates, in candidate order."""

    decisions: tuple[ChunkDecision, ...]
    policy_version: str
    policy_failed: bool
    # Unique records whose policy reasons came from the verdict cache / from Rego.
    verdicts_cached: int = 0
    verdicts_evaluated: int = 0

    @property
    def admitted_positions(self) -> frozenset[int]:
        """The body positions of the admitted candidates."""
        return frozenset(d.position for d in self.decisions if d.admitted)
