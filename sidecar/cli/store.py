"""The ``retrieval-gate store ...`` subcommands, as functions of parsed arguments.

Each returns the process exit code: 0 done, 1 refused or failed (nothing was
changed), 2 unusable store URL or a SQLite store not created yet (only
``migrate`` creates one). Errors go to stderr and name the record and field.
The store URL is never printed unredacted (it may carry a password), and chunk
text only by ``show --with-text``. A command that changes records says how
soon running gates apply the change (``watch.propagation_bound``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.help_text import plain
from sidecar.core.chunk_record import Status
from sidecar.store import postgres, sqlite
from sidecar.store.loader import RecordsInvalid, load_jsonl, quote_for_message, record_to_json
from sidecar.store.open import open_store, sqlite_path
from sidecar.store.schema import latest_version
from sidecar.store.store import (
    LifecycleError,
    LoadPreview,
    MetadataStore,
    StoreNotCreated,
    StoreUnavailable,
)
from sidecar.store.watch import propagation_bound


def load(args: argparse.Namespace) -> int:
    """``store load --store URL FILE [--reinstate] [--dry-run]``: validate a JSON Lines file
    and upsert it, all or none.

    A record the store holds as revoked, quarantined or superseded is not made
    approved or draft again by the file (the load is refused, naming it) unless
    ``--reinstate`` is given. An approved record whose validity overlaps
    another approved version of its document in the store, for a shared
    principal, is refused too.

    ``--dry-run`` writes nothing: it prints what the load would add, change
    (which fields) and leave unchanged, and what it would refuse and why, by
    chunk id (never text); the exit code is the load's.
    """
    try:
        records = load_jsonl(args.file)
    except RecordsInvalid as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"cannot read {args.file}: {exc.strerror or exc}")

    def upsert(store: MetadataStore) -> int:
        count = store.upsert(records, reinstate=args.reinstate)
        print(f"loaded {count} records from {args.file}; {propagation_bound(args.store)}")
        return ExitCode.OK

    def preview(store: MetadataStore) -> int:
        return _print_preview(store.preview(records, reinstate=args.reinstate))

    if args.dry_run:
        return _with_store(args.store, preview)
    return _with_store(args.store, upsert, failure="nothing loaded: ")


def migrate(args: argparse.Namespace) -> int:
    """``store migrate --store URL``: create the store, or bring its schema to this build's
    version.

    PostgreSQL applies the pending versioned migrations to an existing
    database; SQLite creates the file (its directory must exist) or upgrades
    it. Every other command refuses a SQLite file that does not exist.
    """
    try:
        path = sqlite_path(args.store)
    except ValueError as exc:
        return _fail(str(exc), ExitCode.CANNOT_RUN)
    if path is not None:
        return _migrate_sqlite(path)
    try:
        applied = postgres.migrate(args.store)
    except ValueError as exc:
        return _fail(str(exc), ExitCode.CANNOT_RUN)
    except StoreUnavailable as exc:
        return _fail(str(exc))
    for migration in applied:
        print(f"applied migration {migration.version:04d} {migration.name}")
    print(f"PostgreSQL schema is at version {latest_version()}")
    return ExitCode.OK


def revoke(args: argparse.Namespace) -> int:
    """``store revoke --store URL ID``: the chunk is never admitted again (STATUS_REVOKED)."""
    return _set_status(args.store, args.chunk_id, Status.REVOKED)


def quarantine(args: argparse.Namespace) -> int:
    """``store quarantine --store URL ID``: withhold the chunk pending review."""
    return _set_status(args.store, args.chunk_id, Status.QUARANTINED)


def reinstate(args: argparse.Namespace) -> int:
    """``store reinstate --store URL ID``: serve a revoked, quarantined or superseded chunk
    again (approved), on purpose."""
    return _set_status(args.store, args.chunk_id, Status.APPROVED)


def supersede(args: argparse.Namespace) -> int:
    """``store supersede --store URL OLD --by NEW``: OLD is replaced by NEW, which must exist."""
    return _set_status(args.store, args.old, Status.SUPERSEDED, superseded_by=args.by)


def show(args: argparse.Namespace) -> int:
    """``store show --store URL ID [--with-text]``: print the record as JSON.

    The output is the record's JSON Lines form plus ``signature_valid``;
    ``text`` is left out unless ``--with-text`` is given.
    """

    def print_record(store: MetadataStore) -> int:
        record = store.get(args.chunk_id)
        if record is None:
            return _fail(f"chunk {quote_for_message(args.chunk_id)}: no such record")
        shown = record_to_json(record, with_text=args.with_text)
        shown["signature_valid"] = record.signature_valid
        print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
        return ExitCode.OK

    return _with_store(args.store, print_record)


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``store`` and its subcommands to the top-level ``commands``."""
    store = commands.add_parser("store", help="manage the metadata store")
    add_store_parsers(store.add_subparsers(dest="store_command", required=True))


def add_store_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the store subcommands to ``commands`` (the subparsers of ``store``)."""

    def command(
        name: str, func: Callable[[argparse.Namespace], int], summary: str
    ) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=summary, description=plain(func.__doc__))
        parser.add_argument(
            "--store",
            required=True,
            help="store URL, e.g. sqlite:///gate.db or postgresql://gate@db/gate "
            "(put the password in PGPASSWORD or ~/.pgpass, not in the URL)",
        )
        parser.set_defaults(func=func)
        return parser

    loading = command("load", load, "validate a JSON Lines file and upsert it (all or nothing)")
    loading.add_argument("file", type=Path)
    loading.add_argument(
        "--reinstate",
        action="store_true",
        help="let the file make revoked, quarantined or superseded records approved or "
        "draft again (refused by default)",
    )
    loading.add_argument(
        "--dry-run",
        action="store_true",
        help="write nothing: print what would be added, changed and refused, by chunk id",
    )
    command("migrate", migrate, "create the store, or upgrade its schema")
    command("revoke", revoke, "revoke a chunk").add_argument("chunk_id", metavar="ID")
    command("quarantine", quarantine, "quarantine a chunk").add_argument("chunk_id", metavar="ID")
    command("reinstate", reinstate, "serve a withdrawn chunk again (approved)").add_argument(
        "chunk_id", metavar="ID"
    )
    superseding = command("supersede", supersede, "mark a chunk superseded by another")
    superseding.add_argument("old", metavar="OLD")
    superseding.add_argument("--by", required=True, metavar="NEW")
    showing = command("show", show, "print a chunk's record as JSON (without its text)")
    showing.add_argument("chunk_id", metavar="ID")
    showing.add_argument(
        "--with-text", action="store_true", help="include the chunk text (off by default)"
    )


def _migrate_sqlite(path: str) -> int:
    existed = os.path.exists(path)
    try:
        before = sqlite.migrate(path)
    except StoreUnavailable as exc:
        return _fail(str(exc))
    if before is None:
        print(f"created the schema in {path}" if existed else f"created SQLite store {path}")
    elif before != sqlite.SCHEMA_VERSION:
        print(f"upgraded SQLite schema from version {before}")
    print(f"SQLite schema is at version {sqlite.SCHEMA_VERSION}")
    return ExitCode.OK


def _print_preview(preview: LoadPreview) -> int:
    """Print a load's preview, one line per record it would write or refuse; the exit
    code the load would end with."""
    for chunk_id in preview.added:
        print(f"add     {quote_for_message(chunk_id)}")
    for chunk_id, fields in preview.changed:
        print(f"change  {quote_for_message(chunk_id)}: {', '.join(fields)}")
    for problem in preview.refused:
        print(f"refuse  {problem}")
    print(
        f"dry run, nothing written: {len(preview.added)} to add, {len(preview.changed)} to "
        f"change, {preview.unchanged} unchanged, {len(preview.refused)} refused"
    )
    refused = len(preview.refused)
    if refused:
        return _fail(f"the load would be refused ({refused} record{'s' * (refused > 1)} above)")
    return ExitCode.OK


def _set_status(
    url: str, chunk_id: str, status: Status, *, superseded_by: str | None = None
) -> int:
    def change(store: MetadataStore) -> int:
        record = store.set_status(chunk_id, status, superseded_by)
        done = f"chunk {quote_for_message(record.chunk_id)} is now {record.status}"
        if record.superseded_by is not None:
            done += f", superseded by {quote_for_message(record.superseded_by)}"
        print(f"{done}; {propagation_bound(url)}")
        return ExitCode.OK

    return _with_store(url, change, failure="nothing changed: ")


def _with_store(url: str, action: Callable[[MetadataStore], int], *, failure: str = "") -> int:
    try:
        store = open_store(url)
    except StoreNotCreated as exc:
        return _fail(str(exc), ExitCode.CANNOT_RUN)
    except StoreUnavailable as exc:
        return _fail(str(exc))
    except ValueError as exc:
        return _fail(str(exc), ExitCode.CANNOT_RUN)
    try:
        return action(store)
    except (LifecycleError, ValueError, StoreUnavailable) as exc:
        return _fail(f"{failure}{exc}")
    finally:
        store.close()


def _fail(message: str, code: int = ExitCode.FAILED) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code
