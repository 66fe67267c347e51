"""Load with a judge: concurrent clients whose every answer is classified, and the audit check.

Shared by the fault matrix (bench/faults.py) and the soak (bench/soak.py).
The corpus behind the database stand-in has chunks the caller may read and
chunks it may not (another tenant's, a revoked one, one for another group),
whose texts carry the marker ``CANARY``. Each answer is one of:

* ``filtered``: a 200 the gate built (it carries a decision id) releasing
  exactly the chunks the caller may read;
* ``withheld``: the same, releasing fewer (failing closed, e.g. while the
  metadata store is down);
* ``refused``: any other status, or the connection failing, with no marker in it;
* ``unfiltered``: anything else: a marker anywhere, a chunk the caller may not
  read, a 200 that does not parse or that the gate did not build. Must be 0.

``read_audit_chains`` then lets a run check that every decision id a client received
is in an audit chain that verifies.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sidecar.audit.verify import verify_chain
from sidecar.core.integrity import canonical_sha256
from tests.fixtures import qdrant_bodies as qb
from tests.fixtures.records import record_dict, text_for

CANARY = b"CANARY"
SEARCH = "/collections/docs/points/search"
SEARCH_BODY = b'{"vector":[0.1,0.2,0.3,0.4],"limit":10}'
CALLER = {"x-gate-tenant": "acme", "x-gate-principals": "user:alice,group:qa"}
DECISION_HEADER = "x-retrieval-gate-decision-id"


def _forbidden_text(chunk_id: str) -> str:
    return f"CANARY text of chunk {chunk_id}, which the caller may not read."


# The caller's own: approved, its tenant, its group.
READABLE = [str(n) for n in range(1, 7)]
# Rejected for one reason each: the point of the exercise is that none leaks.
FORBIDDEN: dict[str, dict[str, Any]] = {
    "101": {"tenant_id": "globex"},
    "102": {"status": "revoked"},
    "103": {"allowed_principals": ["group:finance"]},
    "104": {"tenant_id": "initech", "allowed_principals": ["group:qa"]},
}


def records() -> list[dict[str, Any]]:
    """The metadata store's rows for the corpus."""
    rows = [record_dict(chunk_id) for chunk_id in READABLE]
    for chunk_id, overrides in FORBIDDEN.items():
        text = _forbidden_text(chunk_id)
        rows.append(record_dict(chunk_id, sha256=canonical_sha256(text), **overrides))
    return rows


def upstream_body() -> bytes:
    """What the database answers every search with: every chunk, readable or not."""
    points = [qb.point(int(c), text_for(c), score=0.9) for c in READABLE]
    points += [qb.point(int(c), _forbidden_text(c), score=0.8) for c in FORBIDDEN]
    # Interleaved, so a release that keeps a prefix is not accidentally right.
    points.sort(key=lambda p: p["id"] % 3)
    return qb.encode(qb.search_body(points))


READABLE_IDS = frozenset(int(c) for c in READABLE)


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's fate."""

    started: float  # time.monotonic()
    ended: float
    kind: str  # filtered | withheld | refused | unfiltered
    status: int  # 0: no HTTP answer (connection reset or closed)
    code: str  # the gate's error code, "envoy" for Envoy's own error, "connection"
    decision_id: str | None
    released: frozenset[int] = frozenset()  # the chunk ids a 200 carried


# What a request that started and ended at given times may get: (readable,
# optional). The optional ones may be released or not (a revocation on its
# way); the rest of ``readable`` must be, for a full release.
Expectation = Callable[[float, float], tuple[frozenset[int], frozenset[int]]]
NOTHING: frozenset[int] = frozenset()


def steady(started: float, ended: float) -> tuple[frozenset[int], frozenset[int]]:
    """The corpus as loaded: nothing changes while the load runs."""
    return READABLE_IDS, NOTHING


def judge(
    status: int,
    headers: dict[str, str],
    body: bytes,
    readable: frozenset[int] = READABLE_IDS,
    optional: frozenset[int] = NOTHING,
) -> tuple[str, str, frozenset[int]]:
    """(kind, code, released ids) of one answer."""
    if CANARY in body:
        return "unfiltered", "canary", NOTHING
    if status != 200:
        try:
            error = orjson.loads(body)
            code = str(error["error"]) if isinstance(error, dict) else "envoy"
        except (orjson.JSONDecodeError, KeyError):
            code = "envoy"
        return "refused", code, NOTHING
    if DECISION_HEADER not in headers:
        return "unfiltered", "no decision id", NOTHING
    try:
        ids = frozenset(hit["id"] for hit in orjson.loads(body)["result"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "unfiltered", "unparsable 200", NOTHING
    if not ids <= readable:
        return "unfiltered", "forbidden id", ids
    return ("filtered" if readable - optional <= ids else "withheld"), "", ids


@dataclass
class Load:
    """``clients`` threads searching through ``port`` until ``total`` requests were
    sent (None: until ``stop``).

    ``rate`` (requests per second across all clients, 0: as fast as possible)
    paces the soak. ``expect`` says what a request may get by when it started
    (revocations while the load runs).
    """

    port: int
    total: int | None = None
    clients: int = 8
    rate: float = 0.0
    expect: Expectation = steady
    answers: list[Answer] = field(default_factory=list)
    _issued: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stopped: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _started: float = 0.0

    def start(self) -> Load:
        self._started = time.monotonic()
        for _ in range(self.clients):
            thread = threading.Thread(target=self._client, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def done(self) -> int:
        """Answers in so far."""
        return len(self.answers)

    def stop(self) -> list[Answer]:
        """Send no more requests; return every answer once the last is in."""
        self._stopped.set()
        return self.wait()

    def wait(self, timeout: float = 3600.0) -> list[Answer]:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.answers

    def _next(self) -> int | None:
        with self._lock:
            if self._stopped.is_set() or (self.total is not None and self._issued >= self.total):
                return None
            self._issued += 1
            return self._issued

    def _client(self) -> None:
        connection: http.client.HTTPConnection | None = None
        headers = {"content-type": "application/json", **CALLER}
        while (number := self._next()) is not None:
            if self.rate:
                due = self._started + number / self.rate
                pause = due - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            started = time.monotonic()
            try:
                connection.request("POST", SEARCH, SEARCH_BODY, headers)
                response = connection.getresponse()
                body = response.read()
                got = {k.lower(): v for k, v in response.getheaders()}
                ended = time.monotonic()
                expected = self.expect(started, ended)
                kind, code, released = judge(response.status, got, body, *expected)
                answer = Answer(
                    started,
                    ended,
                    kind,
                    response.status,
                    code,
                    got.get(DECISION_HEADER),
                    released,
                )
                if response.will_close:
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException):
                if connection is not None:
                    connection.close()
                connection = None
                answer = Answer(started, time.monotonic(), "refused", 0, "connection", None)
            self.answers.append(answer)
        if connection is not None:
            connection.close()


@dataclass(frozen=True)
class AuditChains:
    """What the audit chains of a run hold."""

    chains: int
    records: int
    broken: list[str]  # chains that do not verify, with the first problem
    decision_ids: frozenset[str]  # of every record in a chain that verifies

    def lost(self, answers: Iterable[Answer]) -> int:
        """Decision ids a client received that no verified chain holds."""
        received = {a.decision_id for a in answers if a.decision_id is not None}
        return len(received - self.decision_ids)


def read_audit_chains(logs: Sequence[Path]) -> AuditChains:
    """Verify every JSON Lines audit chain in ``logs`` and collect their decision ids."""
    recorded: set[str] = set()
    broken = []
    count = 0
    for log in logs:
        report = verify_chain(log)
        if not report.ok:
            broken.append(f"{log.name}: {report.problem}")
            continue
        for line in log.read_bytes().splitlines():
            recorded.add(orjson.loads(line)["decision_id"])
            count += 1
    return AuditChains(len(logs), count, broken, frozenset(recorded))


def tally(answers: Iterable[Answer]) -> dict[str, Any]:
    """Counts by kind, refusals by (status, code)."""
    kinds: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    unfiltered: Counter[str] = Counter()
    for answer in answers:
        kinds[answer.kind] += 1
        if answer.kind == "refused":
            refusals[f"{answer.status or 'no answer'} {answer.code}"] += 1
        elif answer.kind == "unfiltered":
            unfiltered[answer.code] += 1
    return {
        "requests": sum(kinds.values()),
        "filtered": kinds["filtered"],
        "withheld": kinds["withheld"],
        "refused": kinds["refused"],
        "unfiltered": kinds["unfiltered"],
        "refusals": dict(refusals.most_common()),
        "unfiltered_by": dict(unfiltered),
    }
