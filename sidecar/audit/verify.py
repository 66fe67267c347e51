"""Verifying an audit chain: a JSON Lines file, or the chains in PostgreSQL.

Both verifiers check links with ``sidecar.audit.chain.ChainWalk``, the same
check the PostgreSQL shipper applies to its spool; what each adds is only what
its storage can get wrong on its own (an empty line in a file; a missing seq
or columns that disagree with the stored line in a table).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from sidecar.audit.chain import GENESIS, BrokenChain, ChainWalk
from sidecar.audit.postgres_schema import CONNECT_TIMEOUT_SECONDS, AuditRow
from sidecar.postgres.dsn import parse_postgres_url


@dataclass(frozen=True, slots=True)
class ChainReport:
    """The outcome of verifying one chain."""

    ok: bool
    records: int  # intact records before the first problem (all of them when ok)
    head_sha256: str  # the digest of the last intact record
    problem: str | None = None  # names the first broken or missing link
    chain_id: str | None = None  # set for chains read from a shared store


def verify_chain(path: Path) -> ChainReport:
    """Check every link of a JSON Lines audit log."""
    walk = ChainWalk("line {}".format)
    for number, line in _numbered_lines(path):
        if not line:
            problem = f"line {number}: empty line inside the chain"
            return ChainReport(False, walk.seq, walk.head, problem)
        try:
            walk.follow(line)
        except BrokenChain as exc:
            return ChainReport(False, walk.seq, walk.head, str(exc))
    return ChainReport(True, walk.seq, walk.head)


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, raw.rstrip(b"\n")


_VERIFY_SQL = """
SELECT chain_id, seq, decision_id, time, sha256, prev_sha256, record
FROM audit_records {where}
ORDER BY chain_id, seq
"""


class _TableChain:
    """Verifying one chain of ``audit_records``, row by row in seq order."""

    def __init__(self, chain_id: str) -> None:
        self.chain_id = chain_id
        self._walk = ChainWalk()
        self._problem: str | None = None

    def add(self, stored: AuditRow) -> None:
        if self._problem is not None:
            return
        expected = self._walk.seq + 1
        if stored.seq != expected:
            self._problem = (
                f"seq {expected}: missing, the next row is seq {stored.seq} (records removed)"
            )
            return
        try:
            record = self._walk.check(stored.line)
        except BrokenChain as exc:
            self._problem = str(exc)
            return
        if AuditRow.from_record(record, stored.line) != stored:
            self._problem = f"seq {stored.seq}: columns do not match the record (edited)"
            return
        self._walk.accept(record)

    def report(self) -> ChainReport:
        return ChainReport(
            self._problem is None,
            self._walk.seq,
            self._walk.head,
            self._problem,
            chain_id=self.chain_id,
        )


def _stored_rows(
    connection: psycopg.Connection[Any], chain_id: str | None
) -> Iterator[tuple[str, AuditRow]]:
    # A server-side cursor: a chain can hold millions of rows.
    with connection.cursor(name="audit_verify") as cursor:
        cursor.itersize = 5000
        if chain_id is None:
            cursor.execute(_VERIFY_SQL.format(where=""))
        else:
            cursor.execute(_VERIFY_SQL.format(where="WHERE chain_id = %s"), (chain_id,))
        for chain, seq, decision_id, at, sha256, prev_sha256, line in cursor:
            yield chain, AuditRow(seq, decision_id, at, sha256, prev_sha256, line)


def verify_postgres_chain(dsn: str, chain_id: str | None = None) -> list[ChainReport]:
    """Check every chain in ``audit_records`` (or only ``chain_id``), one report each.

    Like ``verify_chain``: seqs run from 1 without gaps, each row's digest
    matches its stored line, each ``prev_sha256`` links to the previous row,
    and the columns agree with the line. A requested chain with no rows is
    reported as broken. Deleting a chain's newest rows is only detectable
    against its spool or a logged head digest. Raises ValueError (password
    redacted) for a malformed URL and psycopg.Error when the table cannot be
    read; scrub the latter with ``parse_postgres_url(dsn).scrub`` before showing it.
    """
    url = parse_postgres_url(dsn)
    chains: dict[str, _TableChain] = {}
    with psycopg.connect(url.url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as connection:
        for chain, row in _stored_rows(connection, chain_id):
            table_chain = chains.get(chain)
            if table_chain is None:
                table_chain = chains[chain] = _TableChain(chain)
            table_chain.add(row)
    if chain_id is not None and chain_id not in chains:
        return [ChainReport(False, 0, GENESIS, "no records for this chain", chain_id=chain_id)]
    return [table_chain.report() for table_chain in chains.values()]
