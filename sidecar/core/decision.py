"""The decision core's answer: one decision per candidate, and the verdict for a response."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChunkDecision:
    position: int
    chunk_id: str | None
    reasons: tuple[str, ...]  # canonical order; empty means admitted
    detail: str | None = None  # why a chunk is MALFORMED_CHUNK; never chunk text

    @property
    def admitted(self) -> bool:
        return not self.reasons

    @property
    def primary(self) -> str | None:
        """The first failing reason: the one counted in metrics."""
        return self.reasons[0] if self.reasons else None


@dataclass(frozen=True, slots=True)
class Verdict:
    decisions: tuple[ChunkDecision, ...]
    policy_version: str
    policy_failed: bool
    # Unique records whose policy reasons came from the verdict cache / from Rego.
    verdicts_cached: int = 0
    verdicts_evaluated: int = 0

    @property
    def admitted_positions(self) -> frozenset[int]:
        return frozenset(d.position for d in self.decisions if d.admitted)

    @property
    def admitted_count(self) -> int:
        return sum(1 for d in self.decisions if d.admitted)

    @property
    def rejected_count(self) -> int:
        return len(self.decisions) - self.admitted_count
