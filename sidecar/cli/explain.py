"""`retrieval-gate explain`: why the gate admits or rejects chunks, for support and audits.

Two questions, one command (docs/explain.md):

- ``explain --store URL --tenant T --principals P1,P2 [--drafts] ID...``: what
  the gate decides now for this caller and these chunks, every reason, and the
  record fields behind each;
- ``explain --audit-log FILE DECISION_ID``: what the gate decided then (after
  verifying the log's hash chain) and, with a store and the caller's
  principals, whether it would decide the same now.

Both evaluate with the decision core and the Rego policy the sidecar uses. The
chunk text is never printed: explanations are pasted into support tickets,
which travel further than the store's access rules reach. Without the text a
hit carried, the integrity check cannot run, so a chunk asked about by id is
decided as if its text matched the record (``--text-file`` checks a given
text); the output says so for every chunk.

This module holds the arguments and the two questions' steps; the gate and the
store are in ``explain_evaluate``, the audit record in ``explain_audit``, the
meaning of reasons in ``explain_reasons`` and the text and JSON in
``explain_output``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.audit.segments import in_chain_order, log_files, sealed_segments
from sidecar.audit.verify import verify_segments
from sidecar.cli.exit_codes import ExitCode
from sidecar.cli.explain_audit import (
    chain_report,
    find_record,
    recorded_chunks,
    recorded_context,
    redecide,
)
from sidecar.cli.explain_evaluate import CannotExplain, build_gate, decide, failure, lookup, misuse
from sidecar.cli.explain_output import emit, render_chunks, render_decision
from sidecar.cli.explain_reasons import chunk_report
from sidecar.config import PolicySettings, Settings, StoreSettings, load_settings
from sidecar.core.caller import Caller
from sidecar.store.loader import format_timestamp, quote_for_message


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``explain`` to the top-level ``commands``."""
    parser = commands.add_parser(
        "explain",
        help="why chunks are admitted or rejected: for a caller, or for an audited decision",
        description=(
            "explain --store URL --tenant T --principals P1,P2 [--drafts] CHUNK_ID...\n"
            "explain --audit-log FILE [--store URL --principals P1,P2] DECISION_ID\n\n"
            "Prints each chunk's decision, every reason and the record fields behind "
            "them; never the chunk text. Exit 0 when explained, 1 when the store, the "
            "policy or the audit log fails (an unknown decision id, a broken chain), "
            "2 on misuse."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("ids", nargs="*", metavar="ID", help="chunk ids, or one decision id")
    parser.add_argument("--store", help="metadata store URL, as for `retrieval-gate store`")
    parser.add_argument(
        "--config", type=Path, help="the sidecar's settings file: its store and policy"
    )
    parser.add_argument("--policy-dir", type=Path, help="Rego policy directory (default: bundled)")
    parser.add_argument("--policy-data", type=Path, help="JSON file loaded as Rego data")
    parser.add_argument(
        "--custom-reasons", type=_names, metavar="A,B", help="reasons your policy declares"
    )
    parser.add_argument("--tenant", help="the caller's tenant")
    parser.add_argument("--principals", type=_names, metavar="P1,P2", help="the caller's")
    parser.add_argument(
        "--drafts", action="store_true", help="the caller may read drafts (the drafts scope)"
    )
    parser.add_argument(
        "--text-file",
        action="append",
        default=[],
        metavar="ID=FILE",
        help="the text the database returned for chunk ID (UTF-8): checks its hash; "
        "the text is never printed",
    )
    parser.add_argument(
        "--audit-log", type=Path, metavar="FILE", help="explain DECISION_ID from this log"
    )
    parser.add_argument("--json", action="store_true", help="one JSON document for scripts")
    parser.set_defaults(func=explain)


def explain(args: argparse.Namespace) -> int:
    """Explain chunks for a caller, or a decision from an audit log."""
    try:
        if args.audit_log is not None:
            return _explain_decision(args)
        return _explain_chunks(args)
    except CannotExplain as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


def _explain_chunks(args: argparse.Namespace) -> int:
    if not args.ids:
        raise misuse("give the chunk ids to explain (or --audit-log FILE DECISION_ID)")
    if not args.tenant:
        raise misuse("--tenant is required to explain chunks")
    if args.principals is None:
        raise misuse("--principals is required to explain chunks")
    chunk_ids: list[str] = list(dict.fromkeys(args.ids))
    texts = _read_texts(args.text_file, chunk_ids)
    settings = _settings(args)
    if settings is None:
        raise misuse("give --store URL (or --config with the sidecar's settings)")
    caller = Caller(args.tenant, frozenset(args.principals), drafts_allowed=args.drafts)
    gate, policy_version, policy_source = build_gate(settings)
    records = lookup(settings.store.url, chunk_ids)
    now = datetime.now(UTC)
    decisions = decide(gate, caller, chunk_ids, records, texts, now)
    report: dict[str, Any] = {
        "caller": caller.to_document(),
        "policy_version": policy_version,
        "policy_source": policy_source,
        "at": format_timestamp(now),
        "chunks": [
            chunk_report(decision, records.get(chunk_id), caller, now, chunk_id in texts)
            for chunk_id, decision in zip(chunk_ids, decisions, strict=True)
        ],
    }
    emit(report, args.json, render_chunks)
    return ExitCode.OK


def _read_texts(pairs: Sequence[str], chunk_ids: Collection[str]) -> dict[str, str]:
    """Chunk id -> the text a ``--text-file ID=FILE`` gives."""
    texts: dict[str, str] = {}
    for pair in pairs:
        chunk_id, separator, file = pair.partition("=")
        if not separator or not chunk_id or not file:
            raise misuse(f"--text-file takes ID=FILE, not {quote_for_message(pair)}")
        if chunk_id not in chunk_ids:
            raise misuse(f"--text-file names chunk {quote_for_message(chunk_id)}, not asked about")
        try:
            texts[chunk_id] = Path(file).read_bytes().decode("utf-8")
        except OSError as exc:
            raise misuse(f"cannot read {file}: {exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise misuse(f"{file} is not UTF-8 text") from exc
    return texts


def _explain_decision(args: argparse.Namespace) -> int:
    if len(args.ids) != 1:
        raise misuse("--audit-log takes exactly one DECISION_ID")
    if args.tenant is not None or args.text_file:
        raise misuse("with --audit-log the tenant is the record's and the text is not available")
    path: Path = args.audit_log
    decision_id: str = args.ids[0]
    if not path.is_file() and not sealed_segments(path):
        raise misuse(f"no such audit log: {path}")
    # The log's sealed segments too: a decision may be in one rotated out.
    files = in_chain_order(log_files(path))
    # From the first remaining record: segments before it may have been deleted
    # (retention, shipping); the report names where verification started.
    chain = verify_segments(files, anchored=True)
    found = find_record(files, decision_id)
    if found is None:
        broken = "" if chain.ok else f" (and the chain is broken: {chain.problem})"
        raise failure(f"no decision {quote_for_message(decision_id)} in {path}{broken}")
    file, line, position, record = found
    if not chain.ok and position > chain.records:
        raise failure(
            f"audit chain BROKEN after {chain.records} good records: {chain.problem}; "
            f"decision {quote_for_message(decision_id)} is on line {line} of {file}, after "
            "the break, so it may have been altered: not explained"
        )
    report: dict[str, Any] = {
        "decision_id": decision_id,
        "audit_log": str(file),
        "line": line,
        "chain": chain_report(chain),
        "recorded": recorded_context(record),
    }
    chunks = recorded_chunks(record)
    report["now"] = redecide(_settings(args), args.principals, args.drafts, record, chunks)
    report["chunks"] = chunks
    emit(report, args.json, render_decision)
    return ExitCode.OK if chain.ok else ExitCode.FAILED


def _settings(args: argparse.Namespace) -> Settings | None:
    """The sidecar's settings (``--config``) with the flags over them; None without a store."""
    overrides: dict[str, Any] = {
        "store": args.store,
        "policy_dir": args.policy_dir,
        "policy_data": args.policy_data,
        "custom_reasons": args.custom_reasons,
    }
    if args.config is not None:
        return load_settings(args.config, overrides)
    if args.store is None:
        return None
    # No settings file: load_settings would insist on an identity mode, which
    # explaining does not use; the defaults and these flags are all it needs.
    policy = {
        "dir": args.policy_dir,
        "data": args.policy_data,
        "custom_reasons": None if args.custom_reasons is None else tuple(args.custom_reasons),
    }
    return Settings(
        store=StoreSettings(url=args.store),
        policy=dataclasses.replace(
            PolicySettings(), **{k: v for k, v in policy.items() if v is not None}
        ),
    )


def _names(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
