"""Whether signed checkpoints cover an audit chain: the check ``audit verify --public-key`` adds.

Given the chain's checkpoints and the public keys by key id, a chain is
covered when:

1. every checkpoint is signed by a known key (an unknown key id fails: a key
   is trusted only when the verifier is given it), belongs to the chain, and
   signs the digest the chain holds at its seq: a record rewritten after a
   checkpoint, or a chain recomputed from any record before one, fails there;
   a checkpoint beyond the chain's last record means records were removed;
2. every record is signed in time: the first checkpoint at or after its seq
   was made at most ``every_seconds`` + slack after the record's time, and
   consecutive checkpoints are at most ``every_records`` apart (the promises
   the checkpoint itself carries, signed);
3. the records after the last checkpoint (the *tail*, written since) are
   fewer than ``every_records``, and each was written less than
   ``every_seconds`` + slack before the chain's last record: the gate had no
   reason yet to sign them. A tail older than that is a missing checkpoint.

Slack (:func:`slack_seconds`) absorbs the timer's scheduling and the
difference between a record's time (taken as it is built) and its write.
Checkpoints of records before the first one verified (an anchored log whose
first segments were deleted) cannot be compared and are only counted.

The check reads the chain once, in order, as the verifiers walk it
(:meth:`CheckpointCoverage.add` after each accepted record), so a table of
millions of rows is never held in memory; only the checkpoints are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sidecar.audit.checkpoints import Checkpoint, signature_problem


def slack_seconds(every_seconds: float) -> float:
    """How late past ``every_seconds`` a checkpoint may be: 2 s plus a tenth of the interval."""
    return 2.0 + every_seconds / 10


@dataclass(frozen=True, slots=True)
class SignedSummary:
    """What the checkpoints showed about a chain that is covered."""

    checkpoints: int  # checkpoints compared with the chain
    key_ids: tuple[str, ...]  # the keys that signed them
    last_seq: int  # the seq the last checkpoint signs (0: none)
    tail: int  # records after it, not yet signed when the chain was read
    earlier: int = 0  # checkpoints of records before the first one verified


class CheckpointCoverage:
    """Checks one chain's records, in seq order, against its signed checkpoints.

    ``chain_id`` is the chain the checkpoints must name; None takes the
    first checkpoint's (a log's files do not say which chain they are).
    ``problem`` is set by the first failure; the constructor already checks
    every signature.
    """

    def __init__(
        self,
        checkpoints: Iterable[Checkpoint],
        keys: Mapping[str, Ed25519PublicKey],
        chain_id: str | None = None,
    ) -> None:
        self.problem: str | None = None
        ordered = sorted(set(checkpoints), key=lambda c: (c.seq, c.time))
        self._checkpoints: list[Checkpoint] = []
        for checkpoint in ordered:
            where = f"checkpoint at seq {checkpoint.seq} ({checkpoint.time})"
            problem = signature_problem(checkpoint, keys)
            if problem is None and chain_id is not None and checkpoint.chain_id != chain_id:
                problem = f"belongs to chain {checkpoint.chain_id!r}, not {chain_id!r}"
            chain_id = chain_id or checkpoint.chain_id
            repeated = bool(self._checkpoints) and self._checkpoints[-1].seq == checkpoint.seq
            if problem is None and repeated and self._checkpoints[-1].sha256 != checkpoint.sha256:
                problem = "differs from another checkpoint at the same seq"
            if problem is not None:
                self.problem = f"{where}: {problem}"
                break
            if not repeated:
                self._checkpoints.append(checkpoint)
        self.chain_id = chain_id
        self._next = 0  # index of the first checkpoint at or after the next record's seq
        self._started = False
        self._earlier = 0
        self._tail_first: tuple[int, datetime] | None = None
        self._tail = 0
        self._last: tuple[int, datetime] | None = None

    def add(self, record: Mapping[str, Any]) -> str | None:
        """Check a record the chain walk accepted; returns (and keeps) the first problem."""
        if self.problem is not None:
            return self.problem
        seq = int(record["seq"])
        at = _time(record.get("time"))
        if at is None:
            self.problem = f"seq {seq}: no readable time, so its signing cannot be checked"
            return self.problem
        if not self._started:
            self._started = True
            while self._next < len(self._checkpoints) and self._checkpoints[self._next].seq < seq:
                self._next += 1
            self._earlier = self._next
        self._last = (seq, at)
        if self._next == len(self._checkpoints):
            if self._tail_first is None:
                self._tail_first = (seq, at)
            self._tail += 1
            return None
        covering = self._checkpoints[self._next]
        signed_at = _time(covering.time)
        late = (signed_at - at).total_seconds() if signed_at is not None else float("inf")
        if late > covering.every_seconds + slack_seconds(covering.every_seconds):
            self.problem = (
                f"seq {seq}: first signed by the checkpoint at seq {covering.seq}, "
                f"{late:.1f}s after it was written (the gate signs within "
                f"{covering.every_seconds:g}s): checkpoints stopped or were removed"
            )
            return self.problem
        if seq == covering.seq:
            if str(record["sha256"]) != covering.sha256:
                self.problem = (
                    f"seq {seq}: sha256 differs from the checkpoint signed at "
                    f"{covering.time} by key {covering.key_id!r} (the chain was rewritten "
                    "after it was signed)"
                )
                return self.problem
            self._next += 1
            if self._next < len(self._checkpoints):
                self.problem = _gap(covering, self._checkpoints[self._next])
        return self.problem

    def finish(self) -> str | None:
        """After the last record: the checkpoints beyond it, and the unsigned tail."""
        if self.problem is not None:
            return self.problem
        if self._last is None:
            return None
        last_seq, last_at = self._last
        if self._next < len(self._checkpoints):
            beyond = self._checkpoints[self._next]
            self.problem = (
                f"the checkpoint at seq {beyond.seq} signs a record the chain does not hold: "
                f"it ends at seq {last_seq} (records after it were removed)"
            )
        elif not self._checkpoints[self._earlier :]:
            first_seq = self._tail_first[0] if self._tail_first else last_seq
            self.problem = (
                f"seq {first_seq}-{last_seq}: no checkpoint signs any of these records "
                "(written without a signing key, or the checkpoints were removed)"
            )
        elif self._tail_first is not None:
            signed = self._checkpoints[-1]
            first_seq, first_at = self._tail_first
            age = (last_at - first_at).total_seconds()
            if self._tail >= signed.every_records:
                self.problem = (
                    f"seq {first_seq}-{last_seq}: {self._tail} records after the last "
                    f"checkpoint (seq {signed.seq}), which promised one every "
                    f"{signed.every_records}: a checkpoint is missing"
                )
            elif age > signed.every_seconds + slack_seconds(signed.every_seconds):
                self.problem = (
                    f"seq {first_seq}-{last_seq}: not signed, and seq {first_seq} was written "
                    f"{age:.1f}s before the last record (the gate signs within "
                    f"{signed.every_seconds:g}s): a checkpoint is missing"
                )
        return self.problem

    def summary(self) -> SignedSummary:
        """The checkpoints compared, their keys, and the unsigned tail (after ``finish``)."""
        compared = self._checkpoints[self._earlier :]
        return SignedSummary(
            checkpoints=len(compared),
            key_ids=tuple(sorted({c.key_id for c in compared})),
            last_seq=compared[-1].seq if compared else 0,
            tail=self._tail,
            earlier=self._earlier,
        )


def _gap(before: Checkpoint, after: Checkpoint) -> str | None:
    allowed = max(before.every_records, after.every_records)
    if after.seq - before.seq > allowed:
        return (
            f"checkpoints at seq {before.seq} and {after.seq} are {after.seq - before.seq} "
            f"records apart (the gate signs every {allowed}): a checkpoint is missing"
        )
    return None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
