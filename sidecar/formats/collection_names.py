"""The names the gate has learned for collection ids, per process, bounded.

A database that names collections by id on some routes and by name on others
(Chroma: a query goes to ``.../collections/{id}/query``, while users, policy
data and metric allowlists know ``docs``) says which name an id stands for in
the answers of its collection routes. The gate remembers what those answers
said: the key is the format and the id within its database's namespace
(Chroma's tenant and database), the value the name. Only the database's own
answers teach it, so a client cannot make an id stand for another name.

Bounded: the least recently used ids are forgotten past ``maxsize``; a
forgotten id is an unknown one, which the shipped request policy treats as
any collection described by name (fail closed) until the collection is read
by name again.
Each process (each worker) learns on its own. Learning may run in a worker
thread (a large list of collections is parsed off the event loop), so every
access holds a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from cachetools import LRUCache

from sidecar.formats.base import CollectionId

# About 200 bytes per entry: a few MB at most, for any number of collections in use.
DEFAULT_MAXSIZE = 10_000

_Key = tuple[str, CollectionId]


class CollectionNames:
    """Collection id -> name, as the database's answers said, the most recent ``maxsize``."""

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self._names: LRUCache[_Key, str] = LRUCache(maxsize)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._names)

    def learn(self, format_name: str, learned: Iterable[tuple[CollectionId, str]]) -> None:
        """Remember each (id, name) a ``format_name`` answer gave; a later answer wins."""
        with self._lock:
            for collection, name in learned:
                self._names[format_name, collection] = name

    def forget(self, format_name: str, collections: Iterable[CollectionId]) -> None:
        """Forget what the names of ``collections`` were (a rename may be under way)."""
        with self._lock:
            for collection in collections:
                self._names.pop((format_name, collection), None)

    def name(self, format_name: str, collection: CollectionId) -> str | None:
        """The name learned for ``collection``; None when none is known."""
        with self._lock:
            return self._names.get((format_name, collection))
