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

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


def _last_line(path: Path) -> bytes | None:
    """The last non-empty line of a file, read from its end (logs grow large)."""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        end = handle.tell()
        block = 64 * 1024
        data = b""
        position = end
        while position > 0:
            step = min(block, position)
            position -= step
            handle.seek(position)
            data = handle.read(step) + data
            stripped = data.rstrip(b"\n")
            if b"\n" in stripped:
                return stripped.rsplit(b"\n", 1)[1]
        stripped = data.rstrip(b"\n")
        return stripped or None


class JsonlAuditSink:
    """Appends hash-chained records to a JSON Lines file.

    The chain continues across restarts: on open, the last line gives the next
    ``seq`` and ``prev_sha256``. A last line that is not a valid record stops
    the sink from opening, because appending after it would hide the damage.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._seq = 0
        self._prev = GENESIS
        if path.exists():
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
            digest = record_digest(chained)
            line = _canonical({**chained, "sha256": digest})
            try:
                # One unbuffered write per record: a crash loses at most the
                # record being written, never one already returned to a client.
                self._file.write(line + b"\n")
            except OSError as exc:
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


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, raw.rstrip(b"\n")


def verify_chain(path: Path) -> ChainReport:
    """Check every link of a JSON Lines audit log."""
    prev = GENESIS
    expected_seq = 1
    count = 0
    for number, line in _numbered_lines(path):
        if not line:
            return ChainReport(False, count, prev, f"line {number}: empty line inside the chain")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return ChainReport(False, count, prev, f"line {number}: not valid JSON")
        if not isinstance(record, dict):
            return ChainReport(False, count, prev, f"line {number}: not a JSON object")
        if record.get("sha256") != record_digest(record):
            return ChainReport(
                False, count, prev, f"line {number}: content does not match its sha256 (edited)"
            )
        if record.get("seq") != expected_seq:
            return ChainReport(
                False,
                count,
                prev,
                f"line {number}: seq is {record.get('seq')}, expected {expected_seq} "
                "(records removed or reordered)",
            )
        if record.get("prev_sha256") != prev:
            return ChainReport(
                False,
                count,
                prev,
                f"line {number}: prev_sha256 does not match line {number - 1}'s sha256 "
                "(records removed, reordered or rewritten)",
            )
        prev = str(record["sha256"])
        expected_seq += 1
        count += 1
    return ChainReport(True, count, prev)
