"""Assembling answer verification (``Gate/VerifyAnswer``) from the sidecar's settings.

Decisions are looked up where the audit sink writes them: the JSON Lines log,
or the PostgreSQL table with the log as its spool. The sink is wrapped so that
every decision this process records is also remembered in memory
(:class:`~sidecar.audit.decisions.RecentDecisions`): an answer checked soon
after its retrieval reads neither file nor table.
"""

from __future__ import annotations

from sidecar.audit.decisions import (
    DecisionSource,
    IndexingSink,
    JsonlDecisions,
    PostgresDecisions,
    RecentDecisions,
)
from sidecar.audit.sink import AuditSink
from sidecar.config import Settings
from sidecar.enforcement.answer_verification import AnswerVerifier
from sidecar.metrics import GateMetrics
from sidecar.store.cache import CachedStore


def answer_verification(
    settings: Settings, audit: AuditSink, store: CachedStore, metrics: GateMetrics
) -> tuple[AuditSink, AnswerVerifier | None]:
    """The sink decisions must be written to, and the verifier (None without an audit log)."""
    log_path = settings.audit.log
    if log_path is None:
        return audit, None
    recent = RecentDecisions()
    source: DecisionSource
    if settings.audit.store is None:
        source = JsonlDecisions(log_path, recent)
    else:
        source = PostgresDecisions(settings.audit.store, log_path, recent)
    indexing = IndexingSink(audit, recent)
    return indexing, AnswerVerifier(source, store, indexing, metrics)
