"""How audit records are linked into a hash chain.

A chained record is the decision record plus three fields: ``seq`` (1, 2, 3,
... with no gaps), ``prev_sha256`` (the previous record's ``sha256``, or
:data:`GENESIS` for the first) and ``sha256`` (the SHA-256 of the record's
canonical JSON, sorted keys, without the ``sha256`` key). Editing a record
breaks its own digest; deleting or reordering records breaks ``seq`` and the
links. Truncating the newest records is only detectable against an external
copy of the last ``seq``/digest, which is why sinks log them when they close.

Every writer links with :func:`link`, and every reader that walks a chain
(the PostgreSQL shipper and both verifiers) checks with :class:`ChainWalk`,
so they agree on what an intact chain is and name a broken link in the same
words. The JSON Lines sink, on restart, checks only its last line's digest
(:func:`record_digest`) before it continues the chain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from sidecar.audit.sink import AuditError

GENESIS = "0" * 64


class BrokenChain(AuditError):
    """A record does not follow the one before it; the message names the first problem."""


def canonical_json(record: Mapping[str, Any]) -> bytes:
    """A record as the chain hashes and stores it: compact JSON with sorted keys."""
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON, excluding its own ``sha256`` field."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def link(record: Mapping[str, Any], seq: int, prev_sha256: str) -> tuple[str, bytes]:
    """``record`` as link ``seq`` after a record whose digest is ``prev_sha256``.

    Returns the new record's ``sha256`` and its canonical JSON (no newline).
    Chain fields already in ``record`` are replaced, so a record cannot forge
    its own digest; ``record`` itself is not changed.
    """
    chained = {**record, "seq": seq, "prev_sha256": prev_sha256}
    chained.pop("sha256", None)
    # record_digest(chained), without copying the record once more: this runs per response.
    digest = hashlib.sha256(canonical_json(chained)).hexdigest()
    chained["sha256"] = digest
    return digest, canonical_json(chained)


def link_problem(
    where: str, record: object, expected_seq: int, prev_sha256: str, before: str
) -> str | None:
    """Why ``record`` cannot follow a record whose digest is ``prev_sha256``, or None.

    ``where`` names the record and ``before`` its predecessor in the message
    (``line 3``/``line 2`` for a file, ``seq 3``/``seq 2`` for a table).
    """
    if not isinstance(record, dict):
        return f"{where}: not a JSON object"
    if record.get("sha256") != record_digest(record):
        return f"{where}: content does not match its sha256 (edited)"
    if record.get("seq") != expected_seq:
        return (
            f"{where}: seq is {record.get('seq')}, expected {expected_seq} "
            "(records removed or reordered)"
        )
    if record.get("prev_sha256") != prev_sha256:
        return (
            f"{where}: prev_sha256 does not match {before}'s sha256 "
            "(records removed, reordered or rewritten)"
        )
    return None


class ChainWalk:
    """Reads a chain one stored record at a time, checking every link.

    ``seq`` and ``head`` are the last record accepted (0 and GENESIS before the
    first). ``name`` turns a seq into the words a message uses for that record:
    ``seq 3`` unless a file names its records ``line 3``. A walk can start
    mid-chain, after a record known to be intact.
    """

    def __init__(
        self, name: Callable[[int], str] = "seq {}".format, *, seq: int = 0, head: str = GENESIS
    ) -> None:
        self.seq = seq
        self.head = head
        self._name = name

    def check(self, line: bytes | str) -> dict[str, Any]:
        """Parse ``line`` as the record after ``head`` and check its link, without accepting it.

        Raises BrokenChain naming the record and the first problem.
        """
        where = self._name(self.seq + 1)
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            raise BrokenChain(f"{where}: not valid JSON") from None
        problem = link_problem(where, record, self.seq + 1, self.head, self._name(self.seq))
        if problem is not None:
            raise BrokenChain(problem)
        # link_problem returned None, so this is a dict whose seq and digest are checked.
        checked: dict[str, Any] = record
        return checked

    def accept(self, record: Mapping[str, Any]) -> None:
        """Make ``record`` (returned by :meth:`check`) the new head."""
        self.seq += 1
        self.head = str(record["sha256"])

    def follow(self, line: bytes | str) -> dict[str, Any]:
        """:meth:`check` ``line`` and accept it; BrokenChain leaves the walk where it was."""
        record = self.check(line)
        self.accept(record)
        return record
