"""The JSON Lines audit sink: one hash-chained record per line, appended durably, in segments.

Each line is a record's canonical JSON (``sidecar.audit.chain``), so the files
are the chain: ``retrieval-gate audit verify FILE`` checks it line by line.
The log is written in segments (``sidecar.audit.segments``): the configured
file, rotated by size and age into sealed segments. What bounds the segments
depends on whether the log is the only copy:

- alone (no ``audit.store``), the operator's bound is a retention bound: the
  oldest sealed segments are deleted, for space (``max_spool_bytes``) or age
  (``retention_seconds``), and their records are gone;
- as the PostgreSQL sink's spool (``keep_until_shipped``), nothing is deleted
  but by the shipper, after PostgreSQL confirmed every record of a segment;
  a write that would exceed the bound is refused (AuditError: the answer is
  refused ``audit_unavailable``), never made room for by deleting records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import orjson

from sidecar.audit.chain import GENESIS, link, record_digest
from sidecar.audit.segments import first_record, last_line, sealed_path, sealed_segments
from sidecar.audit.sink import AuditError

log = logging.getLogger(__name__)

# Why a segment was deleted: the ``reason`` label of retrieval_gate_audit_segments_deleted_total.
SHIPPED = "shipped"
RETENTION = "retention"
DELETE_REASONS = (SHIPPED, RETENTION)


@dataclass(frozen=True, slots=True)
class SpoolLimits:
    """When the log rotates and how much of it is kept (the ``audit.*`` settings)."""

    segment_bytes: int = 16 * 1024 * 1024  # rotate before the active segment grows past this
    segment_seconds: float = 3600.0  # rotate at the first write this long after it started
    max_spool_bytes: int = 0  # all segments together; 0: no bound
    retention_seconds: float = 0.0  # alone: delete segments sealed this long ago; 0: keep


class SpoolObserver(Protocol):
    """What the sink reports as it writes and deletes (GateMetrics in the server)."""

    def spool_size(self, total_bytes: int) -> None:
        """The bytes of every segment, after a write or a deletion."""
        ...

    def segment_deleted(self, reason: str) -> None:
        """A sealed segment was deleted, for ``reason`` (``shipped`` or ``retention``)."""
        ...


@dataclass(slots=True)
class _Sealed:
    first_seq: int
    path: Path
    size: int
    sealed_at: float  # wall time of its last write


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
    """Appends hash-chained records to a JSON Lines log of segments.

    The chain continues across restarts: on open, the last line of the active
    file (or, when that is empty, of the newest sealed segment) gives the next
    ``seq`` and ``prev_sha256``. A last line that is not a valid record stops
    the sink from opening, because appending after it would hide the damage.
    The one exception is a torn tail: a last line without its newline, cut
    short when the process was killed mid-write. Its write never returned, so
    no client received that decision; it is moved to ``<file>.torn`` (kept for
    inspection) and the chain continues from the last complete line.

    Rotation and deletion follow ``limits`` (see the module docstring for
    ``keep_until_shipped``). Segment age counts from its first write in this
    process (the active file of a restarted sidecar starts its age anew).
    """

    def __init__(
        self,
        path: Path,
        limits: SpoolLimits | None = None,
        *,
        keep_until_shipped: bool = False,
        observer: SpoolObserver | None = None,
    ) -> None:
        self.path = path
        self._limits = limits or SpoolLimits()
        self._keep_until_shipped = keep_until_shipped
        self._observer = observer
        self._lock = threading.Lock()
        self._seq = 0
        self._prev = GENESIS
        self._sealed = [_sealed(first, sealed) for first, sealed in sealed_segments(path)]
        if path.exists():
            _set_aside_torn_tail(path)
        tail = last_line(path) if path.exists() else None
        if tail is None and self._sealed:
            tail = last_line(self._sealed[-1].path)
            if tail is None:
                raise AuditError(f"{self._sealed[-1].path}: a sealed audit segment is empty")
        if tail is not None:
            self._seq, self._prev = _chain_head(tail, path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab", buffering=0)
        # Where the last complete record ends. Appends go to the file's end
        # whatever the file position says, so a failed write is undone by
        # cutting the file back to here, not by trusting tell().
        self._end = self._file.seek(0, os.SEEK_END)
        self._torn = False
        self._active_first = self._seq + 1 if not self._end else _first_seq(path)
        self._active_since = time.time()
        self._total = self._end + sum(segment.size for segment in self._sealed)
        if not keep_until_shipped:
            with self._lock:
                self._expire(time.time())
        self._report_size()

    def write(self, record: Mapping[str, Any]) -> None:
        """Chain ``record`` after the last line and append it, rotating first when due.

        Raises AuditError when the line cannot be written in full (nothing of
        it is then left in the file) or would not fit under the spool bound.
        """
        with self._lock:
            seq = self._seq + 1
            digest, line = link(record, seq, self._prev)
            data = line + b"\n"
            if self._torn:
                self._undo_fragment()
            now = time.time()
            if self._end and (
                self._end + len(data) > self._limits.segment_bytes
                or now - self._active_since >= self._limits.segment_seconds
            ):
                self._rotate(now)
            if not self._keep_until_shipped:
                self._expire(now)
            self._make_room(len(data))
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
            self._total += len(data)
            self._seq = seq
            self._prev = digest
            self._report_size()

    def _rotate(self, now: float) -> None:
        """Seal the active file under its first seq's name and start an empty one."""
        sealed = sealed_path(self.path, self._active_first)
        if sealed.exists():  # rename would replace it: a copied or hand-edited log
            raise AuditError(f"{self.path}: cannot rotate: {sealed.name} already exists")
        try:
            os.rename(self.path, sealed)
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot rotate: {exc.strerror}") from exc
        try:
            active = self.path.open("ab", buffering=0)
        except OSError as exc:
            # Back as it was: the chain's head must stay in the active file.
            with contextlib.suppress(OSError):
                os.rename(sealed, self.path)
            raise AuditError(f"{self.path}: cannot start a new segment: {exc.strerror}") from exc
        self._file.close()
        self._file = active
        self._sealed.append(_Sealed(self._active_first, sealed, self._end, now))
        self._active_first = self._seq + 1
        self._active_since = now
        self._end = 0

    def _make_room(self, size: int) -> None:
        """Keep the spool under its bound with ``size`` more bytes, or raise AuditError."""
        bound = self._limits.max_spool_bytes
        while bound and self._total + size > bound:
            if self._keep_until_shipped:
                raise AuditError(
                    f"{self.path}: audit spool full ({self._total} bytes in "
                    f"{len(self._sealed) + 1} segments, audit.max_spool_bytes {bound}): "
                    "its records are not yet confirmed in PostgreSQL, and unshipped "
                    "records are never deleted"
                )
            if not self._deletable():
                raise AuditError(
                    f"{self.path}: a record of {size} bytes does not fit under "
                    f"audit.max_spool_bytes {bound}"
                )
            self._delete_oldest(RETENTION)

    def _expire(self, now: float) -> None:
        """Delete sealed segments older than ``retention_seconds`` (the log alone)."""
        keep = self._limits.retention_seconds
        while keep and self._deletable() and self._sealed[0].sealed_at < now - keep:
            self._delete_oldest(RETENTION)

    def _deletable(self) -> bool:
        # The newest sealed segment holds the chain's head while the active
        # file is empty: deleting it would leave a restart nothing to continue from.
        return len(self._sealed) > 1 or (len(self._sealed) == 1 and self._end > 0)

    def _delete_oldest(self, reason: str) -> None:
        segment = self._sealed[0]
        try:
            segment.path.unlink(missing_ok=True)
        except OSError as exc:
            raise AuditError(f"{segment.path}: cannot delete: {exc.strerror}") from exc
        del self._sealed[0]
        self._total -= segment.size
        last = self._sealed[0].first_seq - 1 if self._sealed else self._active_first - 1
        log.info(
            "audit segment %s deleted (%s): seq %d-%d",
            segment.path.name,
            reason,
            segment.first_seq,
            last,
        )
        if self._observer is not None:
            self._observer.segment_deleted(reason)
        self._report_size()

    def delete_shipped(self, first_seq: int) -> bool:
        """Delete the oldest sealed segment, which starts at ``first_seq``, once shipped.

        For the shipper, after it confirmed every record of the segment in
        PostgreSQL. Only the oldest goes, so the rest stays one unbroken
        chain; the active file never. Returns whether it was deleted; raises
        AuditError when the file cannot be deleted.
        """
        with self._lock:
            if not self._sealed or self._sealed[0].first_seq != first_seq:
                return False
            if not self._deletable():
                return False
            self._delete_oldest(SHIPPED)
            return True

    def segments(self) -> list[int]:
        """The first seq of every segment, oldest first; the last is the active file's."""
        with self._lock:
            return [*(segment.first_seq for segment in self._sealed), self._active_first]

    def open_segment(self, first_seq: int) -> BinaryIO:
        """Open the segment starting at ``first_seq`` for reading.

        Under the writer's lock, so that the active file is not renamed
        between finding its name and opening it; the handle then reads the
        same file whether or not it is sealed later.
        """
        with self._lock:
            if first_seq == self._active_first:
                return self.path.open("rb")
            for segment in self._sealed:
                if segment.first_seq == first_seq:
                    return segment.path.open("rb")
        raise AuditError(f"{self.path}: no segment starts at seq {first_seq}")

    @property
    def spool_bytes(self) -> int:
        """Bytes in all segments, as the sink counts them (no directory scan)."""
        return self._total

    @property
    def head(self) -> tuple[int, str]:
        """(last seq, digest of the last line): an anchor to keep outside the file."""
        return self._seq, self._prev

    def _undo_fragment(self) -> None:
        """Cut off what a failed write left; until that succeeds, nothing is appended."""
        try:
            self._file.truncate(self._end)
        except OSError as exc:
            raise AuditError(f"{self.path}: cannot undo a failed write: {exc.strerror}") from exc
        self._torn = False

    def _report_size(self) -> None:
        if self._observer is not None:
            self._observer.spool_size(self._total)

    def close(self) -> None:
        """Close the file and log its head, the anchor that reveals a truncated log."""
        with self._lock:
            if not self._file.closed:
                self._file.close()
                log.info("audit log closed at seq=%d head_sha256=%s", self._seq, self._prev)


def _sealed(first_seq: int, path: Path) -> _Sealed:
    status = path.stat()
    return _Sealed(first_seq, path, status.st_size, status.st_mtime)


def _first_seq(path: Path) -> int:
    """The seq of the first record of a non-empty audit file; AuditError if it has none."""
    with path.open("rb") as handle:
        record = first_record(handle)
    seq = record.get("seq") if record is not None else None
    if not isinstance(seq, int):
        raise AuditError(f"{path}: first line is not an audit record")
    return seq


def _chain_head(tail: bytes, path: Path) -> tuple[int, str]:
    """(seq, sha256) of the log's last line, checked to be an intact record."""
    try:
        record = orjson.loads(tail)
        seq, digest = int(record["seq"]), str(record["sha256"])
        intact = record_digest(record) == digest
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        intact = False
    if not intact:
        raise AuditError(
            f"{path}: last line is not an intact audit record; "
            "run `retrieval-gate audit verify` before appending"
        )
    return seq, digest
