"""The JSON Lines audit sink: one hash-chained record per line, appended durably.

Each line is a record's canonical JSON (``sidecar.audit.chain``), so the file
is the chain: ``retrieval-gate audit verify FILE`` checks it line by line. The
same file is the PostgreSQL sink's local spool.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from sidecar.audit.chain import GENESIS, link, record_digest
from sidecar.audit.sink import AuditError

log = logging.getLogger(__name__)


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
        # Where the last complete record ends. Appends go to the file's end
        # whatever the file position says, so a failed write is undone by
        # cutting the file back to here, not by trusting tell().
        self._end = self._file.seek(0, os.SEEK_END)
        self._torn = False

    def write(self, record: Mapping[str, Any]) -> None:
        """Chain ``record`` after the last line and append it.

        Raises AuditError when the line cannot be written in full; nothing of
        it is then left in the file.
        """
        with self._lock:
            seq = self._seq + 1
            digest, line = link(record, seq, self._prev)
            data = line + b"\n"
            if self._torn:
                self._undo_fragment()
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
                self._torn = True
                with contextlib.suppress(AuditError):
                    self._undo_fragment()
                raise AuditError(f"{self.path}: {exc.strerror}") from exc
            self._end += len(data)
            self._seq = seq
            self._prev = digest

    def _undo_fragment(self) -> None:
        """Cut off what a failed write left; until that succeeds, nothing is appended."""
        try:
            self._file.truncate(self._end)
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot undo a failed write: {exc.strerror}") from exc
        self._torn = False

    @property
    def head(self) -> tuple[int, str]:
        """(last seq, digest of the last line): an anchor to keep outside the file."""
        return self._seq, self._prev

    def close(self) -> None:
        """Close the file and log its head, the anchor that reveals a truncated log."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
                log.info("audit log closed at seq=%d head_sha256=%s", self._seq, self._prev)
