"""Step one of a response: look every candidate up and let the decision core decide.

Also finds, when the route allows it, the successors that may take the place
of superseded chunks: each successor is decided like any candidate, so
nothing the caller may not read is ever substituted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision import Verdict
from sidecar.core.gate import Gate
from sidecar.core.hits import Candidate, Replacement
from sidecar.core.reasons import Reason
from sidecar.store.cache import CachedStore

# What may be wrong with a superseded chunk for its successor to take its place.
_SUBSTITUTABLE = frozenset({Reason.STATUS_SUPERSEDED, Reason.EXPIRED})


@dataclass(slots=True)
class Decided:
    """The verdict on a body's candidates, and the substitutes for some of their positions.

    Not frozen: one is built per response on the hot path, where a frozen
    dataclass costs about five times as much to construct.
    """

    verdict: Verdict
    replacements: Mapping[int, Replacement]
    # Positions that may go out: the admitted ones and the substituted ones.
    kept: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        self.kept = self.verdict.admitted_positions.union(self.replacements)


class Decider:
    """Looks candidates up in the (cached) store and asks the gate about them."""

    def __init__(self, store: CachedStore, gate: Gate, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._gate = gate
        self._clock = clock

    async def decide(
        self, caller: Caller, candidates: Sequence[Candidate], *, substitute: bool
    ) -> Decided:
        """One decision per candidate, at the time the store answered.

        With ``substitute``, also the admitted successors of superseded candidates.
        """
        ids = {c.chunk_id for c in candidates if c.chunk_id is not None and c.text is not None}
        lookup = await self._store.fetch_partial(ids)
        now = self._clock()
        verdict = self._gate.decide(caller, candidates, lookup.records, lookup.unavailable, now)
        replacements: dict[int, Replacement] = {}
        if substitute:
            replacements = await self._successors(caller, verdict, lookup.records, now)
        return Decided(verdict, replacements)

    async def _successors(
        self,
        caller: Caller,
        verdict: Verdict,
        records: Mapping[str, ChunkRecord],
        now: datetime,
    ) -> dict[int, Replacement]:
        """Successors that take the place of superseded chunks, where they pass every check.

        A chunk qualifies only when superseded (and perhaps expired with it) is
        all that is wrong with it; the successor's text comes from the store.
        """
        wanted: dict[int, str] = {}
        for decision in verdict.decisions:
            reasons = set(decision.reasons)
            if Reason.STATUS_SUPERSEDED not in reasons or not reasons <= _SUBSTITUTABLE:
                continue
            record = records.get(decision.chunk_id or "")
            if record is not None and record.superseded_by:
                wanted[decision.position] = record.superseded_by
        if not wanted:
            return {}
        lookup = await self._store.fetch_partial(set(wanted.values()))
        successors = [
            Candidate(position, chunk_id, lookup.records[chunk_id].text)
            for position, chunk_id in wanted.items()
            if chunk_id in lookup.records
        ]
        decided = self._gate.decide(caller, successors, lookup.records, lookup.unavailable, now)
        return {
            d.position: Replacement(d.chunk_id, text)
            for d, candidate in zip(decided.decisions, successors, strict=True)
            if d.admitted and d.chunk_id is not None and (text := candidate.text) is not None
        }
