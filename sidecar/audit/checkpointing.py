"""Writing signed checkpoints while the gate writes its audit chain.

:class:`CheckpointingSink` wraps the sink that writes the chain (the JSON
Lines log, or the PostgreSQL sink's spool) and appends a signed checkpoint
(``sidecar.audit.checkpoints``) of the chain's head to the checkpoints file:

- right after the write that leaves ``every_records`` records unsigned,
- ``every_seconds`` after the first record not yet signed was written (a
  thread waits for that moment), and
- at close, before the wrapped sink closes, so that the PostgreSQL sink ships
  the last checkpoint with the last records.

Nothing is signed while no record was written since the last checkpoint, so
the checkpoints' seqs strictly increase. A checkpoint that cannot be written
at a write fails that write (AuditError: the answer is refused, as for a
record that cannot be written); the record is already in the chain, and the
next write or the timer signs it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sidecar.audit.checkpoints import Checkpoint, CheckpointError, last_checkpoint, sign
from sidecar.audit.sink import AuditError

log = logging.getLogger(__name__)


class ChainSink(Protocol):
    """A sink that writes a hash chain and tells its head."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record to the chain."""
        ...

    def close(self) -> None:
        """Finish writing; nothing is written after this."""
        ...

    @property
    def head(self) -> tuple[int, str]:
        """(seq, sha256) of the chain's last record; (0, GENESIS) before the first."""
        ...


class CheckpointObserver(Protocol):
    """What the checkpointing sink reports (GateMetrics in the server)."""

    def checkpoint_written(self, at: float) -> None:
        """A checkpoint was signed and written at Unix time ``at``."""
        ...

    def unsigned_since(self, at: float) -> None:
        """The first record no checkpoint covers was written at ``at`` (0: every record is)."""
        ...


@dataclass(frozen=True, slots=True)
class SigningKey:
    """The checkpoint signing key and the id checkpoints name it by.

    ``repr`` leaves the key out, so that no log or traceback shows it.
    """

    key: Ed25519PrivateKey
    key_id: str

    def __repr__(self) -> str:
        return f"SigningKey(key_id={self.key_id!r})"


class CheckpointingSink:
    """Writes records to ``sink`` and signed checkpoints of its head to ``path``.

    On open, the last checkpoint in ``path`` says up to where the chain is
    signed; CheckpointError when it belongs to another chain id or names a
    seq beyond the chain's head (the log was replaced or truncated: its old
    checkpoints would no longer verify).
    """

    def __init__(
        self,
        sink: ChainSink,
        path: Path,
        *,
        chain_id: str,
        signing: SigningKey,
        every_records: int,
        every_seconds: float,
        observer: CheckpointObserver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if every_records < 1 or every_seconds <= 0:
            raise ValueError("every_records must be at least 1 and every_seconds positive")
        self._sink = sink
        self.path = path
        self._chain_id = chain_id
        self._signing = signing
        self._every_records = every_records
        self._every_seconds = every_seconds
        self._observer = observer
        self._clock = clock
        self._lock = threading.Lock()
        previous = last_checkpoint(path) if path.exists() else None
        head_seq = sink.head[0]
        if previous is not None and previous.chain_id != chain_id:
            raise CheckpointError(
                f"{path}: its checkpoints are of chain {previous.chain_id!r}, this sidecar "
                f"writes chain {chain_id!r} (audit.chain_id changed, or another log's "
                "checkpoints): move the file aside with its log"
            )
        if previous is not None and previous.seq > head_seq:
            raise CheckpointError(
                f"{path}: the last checkpoint signs seq {previous.seq} but the audit log ends "
                f"at seq {head_seq}: the log was replaced or truncated"
            )
        self._signed = previous.seq if previous is not None else 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("ab", buffering=0)
        self._unsigned_since = 0.0
        if head_seq > self._signed:  # written before a crash, signed by the timer
            self._mark_unsigned(self._clock())
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-checkpoints", daemon=True)
        self._thread.start()

    @property
    def head(self) -> tuple[int, str]:
        """The wrapped sink's head."""
        return self._sink.head

    @property
    def signed_seq(self) -> int:
        """The seq of the last checkpoint written (0: none)."""
        return self._signed

    def write(self, record: Mapping[str, Any]) -> None:
        """Write ``record``, then a checkpoint if ``every_records`` are now unsigned.

        Raises AuditError when the record or that checkpoint cannot be written.
        """
        with self._lock:
            self._sink.write(record)
            if not self._unsigned_since:
                self._mark_unsigned(self._clock())
            if self._sink.head[0] - self._signed >= self._every_records:
                self._checkpoint()

    def close(self) -> None:
        """Sign the chain's head if a record is unsigned, then close the wrapped sink."""
        self._stopping.set()
        self._thread.join()
        with self._lock:
            try:
                if self._sink.head[0] > self._signed:
                    self._checkpoint()
            except AuditError as exc:
                log.error("audit checkpoint at shutdown not written: %s", exc)
            finally:
                self._file.close()
                self._sink.close()

    def _run(self) -> None:
        """Sign ``every_seconds`` after the first unsigned record was written."""
        retry_at = 0.0  # after a failed checkpoint: not before this
        while True:
            since = self._unsigned_since
            due = since + self._every_seconds if since else self._clock() + self._every_seconds
            due = max(due, retry_at)
            if self._stopping.wait(max(0.0, due - self._clock())):
                return
            with self._lock:
                since = self._unsigned_since
                if not since or self._clock() < since + self._every_seconds:
                    continue
                try:
                    self._checkpoint()
                except AuditError as exc:
                    # The unsigned-since metric keeps its time, so the alert sees the gap.
                    log.error("audit checkpoint not written: %s", exc)
                    retry_at = self._clock() + self._every_seconds

    def _checkpoint(self) -> None:
        """Sign the head and append the checkpoint (the caller holds the lock)."""
        seq, sha256 = self._sink.head
        now = self._clock()
        checkpoint = sign(
            Checkpoint(
                chain_id=self._chain_id,
                seq=seq,
                sha256=sha256,
                time=datetime.fromtimestamp(now, UTC).isoformat(timespec="microseconds"),
                key_id=self._signing.key_id,
                every_records=self._every_records,
                every_seconds=self._every_seconds,
            ),
            self._signing.key,
        )
        data = checkpoint.line() + b"\n"
        try:
            end = self._file.seek(0, 2)
            written = self._file.write(data)
            if written != len(data):
                self._file.truncate(end)
                raise OSError(0, "short write")
        except OSError as exc:
            raise AuditError(f"{self.path}: checkpoint not written: {exc.strerror}") from exc
        self._signed = seq
        self._unsigned_since = 0.0
        if self._observer is not None:
            self._observer.checkpoint_written(now)
            self._observer.unsigned_since(0.0)

    def _mark_unsigned(self, at: float) -> None:
        self._unsigned_since = at
        if self._observer is not None:
            self._observer.unsigned_since(at)
