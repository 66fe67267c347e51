"""A TTL cache in front of any metadata store.

Found records are cached for ``ttl`` seconds, ids known to have no record for
``negative_ttl`` seconds; each kind is bounded in size, the oldest entries
making room. A found record and a known absence cost a lookup the same, and
expire alike when the two TTLs are equal (the settings' default): the time of
an answer must not say whether a record the caller may not read exists. A cached
record is served until it expires even if the store has since changed it:
``ttl`` bounds how long a revocation can take to be enforced, unless someone
calls ``invalidate`` or ``clear``. A serving gate has a change watcher that
does (``sidecar.store.watch``: the PostgreSQL listener per notification, the
SQLite poll on every change) and that ``suspend``s the cache while it cannot
see changes.

An expired entry is not served, so a store outage with no fresh entry ends in
METADATA_UNAVAILABLE (fail closed). ``stale_if_error_seconds`` relaxes that on
purpose: while the store fails, a record that expired less than that long ago
is still served. It is 0 by default, and an entry dropped by ``invalidate`` or
``clear`` is never served stale, whatever the window.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from cachetools import TTLCache

from sidecar.core.chunk_record import ChunkRecord
from sidecar.store.store import MetadataStore, StoreEndpoint, StoreUnavailable

_V = TypeVar("_V")


class CacheObserver(Protocol):
    """Receives cache events, e.g. to count them in Prometheus.

    Each method here ignores its event, so that a subclass overrides only the
    events it counts (``GateMetrics`` implements them all without subclassing).
    """

    def hit(self, n: int) -> None:
        """``n`` ids were answered from the cache (found or known absent)."""
        return None

    def miss(self, n: int) -> None:
        """``n`` ids had to be looked up in the store."""
        return None

    def store_error(self) -> None:
        """A lookup in the store failed with StoreUnavailable."""
        return None

    def store_latency(self, seconds: float) -> None:
        """One lookup in the store took ``seconds`` (wall clock), failed or not."""
        return None

    def evicted(self, n: int) -> None:
        """``n`` entries were dropped before they expired, to respect the size bound."""
        return None

    def invalidated(self, n: int) -> None:
        """``n`` ids were invalidated (whether or not they were cached)."""
        return None

    def cleared(self) -> None:
        """Everything cached was dropped (e.g. the change listener reconnected)."""
        return None

    def watching(self, seen: bool) -> None:
        """Changes to the store are now seen as they happen (``seen``: caching on), or no
        longer (nothing is cached until they are again)."""
        return None

    def stale_served(self, n: int) -> None:
        """``n`` expired records were served because the store failed (stale-if-error)."""
        return None


class NullCacheObserver(CacheObserver):
    """Ignores every event."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """The outcome of a lookup that may have partly failed.

    ``records`` holds what was found (from the cache or the store);
    ``unavailable`` the ids that could not be looked up because the store failed.
    An id in neither has no record.
    """

    records: Mapping[str, ChunkRecord]
    unavailable: frozenset[str]


class _BoundedCache(TTLCache[str, _V]):
    """A TTLCache that reports the entries its size bound pushes out."""

    def __init__(
        self, maxsize: int, ttl: float, timer: Callable[[], float], on_evict: Callable[[], None]
    ) -> None:
        super().__init__(maxsize, ttl, timer=timer)
        self._on_evict = on_evict

    def popitem(self) -> tuple[str, _V]:
        # Called only when an insertion finds the cache full (expired entries
        # having been purged first), so every call is an eviction.
        item = super().popitem()
        self._on_evict()
        return item


@dataclass(frozen=True, slots=True)
class _Entry:
    record: ChunkRecord
    fresh_until: float  # on the cache's timer; kept longer only for stale-if-error


class CachedStore:
    """Answers from a TTL cache and asks ``inner`` for the rest.

    Not thread-safe: use it (invalidation included) from the event loop thread.
    """

    def __init__(
        self,
        inner: MetadataStore,
        *,
        ttl: float = 30.0,
        maxsize: int = 100_000,
        negative_ttl: float = 30.0,
        negative_maxsize: int = 10_000,
        stale_if_error_seconds: float = 0.0,
        observer: CacheObserver | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0 or negative_ttl <= 0 or maxsize < 1 or negative_maxsize < 1:
            raise ValueError("cache ttl values must be positive and sizes at least 1")
        if stale_if_error_seconds < 0:
            raise ValueError("stale_if_error_seconds must not be negative")
        self._inner = inner
        self._ttl = ttl
        self._maxsize = maxsize
        self._negative_ttl = negative_ttl
        self._negative_maxsize = negative_maxsize
        self._stale_s = stale_if_error_seconds
        self._timer = timer
        self._observer = observer if observer is not None else NullCacheObserver()
        self._found, self._absent = self._new_caches()
        # Bumped by invalidate/clear. A store answer that was requested before
        # an invalidation may predate the change being announced, so it is
        # returned to its caller but not cached.
        self._generation = 0
        # False while nothing announces changes (the change listener is down):
        # answers are then served but not kept, so none can go stale unannounced.
        self._caching = True

    @property
    def endpoint(self) -> StoreEndpoint | None:
        """Where the inner store's lookups go (for traces); None when it does not say."""
        endpoint = getattr(self._inner, "endpoint", None)
        return endpoint if isinstance(endpoint, StoreEndpoint) else None

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up records, from the cache where fresh; raises StoreUnavailable.

        When the store fails, expired records within ``stale_if_error_seconds``
        still answer; the error is raised only if some id remains unanswered.
        """
        records, unavailable, error = await self._lookup(chunk_ids)
        if error is not None and unavailable:
            raise error
        return records

    async def fetch_partial(self, chunk_ids: Collection[str]) -> Lookup:
        """Like ``fetch``, but a store failure still returns what the cache can serve."""
        records, unavailable, _ = await self._lookup(chunk_ids)
        return Lookup(records, unavailable)

    async def fetch_current(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look records up in the store itself, never the cache (refreshing the cache).

        For a question about *now* (was a chunk revoked since a decision?),
        which a cached record up to ``ttl`` old could answer wrongly. Raises
        StoreUnavailable; no stale record answers.
        """
        return await self._from_store(list(dict.fromkeys(chunk_ids)))

    def upsert(self, records: Iterable[ChunkRecord], *, reinstate: bool = False) -> int:
        """Write through to the inner store, then drop the written ids from the cache."""
        batch = list(records)
        count = self._inner.upsert(batch, reinstate=reinstate)
        self.invalidate(record.chunk_id for record in batch)
        return count

    def invalidate(self, chunk_ids: Iterable[str]) -> None:
        """Forget what is cached about these ids (found or absent); never served stale."""
        self._generation += 1
        count = 0
        for chunk_id in chunk_ids:
            self._found.pop(chunk_id, None)
            self._absent.pop(chunk_id, None)
            count += 1
        if count:
            self._observer.invalidated(count)

    def clear(self) -> None:
        """Forget everything cached; nothing of it is served stale."""
        self._generation += 1
        # New caches rather than clear(): some cachetools versions clear by
        # popping, which would count every entry as an eviction.
        self._found, self._absent = self._new_caches()
        self._observer.cleared()

    def suspend(self) -> None:
        """Forget everything and keep nothing new until ``resume`` (changes are unannounced)."""
        self._caching = False
        self.clear()
        self._observer.watching(False)

    def resume(self) -> None:
        """Cache again from an empty cache (changes are announced again)."""
        self.clear()
        self._caching = True
        self._observer.watching(True)

    def close(self) -> None:
        """Close the inner store's synchronous resources."""
        self._inner.close()

    async def aclose(self) -> None:
        """Close the inner store completely (from the event loop that fetched)."""
        await self._inner.aclose()

    def _new_caches(self) -> tuple[_BoundedCache[_Entry], _BoundedCache[bool]]:
        def evicted() -> None:
            self._observer.evicted(1)

        # Found records stay past their freshness for the stale-if-error window.
        found = _BoundedCache[_Entry](
            self._maxsize, self._ttl + self._stale_s, self._timer, evicted
        )
        absent = _BoundedCache[bool](
            self._negative_maxsize, self._negative_ttl, self._timer, evicted
        )
        return found, absent

    async def _lookup(
        self, chunk_ids: Collection[str]
    ) -> tuple[dict[str, ChunkRecord], frozenset[str], StoreUnavailable | None]:
        """What the cache and the store know, the ids left unanswered, and the store's error."""
        records, misses = self._from_cache(chunk_ids)
        if misses:
            try:
                records.update(await self._from_store(misses))
            except StoreUnavailable as error:
                stale = self._stale(misses)
                records.update(stale)
                return records, frozenset(misses).difference(stale), error
        return records, frozenset(), None

    def _from_cache(self, chunk_ids: Collection[str]) -> tuple[dict[str, ChunkRecord], list[str]]:
        unique = dict.fromkeys(chunk_ids)
        records = {}
        misses = []
        now = self._timer()
        found = self._found
        absent = self._absent
        for chunk_id in unique:
            # Both caches are asked about every id, so that a found record and a
            # known absence cost the same: one hit and one miss. Otherwise the
            # time of Gate/Filter's answer would tell a caller whether a record
            # it may not read exists (it is answered as an unknown id).
            # (Membership then one index, the fastest symmetric form measured:
            # about 0.7 us per id, where indexing ``found`` alone took 0.25.)
            is_found = chunk_id in found
            is_absent = chunk_id in absent
            if is_found:
                entry = found[chunk_id]
                if now < entry.fresh_until:
                    records[chunk_id] = entry.record
                else:
                    misses.append(chunk_id)
            elif is_absent:
                absent[chunk_id]  # the index the found path takes
            else:
                misses.append(chunk_id)
        if len(unique) > len(misses):
            self._observer.hit(len(unique) - len(misses))
        if misses:
            self._observer.miss(len(misses))
        return records, misses

    async def _from_store(self, misses: list[str]) -> Mapping[str, ChunkRecord]:
        generation = self._generation
        started = time.perf_counter()
        try:
            found = await self._inner.fetch(misses)
        except StoreUnavailable:
            self._observer.store_latency(time.perf_counter() - started)
            self._observer.store_error()
            raise
        self._observer.store_latency(time.perf_counter() - started)
        records = {chunk_id: found[chunk_id] for chunk_id in misses if chunk_id in found}
        cacheable = self._caching and generation == self._generation
        fresh_until = self._timer() + self._ttl
        for chunk_id in misses:
            record = records.get(chunk_id)
            if record is None:
                # A record kept for stale-if-error must not outlive its deletion.
                self._found.pop(chunk_id, None)
                if cacheable:
                    self._absent[chunk_id] = True
            elif cacheable:
                self._found[chunk_id] = _Entry(record, fresh_until)
        return records

    def _stale(self, misses: list[str]) -> dict[str, ChunkRecord]:
        """Expired records still inside the stale-if-error window (read after the
        failed lookup, so that an invalidation during it is honoured)."""
        if not self._stale_s:
            return {}
        deadline = self._timer() - self._stale_s
        stale = {}
        for chunk_id in misses:
            entry = self._found.get(chunk_id)
            if entry is not None and entry.fresh_until > deadline:
                stale[chunk_id] = entry.record
        if stale:
            self._observer.stale_served(len(stale))
        return stale
