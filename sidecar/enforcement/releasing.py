"""Step two of a response: what the client gets, by the route's mode.

``enforce`` sends the body rebuilt with the kept hits, ``strict`` refuses the
whole response when any hit was rejected, ``audit`` sends everything (trimmed
back to the asked-for size when the gate over-fetched). Every body that goes
out under enforce or strict is rendered by the adapter, even when nothing was
removed: some formats carry side structures computed beyond the returned hits
(Elasticsearch aggregations, Weaviate Aggregate) that never go out unfiltered.
Under both, a route that asks for one hit by id answers its rejection as the
absence of that hit (``AbsentAnswer``), never as a refusal that proves it exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sidecar import refusals
from sidecar.core.hits import Replacement
from sidecar.core.modes import Mode
from sidecar.core.outcome import Outcome
from sidecar.enforcement.deciding import Decided
from sidecar.formats.base import AbsentAnswer, MalformedBody, ParsedBody, Unreleasable
from sidecar.refusals import Refusal


@dataclass(slots=True)
class Released:
    """The answer for one decided body (not frozen: see ``deciding.Decided``).

    ``body`` None with status 200 passes the upstream body unchanged (audit
    mode); with another status (``refusal``'s) the client gets its error
    body, or ``body`` when set: the database's own answer for a missing hit
    (``AbsentAnswer``). ``positions`` are the hits the client gets, in
    body order.
    """

    outcome: Outcome
    status: int
    body: bytes | None
    positions: list[int]
    refusal: Refusal | None = None


def release(
    mode: Mode,
    parsed: ParsedBody,
    decided: Decided,
    limits: Sequence[int | None] | None,
) -> Released:
    """Apply ``mode`` to a decided body; raises MalformedBody when it cannot be rendered.

    The client may get fewer hits than were kept: over-fetch trims admitted
    hits beyond what was asked for, and an adapter drops a kept hit whose
    container went (an emptied group, a reference inside a removed hit). So
    the released positions come from the adapter, never from the verdict.
    """
    total = len(decided.verdict.decisions)
    kept = decided.kept
    replacements = decided.replacements
    try:
        if mode is Mode.AUDIT:
            # The database's answer as it is: an audit route is never over-fetched.
            return Released(Outcome.PASSTHROUGH, 200, None, list(range(total)))
        if len(kept) == total:
            return _rendered(Outcome.FILTERED, parsed, kept, limits, replacements)
        if mode is Mode.STRICT:
            _raise_if_absent(parsed, kept, limits, replacements)
            return _refused(Outcome.BLOCKED, refusals.REJECTED_CHUNKS)
        outcome = Outcome.FILTERED if kept else Outcome.ABSTAINED
        return _rendered(outcome, parsed, kept, limits, replacements)
    except Unreleasable as exc:
        # What is left would still carry what was removed (e.g. generated text).
        return _refused(Outcome.BLOCKED, refusals.UNRELEASABLE.with_code(exc.code))
    except AbsentAnswer as exc:
        # The one hit the route asks for was rejected: answered as a missing one
        # is, which on a filtered route is the gate's upstream_error answer.
        absent = refusals.UPSTREAM_ERROR.at_status(exc.status)
        return Released(Outcome.ABSTAINED, exc.status, exc.body, [], absent)


def _refused(outcome: Outcome, refusal: Refusal) -> Released:
    return Released(outcome, refusal.http_status, None, [], refusal)


def _raise_if_absent(
    parsed: ParsedBody,
    keep: frozenset[int],
    limits: Sequence[int | None] | None,
    replacements: Mapping[int, Replacement],
) -> None:
    """Raise AbsentAnswer where the route answers a rejected hit as a missing one.

    Strict mode renders nothing else: this is only to learn whether the route
    answers absence (a point fetched by id), where a 403 would say it exists.
    """
    with contextlib.suppress(Unreleasable, MalformedBody):
        parsed.render(keep, limits, replacements)


def _rendered(
    outcome: Outcome,
    parsed: ParsedBody,
    keep: frozenset[int],
    limits: Sequence[int | None] | None,
    replacements: Mapping[int, Replacement],
) -> Released:
    body = parsed.render(keep, limits, replacements)
    return Released(outcome, 200, body, parsed.released_positions(keep, limits))
