"""Verifying an audit chain: JSON Lines files (a log's segments), the chains in
PostgreSQL, or one chain across its table rows and its remaining segments.

Every verifier checks links with ``sidecar.audit.chain.ChainWalk``, the same
check the PostgreSQL shipper applies to its spool; what each adds is only what
its storage can get wrong on its own (an empty line in a file; a missing seq
or columns that disagree with the stored line in a table; a file's record
that differs from the table's at the same seq).

Segments deleted by retention take the chain's beginning with them: the first
remaining record then links to a record no one can show. Verifying from there
is *anchored*: the report says at which seq it starts and which prev_sha256
it takes on trust (``first_seq``, ``anchor_sha256``); only an external copy of
that digest (the table, a logged head) proves nothing before it was changed.

Given public keys, each verifier also checks the chain against its signed
checkpoints (``sidecar.audit.coverage``) as it walks it; the report then says
what they showed (``signed``), or the first problem.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sidecar.audit.chain import GENESIS, BrokenChain, ChainWalk
from sidecar.audit.checkpoint_store import stored_checkpoints
from sidecar.audit.checkpoints import Checkpoint
from sidecar.audit.coverage import CheckpointCoverage, SignedSummary
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
    first_seq: int = 1  # the first record verified
    # The prev_sha256 of that record: GENESIS, or an anchor taken on trust.
    anchor_sha256: str = GENESIS
    signed: SignedSummary | None = None  # set when checkpoints were checked and cover it

    @property
    def anchored(self) -> bool:
        """Whether verification started after the chain's beginning."""
        return self.first_seq != 1 or self.anchor_sha256 != GENESIS


def verify_chain(path: Path) -> ChainReport:
    """Check every link of one JSON Lines audit file, from the chain's beginning."""
    return verify_segments([path])


def verify_segments(
    paths: Sequence[Path], *, anchored: bool = False, coverage: CheckpointCoverage | None = None
) -> ChainReport:
    """Check every link of audit files given in chain order, as one chain.

    From the chain's beginning (seq 1 after GENESIS) unless ``anchored``: then
    from the first record, whatever its seq, trusting its prev_sha256 (the
    report names both). Records are named ``line N`` in one file, ``FILE line
    N: seq S`` across several. With ``coverage``, every record is also checked
    against the signed checkpoints.
    """
    one_file = len(paths) == 1
    skipped = 0  # records before the first line read (anchored): a line's number is seq - this

    def name(seq: int) -> str:
        return f"line {seq - skipped}" if one_file else f"seq {seq}"

    walk = ChainWalk(name)
    first: tuple[int, str] | None = None
    for path in paths:
        for number, line in _numbered_lines(path):
            where = f"line {number}" if one_file else f"{path.name} line {number}"
            if not line:
                return _broken(walk, first, f"{where}: empty line inside the chain")
            if first is None:
                if anchored:
                    walk.seq, walk.head = _claimed_link(line)
                    skipped = walk.seq
                first = (walk.seq + 1, walk.head)
            try:
                record = walk.follow(line)
            except BrokenChain as exc:
                problem = str(exc) if one_file else f"{where}: {exc}"
                if not anchored and walk.seq == 0 and _claimed_link(line)[0] > 0:
                    problem += _ANCHOR_HINT
                return _broken(walk, first, problem)
            if coverage is not None and (unsigned := coverage.add(record)) is not None:
                return _broken(walk, first, _unsigned(unsigned))
    if coverage is not None and (unsigned := coverage.problem or coverage.finish()) is not None:
        return _broken(walk, first, _unsigned(unsigned))
    first_seq, anchor = first or (1, GENESIS)
    return ChainReport(
        True,
        walk.seq - first_seq + 1,
        walk.head,
        first_seq=first_seq,
        anchor_sha256=anchor,
        signed=None if coverage is None else coverage.summary(),
    )


def _unsigned(problem: str) -> str:
    return f"checkpoints: {problem}"


def _claimed_link(line: bytes) -> tuple[int, str]:
    """The link the record on ``line`` claims: the seq before its own, and its prev_sha256.

    Where an anchored walk starts. (0, GENESIS) for a line that does not say,
    which starts the walk at the beginning, where the line is reported.
    """
    try:
        record = orjson.loads(line)
        seq, prev = int(record["seq"]), record["prev_sha256"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return 0, GENESIS
    if seq < 1 or not isinstance(prev, str):
        return 0, GENESIS
    return seq - 1, prev


# A log whose first segments were deleted starts after seq 1: say how to verify it.
_ANCHOR_HINT = (
    "; if earlier segments were deleted (retention, or after shipping), "
    "verify with --anchored, or together with the table (--store, --chain)"
)


def _broken(walk: ChainWalk, first: tuple[int, str] | None, problem: str) -> ChainReport:
    first_seq, anchor = first or (walk.seq + 1, walk.head)
    return ChainReport(
        False,
        walk.seq - first_seq + 1,
        walk.head,
        problem,
        first_seq=first_seq,
        anchor_sha256=anchor,
    )


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

    def __init__(self, chain_id: str, coverage: CheckpointCoverage | None = None) -> None:
        self.chain_id = chain_id
        self._walk = ChainWalk()
        self._coverage = coverage
        self._problem = None if coverage is None else _signing_problem(coverage.problem)

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
        if self._coverage is not None:
            self._problem = _signing_problem(self._coverage.add(record))

    def report(self) -> ChainReport:
        coverage = self._coverage
        if self._problem is None and coverage is not None:
            self._problem = _signing_problem(coverage.finish())
        return ChainReport(
            self._problem is None,
            self._walk.seq,
            self._walk.head,
            self._problem,
            chain_id=self.chain_id,
            signed=None if coverage is None or self._problem else coverage.summary(),
        )


def _signing_problem(problem: str | None) -> str | None:
    return None if problem is None else _unsigned(problem)


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


def verify_postgres_chain(
    dsn: str,
    chain_id: str | None = None,
    keys: Mapping[str, Ed25519PublicKey] | None = None,
) -> list[ChainReport]:
    """Check every chain in ``audit_records`` (or only ``chain_id``), one report each.

    Like ``verify_chain``: seqs run from 1 without gaps, each row's digest
    matches its stored line, each ``prev_sha256`` links to the previous row,
    and the columns agree with the line. A requested chain with no rows is
    reported as broken. Deleting a chain's newest rows is only detectable
    against its spool or a logged head digest. Raises ValueError (password
    redacted) for a malformed URL and psycopg.Error when the table cannot be
    read; scrub the latter with ``parse_postgres_url(dsn).scrub`` before showing it.
    With ``keys`` (by key id), each chain is checked against its checkpoints
    in ``audit_checkpoints``.
    """
    url = parse_postgres_url(dsn)
    chains: dict[str, _TableChain] = {}
    with psycopg.connect(url.url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as connection:
        signed = {} if keys is None else stored_checkpoints(connection, chain_id)
        for chain, row in _stored_rows(connection, chain_id):
            table_chain = chains.get(chain)
            if table_chain is None:
                coverage = (
                    None if keys is None else CheckpointCoverage(signed.get(chain, ()), keys, chain)
                )
                table_chain = chains[chain] = _TableChain(chain, coverage)
            table_chain.add(row)
    if chain_id is not None and chain_id not in chains:
        return [ChainReport(False, 0, GENESIS, "no records for this chain", chain_id=chain_id)]
    return [table_chain.report() for table_chain in chains.values()]


def verify_store_and_segments(
    dsn: str,
    chain_id: str,
    paths: Sequence[Path],
    keys: Mapping[str, Ed25519PublicKey] | None = None,
    file_checkpoints: Sequence[Checkpoint] = (),
) -> ChainReport:
    """Check one chain across its rows in ``audit_records`` and its audit files.

    The table is verified from the beginning as by ``verify_postgres_chain``;
    the files (in chain order) then continue it: a file record at a seq the
    table holds must be the table's record byte for byte, and the records
    after the table's last one must link on from it with no seq missing, in
    the table or the files. Raises like ``verify_postgres_chain``. With
    ``keys``, the chain is checked against the table's checkpoints and
    ``file_checkpoints`` (those beside the files, not yet shipped) together.
    """
    url = parse_postgres_url(dsn)
    start = _first_seq(paths)
    overlap: dict[int, str] = {}  # the table's lines at seqs the files also hold
    with psycopg.connect(url.url, connect_timeout=CONNECT_TIMEOUT_SECONDS) as connection:
        coverage = None
        if keys is not None:
            shipped = stored_checkpoints(connection, chain_id).get(chain_id, [])
            coverage = CheckpointCoverage([*shipped, *file_checkpoints], keys, chain_id)
        table = _TableChain(chain_id, coverage)
        for _, row in _stored_rows(connection, chain_id):
            table.add(row)
            if start is not None and row.seq >= start:
                overlap[row.seq] = row.line
    stored = table.report()
    if not stored.ok:
        return stored
    held = stored.records  # the table holds seq 1..held
    walk = ChainWalk(seq=held, head=stored.head_sha256)
    previous: int | None = None  # the seq of the file record before
    for path in paths:
        for number, line in _numbered_lines(path):
            where = f"{path.name} line {number}"
            seq = _claimed_link(line)[0] + 1 if line else 0  # the seq the line claims; 0: none
            problem: str | None = None
            if not line:
                problem = f"{where}: empty line inside the chain"
            elif previous is not None and seq and seq != previous + 1:
                problem = (
                    f"{where}: seq is {seq}, expected {previous + 1} (records removed or reordered)"
                )
            elif 0 < seq <= held:
                if overlap.get(seq) != line.decode(errors="replace"):
                    problem = f"{where}: seq {seq} differs from the table's record (edited)"
            elif previous is None and seq > held + 1:
                problem = (
                    f"seq {held + 1}-{seq - 1}: in neither the table nor the files "
                    f"(the table ends at seq {held}, {path.name} starts at seq {seq})"
                )
            else:
                try:
                    record = walk.follow(line)
                except BrokenChain as exc:
                    problem = f"{where}: {exc}"
                else:
                    if coverage is not None:
                        problem = _signing_problem(coverage.add(record))
            if problem is not None:
                return ChainReport(False, walk.seq, walk.head, problem, chain_id=chain_id)
            previous = seq
    if coverage is not None and (problem := _signing_problem(coverage.finish())) is not None:
        return ChainReport(False, walk.seq, walk.head, problem, chain_id=chain_id)
    return ChainReport(
        True,
        walk.seq,
        walk.head,
        chain_id=chain_id,
        signed=None if coverage is None else coverage.summary(),
    )


def _first_seq(paths: Sequence[Path]) -> int | None:
    """The seq of the first record of the first file (None: no record to read)."""
    for path in paths:
        for _, line in _numbered_lines(path):
            return _claimed_link(line)[0] + 1 if line else None
    return None
