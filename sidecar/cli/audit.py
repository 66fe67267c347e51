"""`retrieval-gate audit verify`: check the hash chain of a JSON Lines log or of PostgreSQL."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psycopg

from sidecar.audit.verify import ChainReport, verify_chain, verify_postgres_chain
from sidecar.cli.exit_codes import ExitCode
from sidecar.postgres.dsn import parse_postgres_url


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit`` and its subcommands to the top-level ``commands``."""
    audit = commands.add_parser("audit", help="audit log tools")
    audit_commands = audit.add_subparsers(dest="audit_command", required=True)
    verifying = audit_commands.add_parser("verify", help="check the hash chain of an audit log")
    add_verify_arguments(verifying)
    verifying.set_defaults(func=verify)


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``verify`` reads: FILE, or --store URL [--chain ID]."""
    parser.add_argument("file", type=Path, nargs="?", help="JSON Lines audit log")
    parser.add_argument(
        "--store", help="PostgreSQL URL of the audit_records table, instead of FILE"
    )
    parser.add_argument("--chain", help="with --store: only this chain id (default: every chain)")


def verify(args: argparse.Namespace) -> int:
    """Verify FILE or --store; exit 0 when intact, 1 when broken or unreadable, 2 on misuse.

    The store URL is never echoed with its password.
    """
    file: Path | None = args.file
    store: str | None = args.store
    chain: str | None = args.chain
    if (file is None) == (store is None):
        return _usage("give either an audit log FILE or --store URL")
    if file is not None:
        if chain is not None:
            return _usage("--chain applies to --store only")
        if not file.is_file():
            return _usage(f"no such audit log: {file}")
        return _print_reports([verify_chain(file)])
    assert store is not None
    try:
        url = parse_postgres_url(store)
    except ValueError as exc:  # the message carries the URL redacted
        return _usage(str(exc))
    try:
        reports = verify_postgres_chain(url.url, chain)
    except psycopg.Error as exc:
        print(
            f"error: cannot read audit records from {url.redacted}: "
            f"{type(exc).__name__}: {url.scrub(str(exc).strip())}",
            file=sys.stderr,
        )
        return ExitCode.FAILED
    if not reports:
        print("ok: no audit chains in the table")
        return ExitCode.OK
    return _print_reports(reports)


def _print_reports(reports: list[ChainReport]) -> int:
    for report in reports:
        if report.ok:
            name = f"chain {report.chain_id}: " if report.chain_id is not None else ""
            print(
                f"ok: {name}{report.records} records, chain intact, "
                f"head sha256 {report.head_sha256}"
            )
        else:
            name = f" chain {report.chain_id}" if report.chain_id is not None else ""
            print(
                f"BROKEN{name} after {report.records} good records: {report.problem}",
                file=sys.stderr,
            )
    return ExitCode.OK if all(report.ok for report in reports) else ExitCode.FAILED


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return ExitCode.CANNOT_RUN
