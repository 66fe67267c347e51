"""Step one of a response: look every candidate up and let the decision core decide.

A large body is looked up and decided in slices, with the event loop free to
serve other streams between them (see ``_LOOKUP_SLICE``). Also finds, when
the route allows it, the successors that may take the place of superseded
chunks: each successor is decided like any candidate, so nothing the caller
may not read is ever substituted. Each store lookup is a span when tracing is on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision import Verdict
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate, Replacement
from sidecar.core.reasons import Reason
from sidecar.store.cache import CachedStore, Lookup
from sidecar.tracing import NO_TRACING, Tracing

# A store lookup and a decision hold the event loop (the SQLite store and the
# metadata cache work on it; regorus keeps the GIL while it evaluates, so a
# thread would not free the loop either), so a large body is decided in slices
# with a turn for other streams after each. Measured on the 2-core build
# machine with every record present: a SQLite lookup costs about 29 us per id,
# and DecisionCore.decide 19 us per candidate in slices of 256 but 57 us in one batch
# of 4,096 (Rego's cost grows faster than the batch). So no slice holds the
# loop much past 5-30 ms, and responses of up to 256 hits take one of each.
_LOOKUP_SLICE = 1024
_DECIDE_SLICE = 256

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
    # The SHA-256 of the text the gate admitted at each kept position (the
    # record's, which the candidate's matched; a substitute's own record's):
    # the audit record keeps them, so that an answer's citations can be checked
    # against the very texts released (sidecar.core.answer_check).
    hashes: Mapping[int, str] = field(default_factory=dict)
    # Positions that may go out: the admitted ones and the substituted ones.
    kept: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        self.kept = self.verdict.admitted_positions.union(self.replacements)


class Decider:
    """Looks candidates up in the (cached) store and asks the gate about them."""

    def __init__(
        self,
        store: CachedStore,
        core: DecisionCore,
        clock: Callable[[], datetime],
        tracing: Tracing = NO_TRACING,
    ) -> None:
        self._store = store
        self._core = core
        self._clock = clock
        self._tracing = tracing

    async def decide(
        self, caller: Caller, candidates: Sequence[Candidate], *, substitute: bool
    ) -> Decided:
        """One decision per candidate, at the time the store answered.

        With ``substitute``, also the admitted successors of superseded candidates.
        """
        ids = {c.chunk_id for c in candidates if c.chunk_id is not None and c.text is not None}
        with self._tracing.lookup("candidates", len(ids)) as span:
            lookup = await self._lookup(ids)
            span.answered(len(lookup.records), len(lookup.unavailable))
        now = self._clock()
        verdict = await self._decide(caller, candidates, lookup, now)
        records = lookup.records
        hashes = {
            d.position: record.sha256
            for d in verdict.decisions
            if d.admitted and (record := records.get(d.chunk_id or "")) is not None
        }
        replacements: dict[int, Replacement] = {}
        if substitute:
            replacements = await self._successors(caller, verdict, records, now, hashes)
        return Decided(verdict, replacements, hashes)

    async def _lookup(self, ids: set[str]) -> Lookup:
        """``fetch_partial(ids)``, in slices of ``_LOOKUP_SLICE`` ids for a large body."""
        if len(ids) <= _LOOKUP_SLICE:
            return await self._store.fetch_partial(ids)
        ordered = list(ids)
        records: dict[str, ChunkRecord] = {}
        unavailable: set[str] = set()
        for start in range(0, len(ordered), _LOOKUP_SLICE):
            part = await self._store.fetch_partial(ordered[start : start + _LOOKUP_SLICE])
            records.update(part.records)
            unavailable.update(part.unavailable)
            await asyncio.sleep(0)  # let other streams' messages in
        return Lookup(records, frozenset(unavailable))

    async def _decide(
        self, caller: Caller, candidates: Sequence[Candidate], lookup: Lookup, now: datetime
    ) -> Verdict:
        """``DecisionCore.decide``, in slices of ``_DECIDE_SLICE`` candidates for a large body.

        Every slice is decided at the same ``now`` against the same lookup, so
        the verdict is the one a single call would give. The verdict-cache
        counts are per slice: a record repeated in two slices counts twice.
        """
        core = self._core
        if core.evaluates_remotely:
            # An OPA round trip: the loop must serve other streams while it waits
            # (no verdict cache is kept for such an engine, so a thread is safe).
            return await asyncio.to_thread(
                core.decide, caller, candidates, lookup.records, lookup.unavailable, now
            )
        if len(candidates) <= _DECIDE_SLICE:
            return core.decide(caller, candidates, lookup.records, lookup.unavailable, now)
        parts = []
        for start in range(0, len(candidates), _DECIDE_SLICE):
            part = candidates[start : start + _DECIDE_SLICE]
            parts.append(core.decide(caller, part, lookup.records, lookup.unavailable, now))
            await asyncio.sleep(0)
        return Verdict(
            decisions=tuple(d for part in parts for d in part.decisions),
            policy_version=parts[0].policy_version,
            policy_failed=any(part.policy_failed for part in parts),
            verdicts_cached=sum(part.verdicts_cached for part in parts),
            verdicts_evaluated=sum(part.verdicts_evaluated for part in parts),
        )

    async def _successors(
        self,
        caller: Caller,
        verdict: Verdict,
        records: Mapping[str, ChunkRecord],
        now: datetime,
        hashes: dict[int, str],
    ) -> dict[int, Replacement]:
        """Successors that take the place of superseded chunks, where they pass every check.

        A chunk qualifies only when superseded (and perhaps expired with it) is
        all that is wrong with it; the successor's text comes from the store.
        Each successor's record hash goes into ``hashes`` at its position.
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
        ids = set(wanted.values())
        with self._tracing.lookup("successors", len(ids)) as span:
            lookup = await self._store.fetch_partial(ids)
            span.answered(len(lookup.records), len(lookup.unavailable))
        successors = [
            Candidate(position, chunk_id, lookup.records[chunk_id].text)
            for position, chunk_id in wanted.items()
            if chunk_id in lookup.records
        ]
        decided = self._core.decide(caller, successors, lookup.records, lookup.unavailable, now)
        replacements: dict[int, Replacement] = {}
        for d, candidate in zip(decided.decisions, successors, strict=True):
            if d.admitted and d.chunk_id is not None and (text := candidate.text) is not None:
                replacements[d.position] = Replacement(d.chunk_id, text)
                hashes[d.position] = lookup.records[d.chunk_id].sha256
        return replacements
