"""A TTL cache in front of any metadata store.

Found records are cached for ``ttl`` seconds, ids known to have no record for
``negative_ttl`` seconds (usually shorter, so that newly loaded chunks appear
soon). A cached record is served until it expires even if the store has since
changed it: ``ttl`` bounds how long a revocation can take to be enforced, unless
the writer calls ``invalidate``. An expired entry is never served, so a store
outage with no fresh entry ends in METADATA_UNAVAILABLE (fail closed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cachetools import TTLCache

from sidecar.metadata.store import MetadataStore, StoreUnavailable
from sidecar.records import ChunkRecord


class CacheObserver(Protocol):
    """Receives cache events, e.g. to count them in Prometheus."""

    def hit(self, n: int) -> None:
        """``n`` ids were answered from the cache (found or known absent)."""

    def miss(self, n: int) -> None:
        """``n`` ids had to be looked up in the store."""

    def store_error(self) -> None:
        """A lookup in the store failed with StoreUnavailable."""


class NullCacheObserver:
    """Ignores every event."""

    def hit(self, n: int) -> None:
        """Ignore the event."""

    def miss(self, n: int) -> None:
        """Ignore the event."""

    def store_error(self) -> None:
        """Ignore the event."""


@dataclass(frozen=True, slots=True)
class Lookup:
    """The outcome of a lookup that may have partly failed.

    ``records`` holds what was found (from the cache or the store);
    ``unavailable`` the ids that could not be looked up because the store failed.
    An id in neither has no record.
    """

    records: Mapping[str, ChunkRecord]
    unavailable: frozenset[str]


class CachedStore:
    """MetadataStore that answers from a TTL cache and asks ``inner`` for the rest.

    Not thread-safe: use it (invalidation included) from the event loop thread.
    """

    def __init__(
        self,
        inner: MetadataStore,
        *,
        ttl: float = 30.0,
        maxsize: int = 100_000,
        negative_ttl: float = 5.0,
        negative_maxsize: int = 10_000,
        observer: CacheObserver | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl <= 0 or negative_ttl <= 0 or maxsize < 1 or negative_maxsize < 1:
            raise ValueError("cache ttl values must be positive and sizes at least 1")
        self._inner = inner
        self._found: TTLCache[str, ChunkRecord] = TTLCache(maxsize, ttl, timer=timer)
        self._absent: TTLCache[str, bool] = TTLCache(negative_maxsize, negative_ttl, timer=timer)
        self._observer = observer if observer is not None else NullCacheObserver()
        # Bumped by invalidate/clear. A store answer that was requested before
        # an invalidation may predate the change being announced, so it is
        # returned to its caller but not cached.
        self._generation = 0

    async def fetch(self, chunk_ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        """Look up records, from the cache where fresh; raises StoreUnavailable."""
        records, misses = self._from_cache(chunk_ids)
        if misses:
            records.update(await self._from_store(misses))
        return records

    async def fetch_partial(self, chunk_ids: Collection[str]) -> Lookup:
        """Like ``fetch``, but a store failure still returns what the cache holds."""
        records, misses = self._from_cache(chunk_ids)
        if misses:
            try:
                records.update(await self._from_store(misses))
            except StoreUnavailable:
                return Lookup(records, frozenset(misses))
        return Lookup(records, frozenset())

    def upsert(self, records: Iterable[ChunkRecord]) -> int:
        """Write through to the inner store, then drop the written ids from the cache."""
        batch = list(records)
        count = self._inner.upsert(batch)
        self.invalidate(record.chunk_id for record in batch)
        return count

    def invalidate(self, chunk_ids: Iterable[str]) -> None:
        """Forget what is cached about these ids (found or absent)."""
        self._generation += 1
        for chunk_id in chunk_ids:
            self._found.pop(chunk_id, None)
            self._absent.pop(chunk_id, None)

    def clear(self) -> None:
        """Forget everything cached."""
        self._generation += 1
        self._found.clear()
        self._absent.clear()

    def close(self) -> None:
        """Close the inner store."""
        self._inner.close()

    def _from_cache(self, chunk_ids: Collection[str]) -> tuple[dict[str, ChunkRecord], list[str]]:
        unique = dict.fromkeys(chunk_ids)
        records = {}
        misses = []
        for chunk_id in unique:
            # Indexing is about three times faster than TTLCache.get, which
            # checks expiry twice; this loop runs for every chunk of every response.
            try:
                records[chunk_id] = self._found[chunk_id]
            except KeyError:
                if chunk_id not in self._absent:
                    misses.append(chunk_id)
        if len(unique) > len(misses):
            self._observer.hit(len(unique) - len(misses))
        if misses:
            self._observer.miss(len(misses))
        return records, misses

    async def _from_store(self, misses: list[str]) -> Mapping[str, ChunkRecord]:
        generation = self._generation
        try:
            found = await self._inner.fetch(misses)
        except StoreUnavailable:
            self._observer.store_error()
            raise
        records = {chunk_id: found[chunk_id] for chunk_id in misses if chunk_id in found}
        if generation == self._generation:
            for chunk_id in misses:
                if chunk_id in records:
                    self._found[chunk_id] = records[chunk_id]
                else:
                    self._absent[chunk_id] = True
        return records
