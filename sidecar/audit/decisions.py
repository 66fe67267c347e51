"""Finding a decision in the audit trail by its id: what it released, and to whom.

Answer verification (``sidecar.enforcement.answer_verification``) needs, for
each decision id an application sends, the caller the decision was made for
and the chunks it released with the hash of each admitted text
(:class:`~sidecar.core.answer_check.ReleasedChunks`). Three places hold that:

- :class:`RecentDecisions`, the last decisions this process recorded, kept in
  memory as :class:`IndexingSink` writes them (bounded; no file or database
  is read for an answer checked soon after its retrieval);
- the JSON Lines log (:class:`JsonlDecisions`): every segment, newest first,
  read from the end, so a recent decision costs only the lines after it;
- the PostgreSQL ``audit_records`` table (:class:`PostgresDecisions`), with
  the local spool for records not yet shipped.

A record found in a file or the table is used only if its own ``sha256``
matches its content; the chain as a whole is what ``audit verify`` proves.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import orjson
import psycopg

from sidecar.audit.chain import record_digest
from sidecar.audit.postgres_schema import CONNECT_TIMEOUT_SECONDS
from sidecar.audit.segments import lines_from_end, log_files
from sidecar.audit.sink import AuditError, AuditSink
from sidecar.core.answer_check import ReleasedChunks
from sidecar.postgres.dsn import parse_postgres_url

log = logging.getLogger(__name__)

# Decisions kept in memory per process: a few hundred bytes to a few KiB each.
RECENT_DECISIONS: Final = 4096
# The ``kind`` of an audit record that is not a decision (an answer verification).
KIND_FIELD: Final = "kind"
_QUERY_TIMEOUT_SECONDS = 5.0


class DecisionsUnavailable(AuditError):
    """The audit trail could not be read; nothing can be verified against it."""


class DecisionSource(Protocol):
    """Where decisions are looked up by id."""

    async def find(self, decision_ids: Collection[str]) -> dict[str, ReleasedChunks]:
        """The decisions of ``decision_ids`` that exist (absent ids are left out).

        Raises DecisionsUnavailable when the trail cannot be read.
        """
        ...

    async def aclose(self) -> None:
        """Release connections and files."""
        ...


def released_chunks(record: Mapping[str, Any]) -> ReleasedChunks | None:
    """What a decision record says it released, and to whom; None for any other record.

    A chunk released without its admitted hash (an older record, or audit
    mode's pass of a rejected chunk) maps to None, which no text matches.
    """
    if KIND_FIELD in record:
        return None
    tenant, digest, released = (
        record.get("tenant"),
        record.get("principals_sha256"),
        record.get("released"),
    )
    if not isinstance(tenant, str) or not isinstance(digest, str):
        return None
    if not isinstance(released, list):
        return ReleasedChunks(tenant, digest, {})
    hashes = record.get("released_sha256")
    if not isinstance(hashes, list) or len(hashes) != len(released):
        hashes = [None] * len(released)
    admitted = record.get("admitted")
    allowed = set(admitted) if isinstance(admitted, list) else set()
    chunks: dict[str, str | None] = {}
    for chunk_id, sha256 in zip(released, hashes, strict=True):
        if isinstance(chunk_id, str):
            # Released but not admitted (audit mode): no hash vouches for it.
            keep = sha256 if isinstance(sha256, str) and chunk_id in allowed else None
            if chunks.get(chunk_id) is None:
                chunks[chunk_id] = keep
    return ReleasedChunks(tenant, digest, chunks)


class RecentDecisions:
    """The last ``size`` decisions recorded by this process, by id (thread-safe)."""

    def __init__(self, size: int = RECENT_DECISIONS) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._decisions: OrderedDict[str, ReleasedChunks] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, record: Mapping[str, Any]) -> None:
        """Remember ``record`` if it is a decision, forgetting the oldest beyond the bound."""
        decision_id = record.get("decision_id")
        chunks = released_chunks(record)
        if chunks is None or not isinstance(decision_id, str):
            return
        with self._lock:
            self._decisions[decision_id] = chunks
            if len(self._decisions) > self._size:
                self._decisions.popitem(last=False)

    def get(self, decision_id: str) -> ReleasedChunks | None:
        """The decision ``decision_id`` if it is still remembered."""
        with self._lock:
            return self._decisions.get(decision_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._decisions)


class IndexingSink:
    """An audit sink that remembers the decisions it wrote in a :class:`RecentDecisions`.

    A record is remembered only once ``inner`` has written it: a decision the
    trail does not hold is never vouched for.
    """

    def __init__(self, inner: AuditSink, recent: RecentDecisions) -> None:
        self.inner = inner
        self.recent = recent

    def write(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` to the inner sink, then remember it."""
        self.inner.write(record)
        self.recent.add(record)

    def close(self) -> None:
        """Close the inner sink."""
        self.inner.close()


def _verified(line: bytes | str) -> dict[str, Any] | None:
    """A stored record, if it is a JSON object whose ``sha256`` matches its content."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or record.get("sha256") != record_digest(record):
        return None
    return record


def scan_log(log_path: Path, decision_ids: Collection[str]) -> dict[str, ReleasedChunks]:
    """Find ``decision_ids`` in a JSON Lines audit log, every segment, newest record first.

    A line is parsed only when it holds one of the ids in the form canonical
    JSON writes it; the scan stops when every id is found. Raises
    DecisionsUnavailable when a file cannot be read.
    """
    wanted = {f'"decision_id":"{i}"'.encode(): i for i in decision_ids if _plain(i)}
    found: dict[str, ReleasedChunks] = {}
    try:
        for path in reversed(log_files(log_path)):
            with path.open("rb") as handle:
                for _, line in lines_from_end(handle, terminated_only=True):
                    needle = next((n for n in wanted if n in line), None)
                    if needle is None:
                        continue
                    record = _verified(line)
                    decision_id = wanted[needle]
                    if record is None or record.get("decision_id") != decision_id:
                        continue
                    chunks = released_chunks(record)
                    if chunks is not None:
                        found[decision_id] = chunks
                        del wanted[needle]
                        if not wanted:
                            return found
    except OSError as exc:
        raise DecisionsUnavailable(f"{log_path}: cannot read the audit log: {exc}") from exc
    return found


def _plain(decision_id: str) -> bool:
    """True for an id canonical JSON writes as it is (the gate's are 32 hex digits)."""
    return (
        decision_id.isascii()
        and decision_id.isprintable()
        and '"' not in decision_id
        and ("\\" not in decision_id)
    )


class JsonlDecisions:
    """Decisions from memory, then from the JSON Lines log (in a worker thread)."""

    def __init__(self, log_path: Path, recent: RecentDecisions) -> None:
        self._log = log_path
        self._recent = recent

    async def find(self, decision_ids: Collection[str]) -> dict[str, ReleasedChunks]:
        """See :class:`DecisionSource`."""
        found, missing = _from_memory(self._recent, decision_ids)
        if missing:
            found.update(await asyncio.to_thread(scan_log, self._log, missing))
        return found

    async def aclose(self) -> None:
        """Nothing to release: each scan opens and closes its files."""
        return None


_SELECT = "SELECT decision_id, record FROM audit_records WHERE decision_id = ANY(%s)"


class PostgresDecisions:
    """Decisions from memory, then the ``audit_records`` table, then the spool.

    One connection, opened on first use and again after a failure, asked one
    query for all the ids memory does not hold. Records written but not yet
    shipped are found in the local spool (``spool``). An id present in two
    chains (which the gate's random ids never are) is answered by neither:
    which one the application received cannot be told.
    """

    def __init__(self, dsn: str, spool: Path, recent: RecentDecisions) -> None:
        self._url = parse_postgres_url(dsn)
        self._spool = spool
        self._recent = recent
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._lock = asyncio.Lock()

    async def find(self, decision_ids: Collection[str]) -> dict[str, ReleasedChunks]:
        """See :class:`DecisionSource`."""
        found, missing = _from_memory(self._recent, decision_ids)
        if not missing:
            return found
        rows = await self._query(missing)
        ambiguous: set[str] = set()
        for decision_id, line in rows:
            record = _verified(line)
            chunks = None if record is None else released_chunks(record)
            if chunks is None or record is None or record.get("decision_id") != decision_id:
                continue
            if decision_id in found:
                ambiguous.add(decision_id)
            found[decision_id] = chunks
        for decision_id in ambiguous:
            del found[decision_id]
        unshipped = [i for i in missing if i not in found and i not in ambiguous]
        if unshipped:
            found.update(await asyncio.to_thread(scan_log, self._spool, unshipped))
        return found

    async def _query(self, decision_ids: list[str]) -> list[tuple[str, str]]:
        async with self._lock:
            try:
                connection = self._connection
                if connection is None or connection.closed:
                    connection = self._connection = await psycopg.AsyncConnection.connect(
                        self._url.url,
                        connect_timeout=CONNECT_TIMEOUT_SECONDS,
                        application_name="retrieval-gate-verify",
                        prepare_threshold=None,
                        autocommit=True,
                    )
                cursor = await asyncio.wait_for(
                    connection.execute(_SELECT, (decision_ids,)), _QUERY_TIMEOUT_SECONDS
                )
                rows = await cursor.fetchall()
            except (psycopg.Error, TimeoutError) as exc:
                await self._drop()
                detail = self._url.scrub(str(exc).strip()) or type(exc).__name__
                raise DecisionsUnavailable(
                    f"audit store {self._url.redacted} cannot be read: {detail}"
                ) from None
        return [(str(i), str(line)) for i, line in rows]

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close()
            except psycopg.Error:
                log.debug("closing a failed audit store connection failed", exc_info=True)

    async def aclose(self) -> None:
        """Close the connection."""
        await self._drop()


def _from_memory(
    recent: RecentDecisions, decision_ids: Iterable[str]
) -> tuple[dict[str, ReleasedChunks], list[str]]:
    found: dict[str, ReleasedChunks] = {}
    missing: list[str] = []
    for decision_id in dict.fromkeys(decision_ids):
        chunks = recent.get(decision_id)
        if chunks is None:
            missing.append(decision_id)
        else:
            found[decision_id] = chunks
    return found, missing
