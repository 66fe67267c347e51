"""Decision records and their hash-chained JSON Lines sink.

Each line is one JSON object written with sorted keys. Besides the decision it
carries ``seq`` (1, 2, 3, ... with no gaps), ``sha256`` (the SHA-256 of the
line's own canonical JSON without the ``sha256`` key) and ``prev_sha256`` (the
previous line's ``sha256``, or 64 zeros for the first line). Editing a line
breaks its own digest; deleting or reordering lines breaks ``seq`` and the
chain; ``verify_chain`` names the first broken link. Truncating the newest lines
is only detectable against an external copy of the last ``seq``/digest, which is
why the sink logs them when it closes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

GENESIS = "0" * 64

log = logging.getLogger(__name__)


class AuditError(Exception):
    """A record could not be written, or the existing chain cannot be continued."""


class AuditSink(Protocol):
    def write(self, record: Mapping[str, Any]) -> None:
        """Append one decision record durably enough to survive a process crash."""
        ...

    def close(self) -> None: ...


class NullAuditSink:
    """Used when no audit log is configured (the server warns at start)."""

    def write(self, record: Mapping[str, Any]) -> None:
        return None

    def close(self) -> None:
        return None


def _canonical(record: Mapping[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_SORT_KEYS)


def record_digest(record: Mapping[str, Any]) -> str:
    """SHA-256 of a record's canonical JSON, excluding its own ``sha256`` field."""
    body = {k: v for k, v in record.items() if k != "sha256"}
    return hashlib.sha256(_canonical(body)).hexdigest()


def _lines_from_end(
    handle: BinaryIO, *, terminated_only: bool = False
) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line) for each non-empty line, newest first, read in blocks from the end.

    Logs grow large; finding the tail or the resume point must not read the whole file.
    With ``terminated_only``, bytes after the last newline are skipped: a reader
    in another thread may see a line the writer has only partly written.
    """
    position = handle.seek(0, os.SEEK_END)
    partial = b""  # the start of a line that begins before ``position``
    tail = True  # the first piece met is what follows the file's last newline
    block = 64 * 1024
    while position > 0:
        step = min(block, position)
        position -= step
        handle.seek(position)
        chunk = handle.read(step) + partial
        pieces = chunk.split(b"\n")
        partial = pieces.pop(0)
        end = position + len(chunk)
        for piece in reversed(pieces):
            start = end - len(piece)
            if piece and not (tail and terminated_only):
                yield start, piece
            tail = False
            end = start - 1
    if partial and not (tail and terminated_only):
        yield 0, partial


def _last_line(path: Path) -> bytes | None:
    """The last non-empty line of a file."""
    with path.open("rb") as handle:
        return next((line for _, line in _lines_from_end(handle)), None)


def offset_after(path: Path, seq: int) -> tuple[int, dict[str, Any] | None]:
    """Where the record after ``seq`` starts in a JSON Lines audit log, and record ``seq``.

    ``seq`` 0 is the start of the file (and no record). Reads from the end, so
    finding a recent ``seq`` costs only the lines after it, and safe while
    another thread appends. Raises AuditError when the log holds no record
    ``seq`` or a line cannot be parsed.
    """
    if seq == 0:
        return 0, None
    with path.open("rb") as handle:
        for start, line in _lines_from_end(handle, terminated_only=True):
            try:
                record = orjson.loads(line)
                found = int(record["seq"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise AuditError(f"{path}: unreadable line at byte {start}") from exc
            if found == seq:
                return start + len(line) + 1, record
            if found < seq:
                break
    raise AuditError(f"{path}: no record with seq {seq}")


def _set_aside_torn_tail(path: Path) -> None:
    with path.open("r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return
        # Find the start of the unterminated last line.
        start = size
        while start > 0:
            step = min(64 * 1024, start)
            handle.seek(start - step)
            block = handle.read(step)
            newline = block.rfind(b"\n")
            if newline >= 0:
                start = start - step + newline + 1
                break
            start -= step
        handle.seek(start)
        torn = handle.read()
        with path.with_name(path.name + ".torn").open("ab") as aside:
            aside.write(torn + b"\n")
        handle.truncate(start)
    log.warning(
        "%s: set aside an unterminated last line (%d bytes, a write cut short by a crash) "
        "to %s.torn",
        path,
        len(torn),
        path.name,
    )


class JsonlAuditSink:
    """Appends hash-chained records to a JSON Lines file.

    The chain continues across restarts: on open, the last line gives the next
    ``seq`` and ``prev_sha256``. A last line that is not a valid record stops
    the sink from opening, because appending after it would hide the damage.
    The one exception is a torn tail: a last line without its newline, cut
    short when the process was killed mid-write. Its write never returned, so
    no client received that decision; it is moved to ``<file>.torn`` (kept for
    inspection) and the chain continues from the last complete line.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0
        self._prev = GENESIS
        if path.exists():
            _set_aside_torn_tail(path)
            last = _last_line(path)
            if last is not None:
                try:
                    tail = orjson.loads(last)
                    self._seq = int(tail["seq"])
                    self._prev = str(tail["sha256"])
                    intact = record_digest(tail) == self._prev
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    intact = False
                if not intact:
                    raise AuditError(
                        f"{path}: last line is not an intact audit record; "
                        "run `retrieval-gate audit verify` before appending"
                    )
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab", buffering=0)

    def write(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            seq = self._seq + 1
            chained = {**record, "seq": seq, "prev_sha256": self._prev}
            chained.pop("sha256", None)
            # record_digest(chained), without copying the record once more.
            digest = hashlib.sha256(_canonical(chained)).hexdigest()
            chained["sha256"] = digest
            data = _canonical(chained) + b"\n"
            start = self._file.tell()
            try:
                # Unbuffered writes: a crash loses at most the record being
                # written, never one already returned to a client. A short write
                # (disk full, file size limit) is completed or undone, never left
                # as a fragment for the next record to be appended to.
                written = 0
                while written < len(data):
                    count = self._file.write(data[written:])
                    if not count:
                        raise OSError(0, "nothing written")
                    written += count
            except OSError as exc:
                with contextlib.suppress(OSError):
                    self._file.truncate(start)
                raise AuditError(f"{self.path}: {exc.strerror}") from exc
            self._seq = seq
            self._prev = digest

    @property
    def head(self) -> tuple[int, str]:
        """(last seq, digest of the last line): an anchor to keep outside the file."""
        return self._seq, self._prev

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
                log.info("audit log closed at seq=%d head_sha256=%s", self._seq, self._prev)


@dataclass(frozen=True, slots=True)
class ChainReport:
    ok: bool
    records: int
    head_sha256: str
    problem: str | None = None  # names the first broken or missing link
    chain_id: str | None = None  # set for chains read from a shared store


def chain_link_problem(
    where: str, record: object, expected_seq: int, prev_sha256: str, before: str
) -> str | None:
    """Why ``record`` cannot follow a record whose digest is ``prev_sha256``, or None.

    ``where`` names the record and ``before`` its predecessor in the message
    (``line 3``/``line 2`` for a file, ``seq 3``/``seq 2`` for a table), so
    every verifier reports a broken link in the same words.
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


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, raw.rstrip(b"\n")


def verify_chain(path: Path) -> ChainReport:
    """Check every link of a JSON Lines audit log."""
    prev = GENESIS
    count = 0
    for number, line in _numbered_lines(path):
        where = f"line {number}"
        if not line:
            return ChainReport(False, count, prev, f"{where}: empty line inside the chain")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return ChainReport(False, count, prev, f"{where}: not valid JSON")
        problem = chain_link_problem(where, record, count + 1, prev, f"line {number - 1}")
        if problem is not None:
            return ChainReport(False, count, prev, problem)
        prev = str(record["sha256"])
        count += 1
    return ChainReport(True, count, prev)
