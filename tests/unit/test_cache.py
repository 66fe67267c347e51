"""The TTL cache in front of a metadata store, with a fake clock (no sleeping)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Mapping
from dataclasses import replace

import pytest

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.cache import CachedStore, Lookup
from sidecar.store.preview import preview_load
from sidecar.store.sqlite import SqliteStore
from sidecar.store.store import LoadPreview, StoreUnavailable
from tests.fixtures.records import chunk_record as record

TTL = 30.0
NEGATIVE_TTL = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStore:
    """An inner store that records every lookup and can be made to fail."""

    def __init__(self, *records: ChunkRecord) -> None:
        self.records = {r.chunk_id: r for r in records}
        self.lookups: list[list[str]] = []
        self.failing = False
        self.closed = False

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        self.lookups.append(sorted(chunk_ids))
        if self.failing:
            raise StoreUnavailable("connection refused")
        return {i: self.records[i] for i in chunk_ids if i in self.records}

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        batch = list(records)
        self.records.update((r.chunk_id, r) for r in batch)
        return len(batch)

    def preview(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> LoadPreview:
        approved = [r for r in self.records.values() if r.status is Status.APPROVED]
        return preview_load(records, stored=self.records, approved=approved, reinstate=reinstate)

    def get(self, chunk_id: str) -> ChunkRecord | None:
        return self.records.get(chunk_id)

    def set_status(
        self, chunk_id: str, status: Status, superseded_by: str | None = None
    ) -> ChunkRecord:
        changed = replace(self.records[chunk_id], status=status, superseded_by=superseded_by)
        self.records[chunk_id] = changed
        return changed

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.close()


class CountingObserver:
    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.store_errors = 0
        self.latencies: list[float] = []
        self.evictions = 0
        self.invalidations = 0
        self.clears = 0
        self.stale = 0
        self.watched: list[bool] = []

    def hit(self, n: int) -> None:
        self.hits += n

    def miss(self, n: int) -> None:
        self.misses += n

    def store_error(self) -> None:
        self.store_errors += 1

    def store_latency(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def evicted(self, n: int) -> None:
        self.evictions += n

    def invalidated(self, n: int) -> None:
        self.invalidations += n

    def cleared(self) -> None:
        self.clears += 1

    def watching(self, seen: bool) -> None:
        self.watched.append(seen)

    def stale_served(self, n: int) -> None:
        self.stale += n


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def inner() -> FakeStore:
    return FakeStore(record("a"), record("b"))


@pytest.fixture
def observer() -> CountingObserver:
    return CountingObserver()


@pytest.fixture
def cache(inner: FakeStore, clock: FakeClock, observer: CountingObserver) -> CachedStore:
    return CachedStore(inner, ttl=TTL, negative_ttl=NEGATIVE_TTL, observer=observer, timer=clock)


def fetch(cache: CachedStore, ids: Collection[str]) -> Mapping[str, ChunkRecord]:
    return asyncio.run(cache.fetch(ids))


def fetch_partial(cache: CachedStore, ids: Collection[str]) -> Lookup:
    return asyncio.run(cache.fetch_partial(ids))


def test_misses_go_to_the_store_in_one_call_and_hits_do_not(
    cache: CachedStore, inner: FakeStore, observer: CountingObserver
) -> None:
    assert fetch(cache, ["a"]) == {"a": record("a")}
    assert fetch(cache, ["a", "b", "x"]) == {"a": record("a"), "b": record("b")}
    assert inner.lookups == [["a"], ["b", "x"]]
    assert fetch(cache, ["a", "b", "x", "a"]) == {"a": record("a"), "b": record("b")}
    assert inner.lookups == [["a"], ["b", "x"]]
    assert (observer.hits, observer.misses) == (1 + 3, 1 + 2)


def test_absent_ids_are_cached_for_the_shorter_negative_ttl(
    cache: CachedStore, inner: FakeStore, clock: FakeClock
) -> None:
    fetch(cache, ["a", "x"])
    clock.now += NEGATIVE_TTL - 0.1
    assert fetch(cache, ["a", "x"]) == {"a": record("a")}
    assert inner.lookups == [["a", "x"]]
    inner.records["x"] = record("x")  # loaded meanwhile
    clock.now += 0.2  # negative entry expired, positive one not
    assert fetch(cache, ["a", "x"]) == {"a": record("a"), "x": record("x")}
    assert inner.lookups == [["a", "x"], ["x"]]


def test_records_expire_after_ttl(cache: CachedStore, inner: FakeStore, clock: FakeClock) -> None:
    fetch(cache, ["a"])
    inner.records["a"] = record("a", status=Status.REVOKED)
    clock.now += TTL - 0.1
    assert fetch(cache, ["a"])["a"].status is Status.APPROVED  # stale within ttl, by design
    clock.now += 0.2
    assert fetch(cache, ["a"])["a"].status is Status.REVOKED
    assert inner.lookups == [["a"], ["a"]]


def test_store_failure_raises_from_fetch(
    cache: CachedStore, inner: FakeStore, observer: CountingObserver
) -> None:
    fetch(cache, ["a"])
    inner.failing = True
    with pytest.raises(StoreUnavailable):
        fetch(cache, ["a", "b"])
    assert observer.store_errors == 1


def test_fetch_partial_serves_the_cache_and_names_the_rest_unavailable(
    cache: CachedStore, inner: FakeStore, observer: CountingObserver
) -> None:
    fetch(cache, ["a", "x"])
    inner.failing = True
    lookup = fetch_partial(cache, ["a", "b", "x", "y"])
    assert lookup == Lookup(records={"a": record("a")}, unavailable=frozenset({"b", "y"}))
    assert observer.store_errors == 1
    # A failure is not remembered as absence: the next lookup asks again.
    inner.failing = False
    lookup = fetch_partial(cache, ["b", "y"])
    assert lookup == Lookup(records={"b": record("b")}, unavailable=frozenset())
    assert inner.lookups[-1] == ["b", "y"]


def test_expired_entries_are_not_served_during_an_outage(
    cache: CachedStore, inner: FakeStore, clock: FakeClock
) -> None:
    fetch(cache, ["a", "x"])
    inner.failing = True
    clock.now += TTL + 1
    lookup = fetch_partial(cache, ["a", "x"])
    assert lookup.records == {}
    assert lookup.unavailable == {"a", "x"}


def test_invalidate_forgets_found_and_absent_ids(cache: CachedStore, inner: FakeStore) -> None:
    fetch(cache, ["a", "b", "x"])
    cache.invalidate(["a", "x"])
    fetch(cache, ["a", "b", "x"])
    assert inner.lookups == [["a", "b", "x"], ["a", "x"]]


def test_clear_forgets_everything(cache: CachedStore, inner: FakeStore) -> None:
    fetch(cache, ["a", "b", "x"])
    cache.clear()
    fetch(cache, ["a", "b", "x"])
    assert inner.lookups == [["a", "b", "x"], ["a", "b", "x"]]


def test_answer_requested_before_an_invalidation_is_not_cached(inner: FakeStore) -> None:
    class SlowStore(FakeStore):
        async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
            answer = await super().fetch(chunk_ids)
            await asyncio.sleep(0)  # the invalidation arrives while this answer travels
            return answer

    slow = SlowStore(record("a"))
    cache = CachedStore(slow)

    async def scenario() -> None:
        lookup = asyncio.ensure_future(cache.fetch(["a"]))
        await asyncio.sleep(0)
        slow.records["a"] = record("a", status=Status.REVOKED)
        cache.invalidate(["a"])
        assert (await lookup)["a"].status is Status.APPROVED  # its caller still gets it
        assert (await cache.fetch(["a"]))["a"].status is Status.REVOKED

    asyncio.run(scenario())
    assert slow.lookups == [["a"], ["a"]]


def test_upsert_writes_through_and_invalidates(cache: CachedStore, inner: FakeStore) -> None:
    fetch(cache, ["a", "x"])
    written = cache.upsert(r for r in [record("a", version="2"), record("x")])
    assert written == 2
    assert fetch(cache, ["a", "x"]) == {"a": record("a", version="2"), "x": record("x")}


def test_close_closes_the_inner_store(cache: CachedStore, inner: FakeStore) -> None:
    cache.close()
    assert inner.closed


def test_aclose_closes_the_inner_store(cache: CachedStore, inner: FakeStore) -> None:
    asyncio.run(cache.aclose())
    assert inner.closed


@pytest.mark.parametrize(
    "settings",
    [
        {"ttl": 0},
        {"negative_ttl": -1},
        {"maxsize": 0},
        {"negative_maxsize": 0},
        {"stale_if_error_seconds": -1},
    ],
)
def test_nonsense_settings_are_refused(inner: FakeStore, settings: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"positive|negative"):
        CachedStore(inner, **settings)  # type: ignore[arg-type]


def test_maxsize_bounds_the_cache(inner: FakeStore, clock: FakeClock) -> None:
    inner.records.update((f"c-{n}", record(f"c-{n}")) for n in range(10))
    cache = CachedStore(inner, maxsize=4, negative_maxsize=2, timer=clock)
    fetch(cache, [f"c-{n}" for n in range(10)] + ["x", "y", "z"])
    inner.lookups.clear()
    fetch(cache, [f"c-{n}" for n in range(10)] + ["x", "y", "z"])
    assert len(inner.lookups[0]) == 10 - 4 + 3 - 2


def test_works_over_the_sqlite_store(sqlite_store: SqliteStore, clock: FakeClock) -> None:
    cache = CachedStore(sqlite_store, timer=clock)
    assert fetch(cache, ["a"]) == {}
    cache.upsert([record("a")])
    assert fetch(cache, ["a"]) == {"a": record("a")}
    assert fetch_partial(cache, ["a", "b"]) == Lookup({"a": record("a")}, frozenset())


# --- stale-if-error --------------------------------------------------------------------

STALE = 10.0


@pytest.fixture
def lenient(inner: FakeStore, clock: FakeClock, observer: CountingObserver) -> CachedStore:
    return CachedStore(
        inner,
        ttl=TTL,
        negative_ttl=NEGATIVE_TTL,
        stale_if_error_seconds=STALE,
        observer=observer,
        timer=clock,
    )


def test_stale_records_are_served_only_while_the_store_fails(
    lenient: CachedStore, inner: FakeStore, clock: FakeClock, observer: CountingObserver
) -> None:
    fetch(lenient, ["a"])
    inner.records["a"] = record("a", status=Status.REVOKED)
    clock.now += TTL + STALE / 2
    # The store answers: its answer wins over the expired entry.
    assert fetch(lenient, ["a"])["a"].status is Status.REVOKED
    clock.now += TTL + STALE / 2
    inner.failing = True
    assert fetch_partial(lenient, ["a"]) == Lookup(
        {"a": record("a", status=Status.REVOKED)}, frozenset()
    )
    assert fetch(lenient, ["a"]) == {"a": record("a", status=Status.REVOKED)}
    assert observer.stale == 2
    assert observer.store_errors == 2


def test_stale_window_ends(
    lenient: CachedStore, inner: FakeStore, clock: FakeClock, observer: CountingObserver
) -> None:
    fetch(lenient, ["a", "b"])
    inner.failing = True
    clock.now += TTL + STALE - 0.1
    assert fetch_partial(lenient, ["a", "b"]).records.keys() == {"a", "b"}
    clock.now += 0.2
    assert fetch_partial(lenient, ["a", "b"]) == Lookup({}, frozenset({"a", "b"}))
    with pytest.raises(StoreUnavailable):
        fetch(lenient, ["a"])


def test_fetch_raises_unless_stale_entries_answer_every_miss(
    lenient: CachedStore, inner: FakeStore, clock: FakeClock
) -> None:
    fetch(lenient, ["a"])
    clock.now += TTL + 1
    inner.failing = True
    assert fetch(lenient, ["a"]) == {"a": record("a")}
    with pytest.raises(StoreUnavailable):
        fetch(lenient, ["a", "b"])
    assert fetch_partial(lenient, ["a", "b"]) == Lookup({"a": record("a")}, frozenset({"b"}))


def test_default_window_is_zero_fail_closed(
    cache: CachedStore, inner: FakeStore, clock: FakeClock, observer: CountingObserver
) -> None:
    fetch(cache, ["a"])
    clock.now += TTL + 0.001
    inner.failing = True
    assert fetch_partial(cache, ["a"]) == Lookup({}, frozenset({"a"}))
    assert observer.stale == 0


def test_invalidated_or_cleared_entries_are_never_served_stale(
    lenient: CachedStore, inner: FakeStore, clock: FakeClock
) -> None:
    fetch(lenient, ["a", "b"])
    clock.now += TTL + 1
    inner.failing = True
    lenient.invalidate(["a"])
    assert fetch_partial(lenient, ["a", "b"]) == Lookup({"b": record("b")}, frozenset({"a"}))
    lenient.clear()
    assert fetch_partial(lenient, ["b"]) == Lookup({}, frozenset({"b"}))


def test_record_deleted_in_the_store_is_not_served_stale(
    lenient: CachedStore, inner: FakeStore, clock: FakeClock
) -> None:
    fetch(lenient, ["a"])
    del inner.records["a"]
    clock.now += TTL + 1
    assert fetch(lenient, ["a"]) == {}
    clock.now += NEGATIVE_TTL + 1
    inner.failing = True
    assert fetch_partial(lenient, ["a"]) == Lookup({}, frozenset({"a"}))


def test_invalidation_during_a_failing_lookup_is_honoured(
    inner: FakeStore, clock: FakeClock
) -> None:
    class FailingAfterInvalidation(FakeStore):
        async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
            if self.failing:
                cached.invalidate(["a"])  # the notification arrives while the lookup fails
            return await super().fetch(chunk_ids)

    store = FailingAfterInvalidation(record("a"))
    cached = CachedStore(store, ttl=TTL, stale_if_error_seconds=STALE, timer=clock)
    fetch(cached, ["a"])
    clock.now += TTL + 1
    store.failing = True
    assert fetch_partial(cached, ["a"]) == Lookup({}, frozenset({"a"}))


# --- observer ----------------------------------------------------------------------------


def test_size_bound_evictions_are_reported(
    inner: FakeStore, clock: FakeClock, observer: CountingObserver
) -> None:
    inner.records.update((f"c-{n}", record(f"c-{n}")) for n in range(5))
    cache = CachedStore(inner, maxsize=3, negative_maxsize=1, observer=observer, timer=clock)
    fetch(cache, [f"c-{n}" for n in range(5)])
    assert observer.evictions == 2
    fetch(cache, ["x", "y"])
    assert observer.evictions == 3
    cache.clear()
    assert observer.evictions == 3  # clearing is not evicting
    assert observer.clears == 1


def test_expiry_is_not_an_eviction(
    cache: CachedStore, clock: FakeClock, observer: CountingObserver
) -> None:
    fetch(cache, ["a"])
    clock.now += TTL + 1
    fetch(cache, ["a", "b"])
    assert observer.evictions == 0


def test_invalidations_and_clears_are_reported(
    cache: CachedStore, observer: CountingObserver
) -> None:
    cache.invalidate(["a", "b", "never-cached"])
    cache.invalidate([])
    cache.upsert([record("c")])
    cache.clear()
    assert (observer.invalidations, observer.clears) == (4, 1)


def test_store_latency_is_reported_per_store_call(
    cache: CachedStore, inner: FakeStore, observer: CountingObserver
) -> None:
    fetch(cache, ["a", "b"])
    fetch(cache, ["a", "b"])  # all hits: no store call
    inner.failing = True
    fetch_partial(cache, ["x"])
    assert len(observer.latencies) == 2
    assert all(0 <= seconds < 1 for seconds in observer.latencies)


def test_suspended_cache_serves_but_keeps_nothing_until_resumed(
    observer: CountingObserver,
) -> None:
    inner = FakeStore(record("c-1"))
    cache = CachedStore(inner, ttl=TTL, negative_ttl=NEGATIVE_TTL, observer=observer)
    cache.suspend()  # e.g. the change listener is down: changes go unannounced
    assert observer.watched == [False]  # the gauge retrieval_gate_store_changes_watched
    assert "c-1" in asyncio.run(cache.fetch(["c-1"]))
    asyncio.run(cache.fetch(["c-1", "nope"]))
    assert len(inner.lookups) == 2  # nothing was kept, found or absent
    cache.resume()
    assert observer.watched == [False, True]
    asyncio.run(cache.fetch(["c-1"]))
    asyncio.run(cache.fetch(["c-1"]))
    assert len(inner.lookups) == 3  # cached again after resume
