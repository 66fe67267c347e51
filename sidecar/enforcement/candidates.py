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
from sidecar.core.reasons import Reason, may_read
from sidecar.formats.base import ReportedError
from sidecar.refusals import Refusal


@dataclass(frozen=True, slots=True)
class CandidateList:
    """A ``ParsedBody`` of bare candidates: one sub-result, rendered as nothing."""

    candidates: Sequence[Candidate]

    @property
    def reported_error(self) -> ReportedError | None:
        """None: no database answered; the application sent the candidates."""
        return None

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

    Without a ``refusal``, ``released`` holds the positions the client may
    use and ``decisions`` every candidate's decision. A refusal
    (``sidecar.refusals``) answers the whole call: strict mode with a rejected
    chunk, too many candidates, an audit record that could not be written.
    """

    decision_id: str
    refusal: Refusal | None
    decisions: tuple[ChunkDecision, ...] = ()
    released: frozenset[int] = frozenset()


_UNKNOWN_ID: tuple[str, ...] = (Reason.MISSING_METADATA.value,)


def told_reasons(reasons: tuple[str, ...]) -> tuple[str, ...]:
    """The reasons the caller is told for one candidate: as decided, or an unknown id's.

    A record the caller may not read is answered exactly as an id the store
    does not have (``MISSING_METADATA`` alone): that it exists, its status and
    validity, and whether the caller's text is its text (``HASH_MISMATCH``)
    would each leak what the gate withholds. All the reasons are replaced,
    not only the one that proves it: the others were computed from the record.
    """
    if may_read(reasons):
        return reasons
    return _UNKNOWN_ID
