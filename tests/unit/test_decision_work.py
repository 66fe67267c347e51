"""A record the caller may not read costs a decision what an id without a record costs.

Gate/Filter answers both as an unknown id; if one took more work than the
other, the reply's time would still say that the record exists (issue 27,
"Gate/Filter timing"). The decision core therefore evaluates the policy and
hashes the text for an id without a record, against a decoy, and classifies
drift only for records the caller may read. These tests count the work with
the real policy engine and the real hashing and drift code, spied on; the
time itself is measured by bench/gate_filter_timing.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sidecar.config import default_policy_dir
from sidecar.core import decision_core
from sidecar.core.caller import Caller
from sidecar.core.chunk_record import ChunkRecord
from sidecar.core.decision_core import DecisionCore
from sidecar.core.hits import Candidate
from sidecar.core.reasons import Reason
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.store import cache as cache_module
from sidecar.store.cache import CachedStore
from sidecar.store.loader import parse_record
from sidecar.store.open import open_store
from sidecar.store.rows import RowCodec
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ALICE = Caller("acme", frozenset({"user:alice", "group:qa"}))
REAL = RegorusEngine.from_directory(default_policy_dir())


class Counting:
    """The real policy engine, counting the chunks it evaluates."""

    version = REAL.version
    time_pure = REAL.time_pure
    remote = False

    def __init__(self) -> None:
        self.evaluated = 0

    def evaluate(self, policy_input: Mapping[str, Any]) -> Mapping[str, list[str]]:
        self.evaluated += len(policy_input["chunks"])
        result: Mapping[str, list[str]] = REAL.evaluate(policy_input)
        return result


class Work:
    """What one decision did: chunks evaluated, texts hashed, drift classifications."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = Counting()
        self.core = DecisionCore(self.engine)
        self.hashed = 0
        self.classified = 0
        for spied, counter in (("sha256", "hashed"), ("classify", "classified")):
            real = getattr(decision_core, spied)
            monkeypatch.setattr(decision_core, spied, self._counted(real, counter))

    def _counted(self, real: Callable[..., Any], name: str) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            setattr(self, name, getattr(self, name) + 1)
            return real(*args)

        return counted

    def of(self, candidates: list[Candidate], records: dict[str, ChunkRecord]) -> tuple[int, ...]:
        before = (self.engine.evaluated, self.hashed, self.classified)
        verdict = self.core.decide(ALICE, candidates, records, frozenset(), NOW)
        assert all(not d.admitted for d in verdict.decisions)
        after = (self.engine.evaluated, self.hashed, self.classified)
        return tuple(a - b for a, b in zip(after, before, strict=True))


IDS = [f"x-{n}" for n in range(5)]
WRONG_GUESS = "a wrong guess of the text"


def _records(**overrides: Any) -> dict[str, ChunkRecord]:
    # Each record holds its text, so a wrong guess could be classified as drift.
    return {i: parse_record(record_dict(i, text=text_for(i), **overrides)) for i in IDS}


CASES = {
    "another tenant's record": {"tenant_id": "globex"},
    "a record of the caller's tenant its principals may not read": {
        "allowed_principals": ["group:finance"]
    },
}


@pytest.mark.parametrize("overrides", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("text", ["right", "wrong"])
def test_an_unreadable_record_takes_the_work_of_an_unknown_id(
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, Any], text: str
) -> None:
    work = Work(monkeypatch)
    unreadable = _records(**overrides)
    sent = [
        Candidate(n, i, text_for(i) if text == "right" else WRONG_GUESS) for n, i in enumerate(IDS)
    ]
    unknown = [Candidate(n, f"nobody-{n}", c.text) for n, c in enumerate(sent)]
    # Cold (the verdict cache empty for these ids), then warm.
    for _ in range(2):
        assert work.of(sent, unreadable) == work.of(unknown, {})
    assert work.classified == 0


def test_drift_is_still_classified_for_a_record_the_caller_may_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The control: the spy sees classification where the caller is told the reason.
    work = Work(monkeypatch)
    sent = [Candidate(n, i, WRONG_GUESS) for n, i in enumerate(IDS)]
    verdict = work.core.decide(ALICE, sent, _records(), frozenset(), NOW)
    assert {d.reasons for d in verdict.decisions} == {(Reason.HASH_MISMATCH,)}
    assert all(d.drift is not None for d in verdict.decisions)
    assert work.classified == len(IDS)


def test_an_id_without_a_record_is_still_answered_as_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its decoy is evaluated, but whatever the policy says of it, the id is missing.
    work = Work(monkeypatch)
    verdict = work.core.decide(ALICE, [Candidate(0, "nobody", "text")], {}, frozenset(), NOW)
    assert [d.reasons for d in verdict.decisions] == [(Reason.MISSING_METADATA,)]
    assert work.engine.evaluated == 1


# The lookup before the decision: the metadata cache and the store's row decoding.


def test_a_found_record_and_a_known_absence_cost_the_cache_the_same(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []
    for name in ("__contains__", "__getitem__"):
        real = getattr(cache_module._BoundedCache, name)

        def spied(self: Any, key: str, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(self, key)

        monkeypatch.setattr(cache_module._BoundedCache, name, spied)
    store = open_store(new_sqlite_url(tmp_path / "gate.db"))
    store.upsert([parse_record(record_dict("x-1", tenant_id="globex"))])
    cached = CachedStore(store)
    asyncio.run(cached.fetch(["x-1", "nobody"]))  # both now cached
    counts = []
    for chunk_id in ("x-1", "nobody"):
        calls.clear()
        asyncio.run(cached.fetch([chunk_id]))
        counts.append(sorted(calls))
    assert counts[0] == counts[1]


def test_a_lookup_decodes_a_row_for_every_id_asked_found_or_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    decoded: list[object] = []
    real = RowCodec.decode

    def spied(self: RowCodec, row: Any) -> ChunkRecord:
        decoded.append(row[0])
        return real(self, row)

    monkeypatch.setattr(RowCodec, "decode", spied)
    store = open_store(new_sqlite_url(tmp_path / "gate.db"))
    store.upsert([parse_record(record_dict(i, tenant_id="globex")) for i in IDS])
    found = asyncio.run(store.fetch(IDS))
    assert len(decoded) == len(IDS)
    decoded.clear()
    missing = asyncio.run(store.fetch([f"nobody-{n}" for n in range(len(IDS))]))
    assert (len(found), len(missing)) == (len(IDS), 0)
    assert len(decoded) == len(IDS)  # decoys, decoded and dropped
