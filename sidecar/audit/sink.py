"""The interface the response path writes audit records to, and its one error.

Enforcement knows only :class:`AuditSink`: a record goes in as a JSON-able
mapping (``AuditRecord.to_dict()``), and a sink that cannot keep it raises
:class:`AuditError`, which fails the response closed. Where the record ends up
(a JSON Lines file, PostgreSQL, nowhere) is the runtime's choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class AuditError(Exception):
    """A record could not be written, or the existing chain cannot be continued."""


class AuditSink(Protocol):
    """Where decision records go, in the order the decisions were made."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one decision record durably enough to survive a process crash."""
        ...

    def close(self) -> None:
        """Finish writing and release the sink; no record is written after this."""
        ...


class NullAuditSink:
    """Used when no audit log is configured (the server warns at start)."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Discard ``record``."""
        return None

    def close(self) -> None:
        """Nothing to release."""
        return None
