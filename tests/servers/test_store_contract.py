"""The MetadataStore contract, one suite run against every backend (SQLite, PostgreSQL,
and PostgreSQL through PgBouncer in transaction pooling mode).

PostgreSQL tests share one migrated database per module (tables emptied
between tests); each test gets its own store and event loop. The PgBouncer
runs share one PgBouncer per module that hands each transaction a different
server connection than the last (``server_round_robin``), so a statement that
relied on session state would fail here.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable, Collection, Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psycopg
import pytest

from sidecar.core.chunk_record import ChunkRecord, Status
from sidecar.store.postgres import PostgresStore
from sidecar.store.store import (
    ChunkNotFound,
    LifecycleError,
    MetadataStore,
    StoreUnavailable,
    VersionOverlap,
)
from tests.fixtures.pgbouncer import PgBouncer, running_pgbouncer
from tests.fixtures.records import EFFECTIVE
from tests.fixtures.records import chunk_record as record
from tests.fixtures.stores import new_sqlite_store


@dataclass
class Backend:
    """A store under test plus backend-specific ways to reach under its interface."""

    name: str
    store: MetadataStore
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    sql: Callable[[str, tuple[object, ...]], None]  # statement with %s placeholders
    count_statements: Callable[[], AbstractContextManager[list[str]]]

    def fetch(self, ids: Collection[str]) -> Mapping[str, ChunkRecord]:
        result: Mapping[str, ChunkRecord] = self.run(self.store.fetch(ids))
        return result

    def sign(self, doc_id: str, version: str, *, valid: bool = True) -> None:
        self.sql(
            "INSERT INTO electronic_signatures (doc_id, version, signer, meaning, signed_at, "
            "is_valid) VALUES (%s, %s, %s, %s, %s, %s)",
            (doc_id, version, "user:qa-lead", "approval", _signed_at(self.name), valid),
        )


# When a second version takes over in tests of several versions of one document.
LATER = EFFECTIVE + timedelta(days=365)


def _signed_at(backend: str) -> object:
    moment = datetime(2025, 2, 1, 12, 0, tzinfo=UTC)
    return moment if backend != "sqlite" else "2025-02-01T12:00:00.000000Z"


def _sqlite_backend(path: Path, runner: asyncio.Runner) -> Iterator[Backend]:
    store = new_sqlite_store(path)

    def sql(statement: str, params: tuple[object, ...]) -> None:
        with sqlite3.connect(path) as connection:
            connection.execute(statement.replace("%s", "?"), params)
        connection.close()

    @contextmanager
    def count_statements() -> Iterator[list[str]]:
        statements: list[str] = []
        store._reader.set_trace_callback(statements.append)
        try:
            yield statements
        finally:
            store._reader.set_trace_callback(None)

    yield Backend("sqlite", store, runner.run, sql, count_statements)
    store.close()


def _postgres_backend(
    url: str,
    runner: asyncio.Runner,
    monkeypatch: pytest.MonkeyPatch,
    *,
    through: str | None = None,
    name: str = "postgresql",
) -> Iterator[Backend]:
    """The store on ``url``, or on ``through`` (the same database via PgBouncer)."""
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("TRUNCATE chunks, electronic_signatures")
    # One pooled connection: a pool growing in the background would configure
    # its new connection while a test counts statements.
    if through is None:
        store = PostgresStore(url, pool_max_size=1)
    else:
        store = PostgresStore(through, pool_max_size=1, pgbouncer=True, listen_url=url)

    def sql(statement: str, params: tuple[object, ...]) -> None:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(statement.encode(), params)

    @contextmanager
    def count_statements() -> Iterator[list[str]]:
        # Every statement the pool's connections send goes through a cursor.
        statements: list[str] = []
        original = psycopg.AsyncCursor.execute

        async def counting(
            self: psycopg.AsyncCursor[Any], query: Any, *args: Any, **kw: Any
        ) -> Any:
            statements.append(str(query))
            return await original(self, query, *args, **kw)

        with monkeypatch.context() as patch:
            patch.setattr(psycopg.AsyncCursor, "execute", counting)
            yield statements

    yield Backend(name, store, runner.run, sql, count_statements)
    runner.run(store.aclose())


@pytest.fixture(scope="module")
def bouncer(postgres_url: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode with two server connections, used in turn."""
    with running_pgbouncer(pool_size=2, server_round_robin=True) as running:
        running.open_server_connections(postgres_url, 2)
        yield running


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("pgbouncer", marks=[pytest.mark.postgres, pytest.mark.pgbouncer]),
    ]
)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    with asyncio.Runner() as runner:
        if request.param == "sqlite":
            yield from _sqlite_backend(tmp_path / "meta.db", runner)
        elif request.param == "postgresql":
            yield from _postgres_backend(
                request.getfixturevalue("postgres_url"), runner, monkeypatch
            )
        else:
            url = request.getfixturevalue("postgres_url")
            through = request.getfixturevalue("bouncer").url(url)
            yield from _postgres_backend(
                url, runner, monkeypatch, through=through, name="pgbouncer"
            )


# --- upsert and fetch ----------------------------------------------------------------------


def test_records_round_trip(backend: Backend) -> None:
    tokyo = timezone(timedelta(hours=9))
    records = [
        record(
            "c-1",
            doc_id="refunds",
            version="3",
            allowed_principals=("group:support", "user:ann"),
            effective_at=datetime(2025, 1, 1, 9, 0, tzinfo=tokyo),
            expires_at=None,
            source_uri="https://docs.example/refunds",
            requires_signature=True,
            payload_sha256="0f" * 32,
        ),
        record(
            "c-2",
            status=Status.SUPERSEDED,
            superseded_by="c-1",
            effective_at=datetime(2024, 1, 1, tzinfo=UTC),
            expires_at=datetime(2025, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
            text="Caf\u00e9 menu\r\n\u2603",
        ),
        *(record(f"s-{status}", status=status) for status in Status),
    ]
    assert backend.store.upsert(records) == len(records)
    fetched = backend.fetch([r.chunk_id for r in records])
    assert fetched == {r.chunk_id: r for r in records}
    first = fetched["c-1"]
    assert first.effective_at == datetime(2025, 1, 1, 0, 0, tzinfo=UTC)
    assert first.effective_at.utcoffset() == timedelta(0)
    assert first.expires_at is None
    assert first.text is None
    assert first.payload_sha256 == "0f" * 32
    assert fetched["c-2"].payload_sha256 is None
    assert fetched["c-2"].expires_at == datetime(2025, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert fetched["c-2"].text == "Caf\u00e9 menu\r\n\u2603"


def test_absent_and_repeated_ids(backend: Backend) -> None:
    backend.store.upsert([record("c-1")])
    assert backend.fetch(["c-1", "nope", "c-1"]) == {"c-1": record("c-1")}
    assert backend.fetch(["nope"]) == {}
    assert backend.fetch([]) == {}


def test_more_than_a_thousand_ids_in_one_fetch(backend: Backend) -> None:
    records = [record(f"c-{n}") for n in range(2400)]
    backend.store.upsert(records)
    ids = [f"c-{n}" for n in range(2500)]
    assert backend.fetch(ids) == {r.chunk_id: r for r in records}


def test_many_lookups_in_a_row(backend: Backend) -> None:
    # More than psycopg's prepare threshold (5) on one pooled connection: a
    # statement prepared on one server connection must not be looked for on
    # another (PgBouncer's transaction pooling hands out a different one).
    backend.store.upsert([record("c-1"), record("c-2")])
    for n in range(12):
        assert backend.fetch(["c-1", f"nope-{n}"]) == {"c-1": record("c-1")}
    assert backend.store.get("c-2") == record("c-2")


def test_fetch_is_a_single_statement(backend: Backend) -> None:
    backend.store.upsert([record(f"c-{n}") for n in range(600)])
    backend.fetch(["warm-up"])  # a new pooled connection configures itself first
    with backend.count_statements() as statements:
        assert len(backend.fetch([f"c-{n}" for n in range(700)])) == 600
    assert len(statements) == 1
    assert "electronic_signatures" in statements[0]  # signature_valid comes with it


def test_upsert_replaces_existing_records(backend: Backend) -> None:
    backend.store.upsert([record("c-1"), record("c-2")])
    backend.store.upsert([record("c-1", status=Status.REVOKED, text="new text")])
    backend.store.upsert([record("c-2")])  # unchanged
    assert backend.fetch(["c-1", "c-2"]) == {
        "c-1": record("c-1", status=Status.REVOKED, text="new text"),
        "c-2": record("c-2"),
    }


@pytest.mark.parametrize("withdrawn", [Status.REVOKED, Status.QUARANTINED, Status.SUPERSEDED])
@pytest.mark.parametrize("served", [Status.APPROVED, Status.DRAFT])
def test_a_load_never_puts_a_withdrawn_record_back_in_service(
    backend: Backend, withdrawn: Status, served: Status
) -> None:
    successor = "c-9" if withdrawn is Status.SUPERSEDED else None
    backend.store.upsert([record("c-9", doc_id="doc-9")])
    backend.store.upsert([record("c-1", status=withdrawn, superseded_by=successor)])
    with pytest.raises(LifecycleError) as caught:
        backend.store.upsert([record("c-2"), record("c-1", status=served)])
    assert str(caught.value).startswith(f'chunk "c-1", field "status": is {withdrawn} ')
    assert "store load --reinstate" in str(caught.value)
    # Nothing of the batch was written.
    assert backend.fetch(["c-1", "c-2"]) == {
        "c-1": record("c-1", status=withdrawn, superseded_by=successor)
    }
    # Loading it again as it is, or stricter, is fine; reinstating is a decision.
    backend.store.upsert([record("c-1", status=Status.REVOKED)])
    backend.store.upsert([record("c-1", status=served)], reinstate=True)
    assert backend.fetch(["c-1"]) == {"c-1": record("c-1", status=served)}


def test_upsert_sets_changes_and_clears_the_payload_hash(backend: Backend) -> None:
    backend.store.upsert([record("c-1", payload_sha256="1a" * 32), record("c-2")])
    assert backend.fetch(["c-1"])["c-1"].payload_sha256 == "1a" * 32
    backend.store.upsert([record("c-1", payload_sha256="2b" * 32)])
    assert backend.store.get("c-1") == record("c-1", payload_sha256="2b" * 32)
    backend.store.upsert([record("c-1"), record("c-2", payload_sha256="3c" * 32)])
    assert backend.fetch(["c-1", "c-2"]) == {
        "c-1": record("c-1"),
        "c-2": record("c-2", payload_sha256="3c" * 32),
    }


@pytest.mark.parametrize("bad", ["1A" * 32, "1a" * 31, "g" * 64, ""])
def test_malformed_payload_hash_is_refused_and_nothing_written(backend: Backend, bad: str) -> None:
    batch = [record("c-1"), record("c-2", payload_sha256=bad)]
    with pytest.raises(ValueError, match="nothing was written"):
        backend.store.upsert(batch)
    assert backend.fetch(["c-1", "c-2"]) == {}


def test_last_record_of_an_id_wins_within_one_upsert(backend: Backend) -> None:
    assert backend.store.upsert([record("c-1"), record("c-1", version="2")]) == 2
    assert backend.fetch(["c-1"]) == {"c-1": record("c-1", version="2")}


def test_upsert_is_all_or_none(backend: Backend) -> None:
    backend.store.upsert([record("c-1")])
    batch = [
        record("c-1", status=Status.REVOKED),
        record("c-2"),
        record("c-3", sha256="NOT-A-HASH", text="secret chunk text"),
    ]
    with pytest.raises(ValueError, match="nothing was written") as caught:
        backend.store.upsert(batch)
    assert "secret" not in str(caught.value)
    assert backend.fetch(["c-1", "c-2", "c-3"]) == {"c-1": record("c-1")}
    backend.store.upsert([record("c-2")])  # still usable after the rollback
    assert set(backend.fetch(["c-2"])) == {"c-2"}


def test_upsert_refuses_naive_timestamps(backend: Backend) -> None:
    batch = [record("c-1"), record("c-2", expires_at=datetime(2026, 1, 1))]
    with pytest.raises(ValueError, match="no time zone"):
        backend.store.upsert(batch)
    assert backend.fetch(["c-1", "c-2"]) == {}


def test_closed_store_is_unavailable(backend: Backend) -> None:
    backend.store.upsert([record("c-1")])
    backend.fetch(["c-1"])
    backend.run(backend.store.aclose())
    with pytest.raises(StoreUnavailable):
        backend.fetch(["c-1"])
    with pytest.raises(StoreUnavailable):
        backend.store.get("c-1")


# --- approved versions of one document, against the store ---------------------------------


def test_a_version_valid_at_the_same_time_as_a_stored_one_is_refused(backend: Backend) -> None:
    backend.store.upsert([record("v1-a"), record("v1-b")])  # version 1 of "doc", from EFFECTIVE
    later = [record("v2-a", version="2", effective_at=LATER), record("v2-b", version="2")]
    with pytest.raises(VersionOverlap) as caught:
        backend.store.upsert([record("elsewhere", doc_id="other"), *later])
    assert str(caught.value) == (
        'chunk "v2-a", field "effective_at": approved version "2" of document "doc" is valid '
        'at the same time as approved version "1" in the store (chunk "v1-a") for an '
        "overlapping audience; that version must expire at or before this effective_at (give "
        "it an expires_at, or supersede or revoke it), or narrow the audience (and 1 more record)"
    )
    assert backend.fetch(["elsewhere", "v2-a", "v2-b"]) == {}  # nothing of the batch
    earlier = record("v0", version="0", effective_at=EFFECTIVE - timedelta(days=30))
    with pytest.raises(VersionOverlap) as caught:
        backend.store.upsert([earlier])
    assert str(caught.value).startswith(
        'chunk "v0", field "expires_at": approved version "0" of document "doc" is valid at '
        'the same time as approved version "1" in the store (chunk "v1-a") for an overlapping '
        "audience; set expires_at to at most 2025-01-01T00:00:00Z, when that version takes effect"
    )
    backend.store.upsert([replace(earlier, expires_at=EFFECTIVE)])  # as the message says


def test_versions_that_do_not_overlap_are_loaded(backend: Backend) -> None:
    backend.store.upsert([record("v1", expires_at=LATER)])
    backend.store.upsert(
        [
            record("v1-more", expires_at=LATER),  # the same version: its chunks never overlap
            record("v2", version="2", effective_at=LATER),  # from the instant v1 expires
            record("v3", version="3", allowed_principals=("group:qa",)),  # another audience
            record("v4", version="4", status=Status.DRAFT),  # not approved
            record("v5", version="5", tenant_id="globex"),  # another tenant's document
        ]
    )
    # Chunks loaded again replace their stored version rather than overlap it.
    again = [record(chunk_id, version="1.1", expires_at=LATER) for chunk_id in ("v1", "v1-more")]
    backend.store.upsert(again)
    assert backend.fetch(["v1", "v1-more"]) == {r.chunk_id: r for r in again}


def test_only_approved_versions_count_and_approving_is_checked_too(backend: Backend) -> None:
    backend.store.upsert([record("v1")])
    backend.store.set_status("v1", Status.REVOKED)
    backend.store.upsert([record("v2", version="2")])  # v1 is out of service
    with pytest.raises(VersionOverlap) as caught:
        backend.store.set_status("v1", Status.APPROVED)  # `store reinstate`
    assert str(caught.value) == (
        'chunk "v1", field "status": approving it would make version "1" of document "doc" '
        'valid at the same time as approved version "2" (chunk "v2") for an overlapping '
        "audience; supersede or revoke that chunk first"
    )
    with pytest.raises(VersionOverlap):
        backend.store.upsert([record("v1")], reinstate=True)  # on purpose, but still two at once
    assert backend.fetch(["v1"])["v1"].status is Status.REVOKED
    backend.store.set_status("v2", Status.QUARANTINED)
    assert backend.store.set_status("v1", Status.APPROVED).status is Status.APPROVED


def test_concurrent_loads_of_overlapping_versions_never_both_succeed(backend: Backend) -> None:
    # PostgreSQL: each load in a transaction of its own, at the same moment; neither
    # sees the other's rows before it commits unless loads are serialised.
    for attempt in range(8):
        doc = f"doc-{attempt}"
        start = threading.Barrier(2)

        def load(version: str, doc: str = doc, start: threading.Barrier = start) -> bool:
            start.wait()
            try:
                backend.store.upsert([record(f"{doc}-v{version}", doc_id=doc, version=version)])
            except VersionOverlap:
                return False
            return True

        with ThreadPoolExecutor(2) as pool:
            loaded = list(pool.map(load, ["1", "2"]))
        assert sorted(loaded) == [False, True], f"attempt {attempt}: {loaded}"


# --- what a load would do ------------------------------------------------------------------


def test_preview_says_what_a_load_would_do_and_writes_nothing(backend: Backend) -> None:
    stored = [
        record("same"),
        record("changed", text="old text"),
        record("gone", status=Status.REVOKED),
        record("v1", doc_id="manual"),
    ]
    backend.store.upsert(stored)
    ids = ["same", "changed", "gone", "v1", "new", "v2"]
    before = [backend.store.get(chunk_id) for chunk_id in ids]
    batch = [
        record("new"),
        record("same"),
        record("changed", status=Status.QUARANTINED, text="new text"),
        record("gone"),
        record("v2", doc_id="manual", version="2"),
    ]
    preview = backend.store.preview(batch)
    assert preview.added == ("new", "v2")
    assert preview.changed == (("changed", ("status", "text")), ("gone", ("status",)))
    assert preview.unchanged == 1
    assert [str(problem) for problem in preview.refused] == [
        'chunk "gone", field "status": is revoked in the store and the file would make it '
        "approved; reinstate on purpose with `store load --reinstate` or `store reinstate`",
        'chunk "v2", field "effective_at": approved version "2" of document "manual" is valid '
        'at the same time as approved version "1" in the store (chunk "v1") for an overlapping '
        "audience; that version must expire at or before this effective_at (give it an "
        "expires_at, or supersede or revoke it), or narrow the audience",
    ]
    reinstating = backend.store.preview(batch, reinstate=True)
    assert [problem.chunk_id for problem in reinstating.refused] == ["v2"]
    assert [backend.store.get(chunk_id) for chunk_id in ids] == before


def test_preview_of_more_ids_than_one_query_takes(backend: Backend) -> None:
    backend.store.upsert([record(f"c-{n}") for n in range(1500)])
    batch = [
        record(f"c-{n}", status=Status.REVOKED if n < 10 else Status.APPROVED) for n in range(2000)
    ]
    preview = backend.store.preview(batch)
    assert len(preview.added) == 500 and len(preview.changed) == 10
    assert preview.unchanged == 1490 and preview.refused == ()


# --- get and status changes ----------------------------------------------------------------


def test_get_returns_one_record_with_its_text(backend: Backend) -> None:
    backend.store.upsert([record("c-1", text="the text"), record("c-2")])
    assert backend.store.get("c-1") == record("c-1", text="the text")
    assert backend.store.get("nope") is None


@pytest.mark.parametrize("status", [Status.REVOKED, Status.QUARANTINED, Status.APPROVED])
def test_set_status(backend: Backend, status: Status) -> None:
    backend.store.upsert([record("c-1", status=Status.SUPERSEDED, superseded_by="c-0")])
    changed = backend.store.set_status("c-1", status)
    # Any status but superseded clears the successor.
    assert changed == record("c-1", status=status)
    assert backend.store.get("c-1") == changed
    assert backend.fetch(["c-1"]) == {"c-1": changed}


def test_status_change_keeps_the_payload_hash(backend: Backend) -> None:
    backend.store.upsert([record("c-1", payload_sha256="4d" * 32)])
    changed = backend.store.set_status("c-1", Status.REVOKED)
    assert changed == record("c-1", status=Status.REVOKED, payload_sha256="4d" * 32)
    assert backend.fetch(["c-1"]) == {"c-1": changed}


def test_set_status_of_an_unknown_chunk(backend: Backend) -> None:
    with pytest.raises(ChunkNotFound) as caught:
        backend.store.set_status("nope", Status.REVOKED)
    assert str(caught.value) == 'chunk "nope": no such record'


def test_supersede(backend: Backend) -> None:
    old, new = record("old", expires_at=LATER), record("new", version="2", effective_at=LATER)
    backend.store.upsert([old, new])
    changed = backend.store.set_status("old", Status.SUPERSEDED, superseded_by="new")
    assert changed == replace(old, status=Status.SUPERSEDED, superseded_by="new")
    assert backend.store.get("old") == changed
    assert backend.store.get("new") == new


@pytest.mark.parametrize(
    ("status", "successor", "message"),
    [
        (Status.SUPERSEDED, None, "needs the id of the chunk that replaces it"),
        (Status.SUPERSEDED, "old", "cannot supersede itself"),
        (Status.SUPERSEDED, "missing", 'successor chunk "missing" has no record'),
        (Status.SUPERSEDED, "revoked", 'successor chunk "revoked" is itself revoked'),
        (Status.SUPERSEDED, "superseded", 'successor chunk "superseded" is itself superseded'),
        (Status.SUPERSEDED, "foreign", 'successor chunk "foreign" belongs to another tenant'),
        (Status.REVOKED, "new", "only a superseded chunk names a successor"),
    ],
)
def test_refused_status_changes_change_nothing(
    backend: Backend, status: Status, successor: str | None, message: str
) -> None:
    backend.store.upsert(
        [
            record("old"),
            record("new"),
            record("revoked", status=Status.REVOKED),
            record("superseded", status=Status.SUPERSEDED, superseded_by="new"),
            record("foreign", tenant_id="globex"),
        ]
    )
    with pytest.raises(LifecycleError, match=message) as caught:
        backend.store.set_status("old", status, superseded_by=successor)
    assert str(caught.value).startswith('chunk "old", field "superseded_by": ')
    assert backend.store.get("old") == record("old")


# --- electronic signatures -----------------------------------------------------------------


def test_signature_valid_needs_a_valid_signature_for_the_same_version(backend: Backend) -> None:
    backend.store.upsert(
        [
            record("c-1", doc_id="sop-7", version="2", requires_signature=True),
            record("c-2", doc_id="sop-7", version="2", requires_signature=True),
            record(
                "c-3",
                doc_id="sop-7",
                version="1",
                requires_signature=True,
                status=Status.SUPERSEDED,
                superseded_by="c-1",
            ),
            record("c-4", doc_id="sop-8", version="2", requires_signature=True),
        ]
    )
    ids = ["c-1", "c-2", "c-3", "c-4"]
    assert not any(r.signature_valid for r in backend.fetch(ids).values())
    backend.sign("sop-7", "2")
    backend.sign("sop-8", "2", valid=False)
    fetched = backend.fetch(ids)
    assert {i for i, r in fetched.items() if r.signature_valid} == {"c-1", "c-2"}
    got = backend.store.get("c-1")
    assert got is not None and got.signature_valid


def test_invalidated_signature_no_longer_counts(backend: Backend) -> None:
    backend.store.upsert([record("c-1", doc_id="sop-7", version="2", requires_signature=True)])
    backend.sign("sop-7", "2")
    assert backend.fetch(["c-1"])["c-1"].signature_valid
    backend.sql(
        "UPDATE electronic_signatures SET is_valid = %s WHERE doc_id = %s", (False, "sop-7")
    )
    assert not backend.fetch(["c-1"])["c-1"].signature_valid
    backend.sign("sop-7", "2")  # signed again
    assert backend.fetch(["c-1"])["c-1"].signature_valid


def test_signature_valid_is_never_taken_from_input(backend: Backend) -> None:
    backend.store.upsert([record("c-1", signature_valid=True)])
    assert backend.fetch(["c-1"]) == {"c-1": record("c-1", signature_valid=False)}
