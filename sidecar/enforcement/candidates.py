"""Candidates that arrive without a database body: the gate's own service (``Gate/Filter``).

An application outside a mesh sends the chunks its retriever returned as a
list. They are decided, released and recorded exactly like the hits of a
search body (``ResponseFilter.decide_candidates``); only the body is missing,
so there is nothing to render: what goes out is the set of released positions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from sidecar.core.decision import ChunkDecision
from sidecar.core.hits import Candidate, Replacement


@dataclass(frozen=True, slots=True)
class CandidateList:
    """A ``ParsedBody`` of bare candidates: one sub-result, rendered as nothing."""

    candidates: Sequence[Candidate]

    def render(
        self,
        keep: Collection[int],
        limits: Sequence[int | None] | None = None,
        replacements: Mapping[int, Replacement] | None = None,
    ) -> bytes:
        """Nothing: the client gets decisions, not a body."""
        return b""

    def released_positions(
        self, keep: Collection[int], limits: Sequence[int | None] | None = None
    ) -> list[int]:
        """The kept positions, in request order (nothing is over-fetched here)."""
        return sorted(keep)


@dataclass(frozen=True, slots=True)
class CandidatesAnswer:
    """What became of a list of candidates.

    ``status`` 200: ``released`` holds the positions the client may use and
    ``decisions`` every candidate's decision. Any other status is a refusal
    with ``code`` (``sidecar.refusals``): strict mode with a rejected chunk,
    too many candidates, an audit record that could not be written.
    """

    decision_id: str
    status: int
    code: str | None
    decisions: tuple[ChunkDecision, ...] = ()
    released: frozenset[int] = frozenset()
