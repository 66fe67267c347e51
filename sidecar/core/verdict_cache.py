"""Policy verdicts kept per (caller, record) until the record's next validity boundary."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping

from sidecar.core.chunk_record import ChunkRecord

_NEVER = float("-inf")
_FOREVER = float("inf")

# (policy version, tenant, principals, drafts_allowed): every caller fact in the policy input.
CallerKey = tuple[str, str, frozenset[str], bool]
# (record, start, end, reasons): the reasons decided for ``record``, valid while
# start <= now_ns < end.
_Entry = tuple[ChunkRecord, float, float, tuple[str, ...]]


class VerdictCache:
    """A time-pure policy's reasons per (caller, record), until the record's next validity
    boundary.

    An entry is found by (caller, chunk id) and answers only for the very
    record it was decided for: the record the store returns must be the same
    object (the metadata cache hands out the one it holds) or equal to it,
    field for field. A record the store changed (revoked, re-scoped,
    re-hashed, re-dated) is neither, so it is a miss: an entry can never
    outlive a revocation that reached the metadata cache. Comparing identity
    first costs one pointer comparison per chunk where hashing the whole
    record cost microseconds.

    An entry answers only while ``now`` lies in the same validity interval as
    when it was computed: ``[start, end)`` between the record's boundaries
    (``effective_at``, ``expires_at``) around that moment.

    Bounded: the least recently used entries make room. Thread-safe.
    """

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("verdict cache size must be at least 1")
        self.maxsize = maxsize
        # An OrderedDict rather than cachetools.LRUCache: a hit hashes the key
        # twice here, four times there.
        self._entries: OrderedDict[tuple[CallerKey, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(
        self, caller: CallerKey, records: Mapping[str, ChunkRecord], now_ns: int
    ) -> tuple[dict[str, tuple[str, ...]], dict[str, ChunkRecord]]:
        """(reasons valid at ``now_ns`` per chunk id, the records without them)."""
        found: dict[str, tuple[str, ...]] = {}
        missing: dict[str, ChunkRecord] = {}
        entries = self._entries
        with self._lock:
            for chunk_id, record in records.items():
                key = (caller, record.chunk_id)
                entry = entries.get(key)
                if (
                    entry is not None
                    and (entry[0] is record or entry[0] == record)
                    and entry[1] <= now_ns < entry[2]
                ):
                    entries.move_to_end(key)
                    found[chunk_id] = entry[3]
                else:
                    missing[chunk_id] = record
        return found, missing

    def get(self, caller: CallerKey, record: ChunkRecord, now_ns: int) -> tuple[str, ...] | None:
        """The cached reasons for one record, or None when absent or not valid at ``now_ns``."""
        found, _ = self.lookup(caller, {"": record}, now_ns)
        return found.get("")

    def put(
        self,
        caller: CallerKey,
        record: ChunkRecord,
        now_ns: int,
        boundaries: tuple[int, int | None],
        reasons: tuple[str, ...],
    ) -> None:
        """Keep ``reasons``, decided at ``now_ns``, for the validity interval around it.

        ``boundaries`` are the record's ``effective_at`` and ``expires_at`` (None:
        open-ended) in nanoseconds since the epoch.
        """
        if now_ns in boundaries:
            # Exactly at a boundary the policy's own inequality (< or <=)
            # decides which side "now" is on; the interval cannot say.
            return
        start, end = _NEVER, _FOREVER
        for boundary in boundaries:
            if boundary is None:
                continue
            if boundary <= now_ns:
                start = max(start, boundary)
            else:
                end = min(end, boundary)
        entries = self._entries
        key = (caller, record.chunk_id)
        with self._lock:
            entries[key] = (record, start, end, reasons)
            entries.move_to_end(key)
            while len(entries) > self.maxsize:
                entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
