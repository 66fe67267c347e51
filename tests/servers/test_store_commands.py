"""The `store` subcommands on both backends: exit codes, messages, what they change."""

from __future__ import annotations

import argparse
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest

from sidecar.cli.store import add_store_parsers
from sidecar.core.integrity import canonical_fields, fields_sha256
from sidecar.store.change_poll import APPLIED_WITHIN_SECONDS, POLL_SECONDS
from sidecar.store.listener import HEARTBEAT_SECONDS
from sidecar.store.loader import parse_record
from sidecar.store.open import open_store
from sidecar.store.postgres import migrate
from tests.fixtures.harness import write_records
from tests.fixtures.postgres import fresh_database
from tests.fixtures.records import record_dict, text_for
from tests.fixtures.stores import new_sqlite_url

PASSWORD = "s3cret-Pw"


def run(*argv: str) -> int:
    """Parse ``argv`` as `retrieval-gate store ...` would and run the command."""
    parser = argparse.ArgumentParser()
    add_store_parsers(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture(scope="module")
def pg_url() -> Iterator[str]:
    with fresh_database() as url:
        migrate(url)
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty store."""
    if request.param == "sqlite":
        return new_sqlite_url(tmp_path / "gate.db")
    url: str = request.getfixturevalue("pg_url")
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("TRUNCATE chunks, electronic_signatures")
    return url


@pytest.fixture
def loaded(store: str, tmp_path: Path) -> str:
    """The store with chunks old, new, gone (revoked) and other (another tenant)."""
    records = [
        record_dict("old", text=text_for("old")),
        record_dict("new", version="2"),
        record_dict("gone", status="revoked"),
        record_dict("other", tenant_id="globex"),
    ]
    assert run("load", "--store", store, str(write_records(tmp_path / "c.jsonl", records))) == 0
    return store


def bound(store: str) -> str:
    """What a command that changed records says about when running gates apply it."""
    if store.startswith("sqlite:"):
        # The SQLite change poll's interval (sidecar.store.change_poll), not a fixed text.
        return (
            f"running gates apply the change within {APPLIED_WITHIN_SECONDS:g} s (each checks "
            f"the SQLite file for changes every {POLL_SECONDS:g} s)"
        )
    return (
        "running gates apply the change at once (PostgreSQL notification); a gate whose "
        f"LISTEN connection broke unnoticed, within {2 * HEARTBEAT_SECONDS:g} s (listener "
        f"heartbeat every {HEARTBEAT_SECONDS:g} s)"
    )


def shown(store: str, chunk_id: str, capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    capsys.readouterr()
    assert run("show", "--store", store, chunk_id) == 0
    shown: dict[str, object] = orjson.loads(capsys.readouterr().out)
    return shown


def test_load(store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    chunks = write_records(tmp_path / "chunks.jsonl", [record_dict("a"), record_dict("b")])
    assert run("load", "--store", store, str(chunks)) == 0
    assert capsys.readouterr().out == f"loaded 2 records from {chunks}; {bound(store)}\n"
    assert shown(store, "b", capsys)["status"] == "approved"


def test_load_of_an_invalid_file_loads_nothing(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunks = write_records(
        tmp_path / "chunks.jsonl",
        [record_dict("good"), record_dict("bad", effective_at="2025-01-01T00:00:00")],
    )
    assert run("load", "--store", store, str(chunks)) == 1
    err = capsys.readouterr().err
    assert 'line 2 (chunk "bad"), field "effective_at"' in err
    assert "nothing was loaded" in err
    assert run("show", "--store", store, "good") == 1


def test_load_of_a_missing_file(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("load", "--store", store, str(tmp_path / "nope.jsonl")) == 1
    assert "error: cannot read" in capsys.readouterr().err


def test_show_leaves_the_text_out_unless_asked(
    loaded: str, capsys: pytest.CaptureFixture[str]
) -> None:
    record = shown(loaded, "old", capsys)
    assert "text" not in record
    assert record == {**record_dict("old"), "payload_sha256": None, "signature_valid": False}
    assert text_for("old") not in orjson.dumps(record).decode()
    assert run("show", "--store", loaded, "old", "--with-text") == 0
    assert orjson.loads(capsys.readouterr().out)["text"] == text_for("old")


def test_load_hashes_the_payload_and_show_prints_only_its_hash(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = {"title": "Secret title", "metadata.source": "kb/7"}
    chunks = write_records(tmp_path / "c.jsonl", [record_dict("a", payload=payload)])
    assert run("load", "--store", store, str(chunks)) == 0
    record = shown(store, "a", capsys)
    assert record["payload_sha256"] == fields_sha256(canonical_fields(payload))
    assert "payload" not in record
    assert "Secret title" not in orjson.dumps(record).decode()


def test_show_of_an_unknown_chunk(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("show", "--store", loaded, "nope") == 1
    assert capsys.readouterr().err == 'error: chunk "nope": no such record\n'


@pytest.mark.parametrize(
    ("command", "status"), [("revoke", "revoked"), ("quarantine", "quarantined")]
)
def test_revoke_and_quarantine(
    loaded: str, command: str, status: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(command, "--store", loaded, "old") == 0
    assert capsys.readouterr().out == f'chunk "old" is now {status}; {bound(loaded)}\n'
    # Exactly that chunk changed: every other one keeps its status.
    statuses = {c: shown(loaded, c, capsys)["status"] for c in ("old", "new", "gone", "other")}
    assert statuses == {"old": status, "new": "approved", "gone": "revoked", "other": "approved"}
    assert run(command, "--store", loaded, "nope") == 1
    assert capsys.readouterr().err == 'error: nothing changed: chunk "nope": no such record\n'


def test_supersede(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("supersede", "--store", loaded, "old", "--by", "new") == 0
    assert capsys.readouterr().out == (
        f'chunk "old" is now superseded, superseded by "new"; {bound(loaded)}\n'
    )
    record = shown(loaded, "old", capsys)
    assert (record["status"], record["superseded_by"]) == ("superseded", "new")


@pytest.mark.parametrize(
    ("new", "problem"),
    [
        ("missing", 'successor chunk "missing" has no record; load it first'),
        ("gone", 'successor chunk "gone" is itself revoked'),
        ("other", 'successor chunk "other" belongs to another tenant'),
    ],
)
def test_refused_supersede_changes_nothing(
    loaded: str, new: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("supersede", "--store", loaded, "old", "--by", new) == 1
    err = capsys.readouterr().err
    assert err == f'error: nothing changed: chunk "old", field "superseded_by": {problem}\n'
    assert shown(loaded, "old", capsys)["status"] == "approved"


def test_only_migrate_creates_a_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gate.db"
    url = f"sqlite:///{path}"
    chunks = str(write_records(tmp_path / "c.jsonl", [record_dict("a")]))
    for argv in (
        ("load", "--store", url, chunks),
        ("load", "--store", url, chunks, "--dry-run"),
        ("show", "--store", url, "a"),
        ("revoke", "--store", url, "a"),
        ("reinstate", "--store", url, "a"),
    ):
        assert run(*argv) == 2, argv
        assert capsys.readouterr().err == (
            f"error: SQLite metadata store {path} does not exist; create it with: "
            f"retrieval-gate store migrate --store {url}\n"
        )
        assert not path.exists()
    assert run("migrate", "--store", url) == 0
    assert (
        capsys.readouterr().out == f"created SQLite store {path}\nSQLite schema is at version 3\n"
    )
    assert run("migrate", "--store", url) == 0
    assert capsys.readouterr().out == "SQLite schema is at version 3\n"
    assert run("load", "--store", url, chunks) == 0


@pytest.mark.postgres
def test_migrate_postgres(capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_database() as url:
        assert run("show", "--store", url, "c-1") == 1
        assert "has no retrieval-gate schema; create it with: retrieval-gate store migrate" in (
            capsys.readouterr().err
        )
        assert run("migrate", "--store", url) == 0
        assert capsys.readouterr().out == (
            "applied migration 0001 chunks\n"
            "applied migration 0002 electronic_signatures\n"
            "applied migration 0003 payload_sha256\n"
            "PostgreSQL schema is at version 3\n"
        )
        assert run("migrate", "--store", url) == 0
        assert capsys.readouterr().out == "PostgreSQL schema is at version 3\n"


@pytest.mark.parametrize(
    ("argv", "code"),
    [
        (("show", "--store", f"mysql://gate:{PASSWORD}@db/gate", "c-1"), 2),
        (("revoke", "--store", f"postgresql://gate:{PASSWORD}/x@db/gate", "c-1"), 2),
        (("migrate", "--store", f"postgresql://gate:{PASSWORD}/x@db/gate"), 2),
        (("show", "--store", f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate", "c-1"), 1),
        (("migrate", "--store", f"postgresql://gate:{PASSWORD}@127.0.0.1:1/gate"), 1),
    ],
)
def test_store_errors_never_show_the_password(
    argv: tuple[str, ...], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(*argv) == code
    out, err = capsys.readouterr()
    assert err.startswith("error: ")
    assert PASSWORD not in out + err


def test_signature_valid_is_not_loadable_input(
    store: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chunks = write_records(tmp_path / "c.jsonl", [record_dict("a", signature_valid=True)])
    assert run("load", "--store", store, str(chunks)) == 1
    assert 'line 1 (chunk "a"), field "signature_valid": unknown field' in capsys.readouterr().err


def test_shown_record_loads_back_unchanged(loaded: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("show", "--store", loaded, "old", "--with-text") == 0
    record = orjson.loads(capsys.readouterr().out)
    del record["signature_valid"]
    store = open_store(loaded)
    try:
        assert parse_record(record) == store.get("old")
    finally:
        store.close()


def test_loading_again_never_reinstates_a_revoked_chunk(
    loaded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The file a team loaded before "gone" was revoked, loaded once more.
    again = write_records(tmp_path / "again.jsonl", [record_dict("gone"), record_dict("new2")])
    capsys.readouterr()
    assert run("load", "--store", loaded, str(again)) == 1
    error = capsys.readouterr().err
    assert error.startswith('error: nothing loaded: chunk "gone", field "status": is revoked ')
    assert error.count("\n") == 1
    assert shown(loaded, "gone", capsys)["status"] == "revoked"
    assert run("show", "--store", loaded, "new2") == 1  # nothing of the file was written
    # On purpose: the flag, or the command.
    assert run("load", "--store", loaded, str(again), "--reinstate") == 0
    assert shown(loaded, "gone", capsys)["status"] == "approved"
    assert run("revoke", "--store", loaded, "gone") == 0
    capsys.readouterr()
    assert run("reinstate", "--store", loaded, "gone") == 0
    assert capsys.readouterr().out == f'chunk "gone" is now approved; {bound(loaded)}\n'


def rows(store: str) -> list[tuple[object, ...]]:
    """Every stored record, every column, straight from the database."""
    query = "SELECT * FROM chunks ORDER BY chunk_id"
    if store.startswith("sqlite:///"):
        with sqlite3.connect(store.removeprefix("sqlite:///")) as file:
            found = file.execute(query).fetchall()
        file.close()
        return found
    with psycopg.connect(store) as database:
        return database.execute(query).fetchall()


def test_a_version_valid_at_the_same_time_as_a_stored_one_is_refused(
    loaded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # "new" is version 2 of doc-new, approved from 2025-01-01 with no end.
    v3 = record_dict("new-v3", doc_id="doc-new", version="3", effective_at="2026-01-01T00:00:00Z")
    capsys.readouterr()
    assert run("load", "--store", loaded, str(write_records(tmp_path / "v3.jsonl", [v3]))) == 1
    assert capsys.readouterr().err == (
        'error: nothing loaded: chunk "new-v3", field "effective_at": approved version "3" of '
        'document "doc-new" is valid at the same time as approved version "2" in the store '
        '(chunk "new") for an overlapping audience; that version must expire at or before this '
        "effective_at (give it an expires_at, or supersede or revoke it), or narrow the audience\n"
    )
    assert run("show", "--store", loaded, "new-v3") == 1
    # Version 2 ends where version 3 begins: loaded together, or version 2 first.
    ends = record_dict("new", version="2", expires_at="2026-01-01T00:00:00Z")
    both = write_records(tmp_path / "both.jsonl", [ends, v3])
    assert run("load", "--store", loaded, str(both)) == 0


def test_dry_run_prints_what_would_change_and_writes_nothing(
    loaded: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = rows(loaded)
    moved = "https://docs.example/moved"
    records = [
        record_dict("fresh"),
        record_dict("old", text=text_for("old")),  # as stored
        record_dict("other", tenant_id="globex", status="quarantined"),
        record_dict("new", version="2", source_uri=moved, text=text_for("new")),
    ]
    chunks = write_records(tmp_path / "c.jsonl", records)
    capsys.readouterr()
    assert run("load", "--store", loaded, str(chunks), "--dry-run") == 0
    out, err = capsys.readouterr()
    assert out == (
        'add     "fresh"\n'
        'change  "other": status\n'
        'change  "new": source_uri, text\n'
        "dry run, nothing written: 1 to add, 2 to change, 1 unchanged, 0 refused\n"
    )
    assert err == ""
    assert rows(loaded) == before

    refused = [
        *records[:3],
        record_dict("gone"),  # revoked in the store
        record_dict("new-v3", doc_id="doc-new", version="3"),  # while version 2 is approved
    ]
    chunks = write_records(tmp_path / "refused.jsonl", refused)
    assert run("load", "--store", loaded, str(chunks), "--dry-run") == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[:4] == [
        'add     "fresh"',
        'add     "new-v3"',
        'change  "other": status',
        'change  "gone": status',
    ]
    assert lines[4].startswith('refuse  chunk "gone", field "status": is revoked in the store ')
    assert lines[5].startswith('refuse  chunk "new-v3", field "effective_at": approved version ')
    assert lines[6:] == ["dry run, nothing written: 2 to add, 2 to change, 1 unchanged, 2 refused"]
    assert err == "error: the load would be refused (2 records above)\n"
    for chunk_id in ("old", "new"):
        assert text_for(chunk_id) not in out + err  # ids and field names, never text
    assert rows(loaded) == before
    # The load itself ends as its dry run said.
    assert run("load", "--store", loaded, str(chunks)) == 1
    assert capsys.readouterr().err.startswith('error: nothing loaded: chunk "gone", field "status"')
    assert rows(loaded) == before
