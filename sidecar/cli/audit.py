"""`retrieval-gate audit verify`: check the hash chain of audit files, of PostgreSQL, or both."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sidecar.audit.checkpoints import (
    Checkpoint,
    CheckpointError,
    checkpoints_path,
    key_fingerprint,
    load_public_key,
    read_checkpoints,
)
from sidecar.audit.coverage import CheckpointCoverage
from sidecar.audit.segments import in_chain_order, log_files, log_of
from sidecar.audit.verify import (
    ChainReport,
    verify_postgres_chain,
    verify_segments,
    verify_store_and_segments,
)
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
    """The arguments ``verify`` reads: FILE..., --store URL [--chain ID], --anchored,
    --public-key [ID=]FILE..."""
    parser.add_argument(
        "files",
        type=Path,
        nargs="*",
        metavar="FILE",
        help="audit files: the audit.log path (its sealed segments beside it are included) "
        "or segment files, verified as one chain in seq order",
    )
    parser.add_argument(
        "--store",
        help="PostgreSQL URL of the audit_records table; with FILEs, --chain names the "
        "chain the files continue",
    )
    parser.add_argument("--chain", help="with --store: only this chain id (default: every chain)")
    parser.add_argument(
        "--anchored",
        action="store_true",
        help="FILEs only: accept files that start after seq 1 (earlier segments deleted by "
        "retention or after shipping); the first record's prev_sha256 is then taken on "
        "trust and reported",
    )
    parser.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="[ID=]FILE",
        help="Ed25519 public key (PEM) that signs checkpoints, repeatable (old and new key "
        "while rotating); ID is the key id the gate was given (audit.checkpoint_key_id), "
        "by default the key's fingerprint. Then every record must be covered by a valid "
        "checkpoint",
    )


def verify(args: argparse.Namespace) -> int:
    """Verify FILEs, --store, or both; exit 0 when intact, 1 when broken or unreadable,
    2 on misuse.

    The store URL is never echoed with its password.
    """
    given: list[Path] = args.files
    store: str | None = args.store
    chain: str | None = args.chain
    if not given and store is None:
        return _usage("give audit log FILEs, --store URL, or both")
    if store is None and chain is not None:
        return _usage("--chain applies to --store only")
    if store is not None and args.anchored:
        return _usage("--anchored applies to FILEs alone: the table starts the chain")
    if given and store is not None and chain is None:
        return _usage("with FILEs and --store, name the files' chain with --chain")
    try:
        keys = _public_keys(args.public_key)
    except ValueError as exc:
        return _usage(str(exc))
    files: list[Path] = []
    for path in given:
        if path.is_dir():
            return _usage(f"{path} is a directory: give the audit.log path or segment files")
        found = log_files(path)
        if not found:
            return _usage(f"no such audit log: {path}")
        files.extend(found)
    beside = {checkpoints_path(log_of(path)) for path in given}
    found = [path for path in beside if path.exists()]
    if keys is not None and len(found) > 1:
        return _usage("with --public-key, give the files of one audit log (one checkpoints file)")
    try:
        signed: list[Checkpoint] = read_checkpoints(found[0]) if keys and found else []
        files = in_chain_order(files)
        if store is None:
            coverage = None if keys is None else CheckpointCoverage(signed, keys)
            return _print_reports(
                [verify_segments(files, anchored=args.anchored, coverage=coverage)]
            )
    except CheckpointError as exc:
        print(f"BROKEN: checkpoints: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except OSError as exc:
        return _unreadable(exc)
    try:
        url = parse_postgres_url(store)
    except ValueError as exc:  # the message carries the URL redacted
        return _usage(str(exc))
    try:
        if files:
            assert chain is not None
            reports = [verify_store_and_segments(url.url, chain, files, keys, signed)]
        else:
            reports = verify_postgres_chain(url.url, chain, keys)
    except CheckpointError as exc:
        print(f"BROKEN: checkpoints: {exc}", file=sys.stderr)
        return ExitCode.FAILED
    except OSError as exc:
        return _unreadable(exc)
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
            if report.anchored:
                print(
                    f"  anchored: starts at seq {report.first_seq}, whose prev_sha256 "
                    f"{report.anchor_sha256} is taken on trust; records before seq "
                    f"{report.first_seq} are not in these files (compare the anchor with "
                    "the table or a logged head)"
                )
            signed = report.signed
            if signed is None:
                print(
                    "  unsigned: no --public-key given, so no checkpoint was checked; the "
                    "chain shows order and completeness, not who wrote it"
                )
            else:
                print(
                    f"  signed: {signed.checkpoints} checkpoints by "
                    f"{', '.join(signed.key_ids)}, the last at seq {signed.last_seq}; "
                    f"{signed.tail} records after it are within the signing interval"
                )
        else:
            name = f" chain {report.chain_id}" if report.chain_id is not None else ""
            print(
                f"BROKEN{name} after {report.records} good records: {report.problem}",
                file=sys.stderr,
            )
    return ExitCode.OK if all(report.ok for report in reports) else ExitCode.FAILED


def _public_keys(given: Sequence[str]) -> dict[str, Ed25519PublicKey] | None:
    """The --public-key arguments by key id (None: none given); ValueError names a bad one."""
    if not given:
        return None
    keys: dict[str, Ed25519PublicKey] = {}
    for argument in given:
        key_id, equals, name = argument.partition("=")
        key = load_public_key(Path(name if equals else argument))
        key_id = key_id if equals else key_fingerprint(key)
        if not key_id:
            raise ValueError(f"--public-key {argument}: the key id before = is empty")
        if key_id in keys:
            raise ValueError(f"--public-key: key id {key_id!r} given twice")
        keys[key_id] = key
    return keys


def _unreadable(exc: OSError) -> int:
    # A running gate deletes shipped or expired segments, possibly between listing and reading.
    print(
        f"error: cannot read {exc.filename}: {exc.strerror} (a running gate deletes "
        "segments once shipped or expired: list the files again)",
        file=sys.stderr,
    )
    return ExitCode.FAILED


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return ExitCode.CANNOT_RUN
