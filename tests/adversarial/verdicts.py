"""Judging one run of a case, and the table of outcomes per case class.

A run breaks an invariant when anything of a tenant other than the sender's
reaches it (a cross-tenant release), when a forged or ambiguous identity is
admitted or reaches the database, when a valid one gets anything but what
the record contract admits for it, when the sender's credential or an
``x-gate-*`` header reaches the database, when the pushed-down tenant is not
the caller's, when a token makes the gate fetch a key URL, or when a bad
record is not rejected with its line, chunk and field named. Each breach is
one entry in ``problems``; a run passes when there is none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from sidecar.demo.upstream import SeenRequest
from sidecar.store.loader import RecordError, RecordsInvalid, quote_for_message
from tests.adversarial.model import ADMIT, REFUSE, HttpCase, RecordCase
from tests.adversarial.wire import RawResponse
from tests.adversarial.world import World, owns

REFUSED, ADMITTED = "refused", "admitted"
_RELEASED_KEYS = frozenset({"text", "chunk_id"})  # id_field and text_field; nothing else
_CREDENTIAL_HEADERS = frozenset({"authorization", "api-key"})


@dataclass
class Outcome:
    """What one run of one case did, and the invariants it broke."""

    case_id: str
    kind: str
    where: str
    what: str
    expect: str
    result: str  # REFUSED or ADMITTED
    status: int | None = None
    code: str | None = None
    released: list[int] = field(default_factory=list)
    expected: list[int] | None = None
    cross_tenant: int = 0
    problems: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def refusal(self) -> str:
        """How it was refused, for the table: status and code, or the field named."""
        return " ".join(str(part) for part in (self.status, self.code) if part is not None)


def judge_http(
    case: HttpCase,
    where: str,
    response: RawResponse | None,
    forwarded: Sequence[SeenRequest],
    key_fetches: int,
    world: World,
) -> Outcome:
    """The outcome of one case through one stack."""
    status = None if response is None else response.status
    outcome = Outcome(
        case.case_id,
        case.kind,
        where,
        case.what,
        case.expect,
        ADMITTED if status == 200 else REFUSED,
        status,
        code=_error_code(response) if response is not None else "connection closed",
    )
    problems = outcome.problems
    if status is not None and status >= 500:
        problems.append(f"gate or proxy failure {status} {outcome.code}")
    if key_fetches:
        problems.append(f"fetched a key URL named in a token ({key_fetches} times)")
    if status == 200 and response is not None:
        _judge_release(case, outcome, response.body, world)
        _judge_forwarded(case, outcome, forwarded)
    elif forwarded:
        problems.append("refused, yet the request reached the database")
    if case.expect == REFUSE and status == 200:
        problems.append("a forged, ambiguous or invalid identity was admitted")
    if case.expect == ADMIT and status != 200:
        problems.append(f"a valid identity was refused ({outcome.refusal})")
    return outcome


def _error_code(response: RawResponse) -> str | None:
    if response.status == 200:
        return None
    try:
        document = orjson.loads(response.body)
    except orjson.JSONDecodeError:
        return None
    code = document.get("error") if isinstance(document, dict) else None
    return code if isinstance(code, str) else None


def _judge_release(case: HttpCase, outcome: Outcome, body: bytes, world: World) -> None:
    try:
        hits = orjson.loads(body)["result"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        outcome.problems.append("an admission whose body is not a search answer")
        return
    count_released(outcome, hits, case.actors, [world])
    if case.tenant is None:
        return
    admissible = world.admissible(case.tenant, case.principals)
    compare_released(outcome, admissible, exact=case.expect == ADMIT)


def count_released(
    outcome: Outcome, hits: Iterable[Any], actors: Collection[str], worlds: Sequence[World]
) -> None:
    """Note the released point ids; count those whose content ``actors`` do not own.

    A hit whose id, chunk id or text is not what the database sent is counted
    too: its origin cannot be vouched for. ``worlds`` are the store states the
    gate may have decided on (more than one while its cache is stale).
    """
    records = [record for world in worlds for record in world.by_id().values()]
    for hit in hits:
        payload = hit.get("payload") or {}
        outcome.released.append(hit.get("id"))
        original = worlds[0].point(hit.get("id"))
        altered = original is None or (
            payload.get("chunk_id") != original.chunk_id or payload.get("text") != original.text
        )
        if altered or not owns(records, actors, payload.get("chunk_id"), payload.get("text")):
            outcome.cross_tenant += 1
        extra = set(payload) - _RELEASED_KEYS
        if extra:
            outcome.problems.append(f"released payload fields {sorted(extra)}")
    if outcome.cross_tenant:
        outcome.problems.append(f"{outcome.cross_tenant} cross-tenant release(s)")


def compare_released(outcome: Outcome, admissible: Collection[int], *, exact: bool) -> None:
    """Exactly ``admissible`` released (``exact``), or nothing beyond it."""
    outcome.expected = sorted(admissible)
    released = set(outcome.released)
    if exact and released != set(admissible):
        outcome.problems.append(
            f"released {sorted(released)}, the contract admits {sorted(admissible)}"
        )
    elif not released <= set(admissible):
        outcome.problems.append(
            f"released {sorted(released - set(admissible))} beyond the contract"
        )


def _judge_forwarded(case: HttpCase, outcome: Outcome, forwarded: Sequence[SeenRequest]) -> None:
    if len(forwarded) != 1:
        outcome.problems.append(f"{len(forwarded)} requests reached the database, not 1")
        return
    request = forwarded[0]
    leaked = sorted(
        name
        for name in request.headers
        if name in _CREDENTIAL_HEADERS or name.startswith("x-gate-")
    )
    if leaked:
        outcome.problems.append(f"headers {leaked} reached the database")
    gate_like = sorted(
        name for name in request.headers if "gate" in name.replace("_", "-") and name not in leaked
    )
    if gate_like:
        outcome.notes["gate_like_headers_forwarded"] = gate_like
    tenants = list(_pushed_tenants(orjson.loads(request.body or b"{}")))
    wanted = [case.tenant] if case.tenant is not None else None
    if wanted is not None and tenants != wanted:
        outcome.problems.append(f"pushed down {tenants!r}, not [{case.tenant!r}]")
    elif wanted is None and not set(tenants) <= case.actors:
        outcome.problems.append(f"pushed down {tenants!r}, outside the sender's tenants")


def _pushed_tenants(value: Any) -> Iterable[Any]:
    """The values of every Qdrant condition on the ``tenant`` key in a request body."""
    if isinstance(value, dict):
        if value.get("key") == "tenant" and isinstance(value.get("match"), dict):
            yield value["match"].get("value")
        for item in value.values():
            yield from _pushed_tenants(item)
    elif isinstance(value, list):
        for item in value:
            yield from _pushed_tenants(item)


def judge_records(
    case: RecordCase, loaded: int | None, error: RecordsInvalid | None, source: str
) -> Outcome:
    """The loader's answer to one file: ``loaded`` records, or ``error``."""
    outcome = Outcome(
        case.case_id,
        case.kind,
        "loader",
        case.what,
        case.expect,
        ADMITTED if error is None else REFUSED,
    )
    if error is None:
        outcome.code = f"{loaded} loaded"
        if case.expect == "reject":
            outcome.problems.append("a bad record was loaded")
        return outcome
    outcome.code = _named_fields(error.errors)
    if case.expect == "accept":
        outcome.problems.append(f"a valid file was refused: {error.errors[0]}")
        return outcome
    match = [e for e in error.errors if e.line == case.line and e.field == case.field]
    if not match:
        outcome.problems.append(
            f"no error names line {case.line} and field {case.field!r}: {_first(error.errors)}"
        )
        return outcome
    message = str(match[0])
    if not message.startswith(f"{source} line {case.line}"):
        outcome.problems.append("the message does not name the file and line")
    if case.field is not None and f"field {quote_for_message(case.field)}" not in message:
        outcome.problems.append("the message does not name the field")
    if case.chunk_id is not None and f"chunk {quote_for_message(case.chunk_id)}" not in message:
        outcome.problems.append("the message does not name the chunk")
    return outcome


def _named_fields(errors: Collection[RecordError]) -> str:
    fields = sorted({e.field or "(line)" for e in errors})
    return "field " + ", ".join(f[:24] for f in fields)


def _first(errors: Sequence[RecordError]) -> str:
    return str(errors[0])[:200] if errors else "(none)"


def table(outcomes: Sequence[Outcome]) -> str:
    """Markdown: per case class and where it ran, how the runs ended."""
    rows = [
        "| class | ran | cases | refused (by status/code) | admitted, own tenant only "
        "| cross-tenant releases | other failed invariants |",
        "|-|-|-|-|-|-|-|",
    ]
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.kind, outcome.where), []).append(outcome)
    for (kind, where), members in groups.items():
        refused = [o for o in members if o.result == REFUSED]
        codes = Counter(o.refusal or "(none)" for o in refused)
        shown = ", ".join(f"{code} {n}" for code, n in codes.most_common(4))
        if len(codes) > 4:
            shown += f", {len(codes) - 4} more kinds"
        own = sum(1 for o in members if o.result == ADMITTED and o.cross_tenant == 0)
        leaks = sum(o.cross_tenant for o in members)
        failed = sum(1 for o in members if o.problems and not o.cross_tenant)
        rows.append(
            f"| {kind} | {where} | {len(members)} | {len(refused)} ({shown}) | {own} "
            f"| {leaks} | {failed} |"
        )
    total = len(outcomes)
    leaks = sum(o.cross_tenant for o in outcomes)
    failed = sum(1 for o in outcomes if o.problems and not o.cross_tenant)
    rows.append(f"| **all** | | {total} | | | **{leaks}** | {failed} |")
    return "\n".join(rows)
