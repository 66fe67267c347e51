"""Prometheus instruments. Names and labels are part of the public interface.

Label values come only from closed sets (decisions, reason codes, drift kinds, declared
custom reasons, format names, outcomes, the operator's allowlist of
collections) or from the operator's own policy bundles (their revisions): never chunk
text, ids or callers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sidecar.core.answer_check import AnswerCheck, ClaimVerdict
from sidecar.core.drift import Drift
from sidecar.core.reasons import Reason

# Responses are usually decided in well under 10 ms; the upper buckets catch
# cold-store and overload tails.
_DECISION_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

ADMITTED_REASON = "NONE"
# The ``outcome`` of a response the upstream answered with a non-2xx status on
# a filtered route (the client got the gate's error body): beside the
# ``Outcome`` values, so gate failures (``error``) stay apart from the database's.
UPSTREAM_ERROR_OUTCOME = "upstream_error"

# The ``collection`` label: a collection on the ``metric_collections``
# allowlist by its name (a Chroma collection by the name the gate learned for
# its id, or by its id); ``other`` for any other collection, several
# collections or a pattern; ``none`` when the route names no collection (or
# the response is on no search route). Collection names are the client's, so
# only the allowlist keeps the label's values a closed set.
NO_COLLECTION = "none"
OTHER_COLLECTION = "other"
RESERVED_COLLECTION_LABELS = frozenset({NO_COLLECTION, OTHER_COLLECTION})

# Reasons whose first occurrence an alert must see (deploy/prometheus): their
# series exist at 0 from the start, because rate() and increase() never count
# the first value of a series that appears already incremented.
PRESET_REASONS = (
    Reason.HASH_MISMATCH,
    Reason.PAYLOAD_HASH_MISMATCH,
    Reason.METADATA_UNAVAILABLE,
    Reason.POLICY_ERROR,
)


# The statuses the request path answers with: a closed set for the label.
REFUSAL_STATUSES = ("400", "401", "403", "405", "500", "503")


def check_metric_collections(names: Iterable[str]) -> tuple[str, ...]:
    """``names`` as an allowlist of collection label values; raises ValueError.

    ``none`` and ``other`` are taken: an allowlisted collection of that name
    would be counted together with what those values stand for.
    """
    allowlist = tuple(dict.fromkeys(names))
    for name in allowlist:
        if not name:
            raise ValueError("a collection name must not be empty")
        if name in RESERVED_COLLECTION_LABELS:
            raise ValueError(f"{name!r} is a reserved label value (none, other)")
    return allowlist


class GateMetrics:
    """All of the gate's instruments, registered in one registry."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, collections: Iterable[str] = ()
    ) -> None:
        """``collections``: the allowlist of collections labelled by name (others: ``other``)."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._collections = frozenset(check_metric_collections(collections))
        r = self.registry

        def counter(name: str, documentation: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, documentation, labels, registry=r)

        self.chunks = counter(
            "retrieval_gate_chunks",
            "Chunks decided, by decision, primary reason (NONE when admitted), format "
            "and collection.",
            ("decision", "reason", "format", "collection"),
        )
        self.chunk_reasons = counter(
            "retrieval_gate_chunk_reasons",
            "Reasons of the rejected chunks, every reason of each chunk (not only the "
            "primary one), by format and collection: drift shows whatever else is wrong.",
            ("reason", "format", "collection"),
        )
        self.drift = counter(
            "retrieval_gate_drift",
            "HASH_MISMATCH chunks whose record holds the authoritative text, by drift kind "
            "(format_only, edit, truncation: stale re-ingestion; injection, replacement: "
            "tampering), format and collection.",
            ("kind", "format", "collection"),
        )
        self.pushdown_tenant_mismatches = counter(
            "retrieval_gate_pushdown_tenant_mismatches",
            "Chunks of another tenant in answers to searches the gate had confined to the "
            "caller's tenant (push-down): the database ignored the filter. Should stay 0.",
            ("format", "collection"),
        )
        self.request_refusals = counter(
            "retrieval_gate_request_refusals",
            "Requests the gate answered itself before the vector database was asked, by "
            "HTTP status: 400 unreadable or unfilterable, 401 identity, 403 request policy, "
            "405 probing method, 5xx the gate's own failure.",
            ("status",),
        )
        self.responses = counter(
            "retrieval_gate_responses",
            "Responses seen, by outcome "
            "(filtered, abstained, blocked, passthrough, error, upstream_error), format "
            "and collection.",
            ("outcome", "format", "collection"),
        )
        self.decision_seconds = Histogram(
            "retrieval_gate_decision_seconds",
            "Time to decide a whole response body, sidecar side.",
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.cache_hits = counter(
            "retrieval_gate_cache_hits", "Metadata lookups served by the cache."
        )
        self.cache_misses = counter(
            "retrieval_gate_cache_misses", "Metadata lookups sent to the store."
        )
        self.store_errors = counter(
            "retrieval_gate_store_errors", "Metadata store lookups that failed."
        )
        self.store_seconds = Histogram(
            "retrieval_gate_store_seconds",
            "Time of one batched metadata store lookup, failed or not.",
            buckets=_DECISION_BUCKETS,
            registry=r,
        )
        self.cache_evictions = counter(
            "retrieval_gate_cache_evictions",
            "Cache entries dropped before expiry to respect the size bound.",
        )
        self.cache_invalidations = counter(
            "retrieval_gate_cache_invalidations",
            "Chunk ids invalidated (store change notifications, upserts).",
        )
        self.cache_flushes = counter(
            "retrieval_gate_cache_flushes",
            "Times the whole cache was dropped (e.g. the change listener reconnected).",
        )
        self.store_changes_watched = Gauge(
            "retrieval_gate_store_changes_watched",
            "1 while the gate sees metadata store changes as they happen (PostgreSQL LISTEN "
            "up, SQLite change poll working); 0 while it does not, and then caches no record.",
            registry=r,
            # With several workers: 1 only while every live worker sees changes.
            multiprocess_mode="livemin",
        )
        self.cache_stale_served = counter(
            "retrieval_gate_cache_stale_served",
            "Expired records served because the store failed (stale_if_error).",
        )
        self.policy_errors = counter(
            "retrieval_gate_policy_errors", "Policy evaluations that failed."
        )
        self.verdict_cache_hits = counter(
            "retrieval_gate_verdict_cache_hits",
            "Chunk verdicts of a time-pure policy answered by the verdict cache.",
        )
        self.verdict_cache_misses = counter(
            "retrieval_gate_verdict_cache_misses",
            "Chunk verdicts of a time-pure policy evaluated in Rego (verdict cache misses).",
        )
        self.substitutions = counter(
            "retrieval_gate_substitutions",
            "Superseded chunks replaced in place by their admitted successor.",
        )
        self.audit_records = counter("retrieval_gate_audit_records", "Audit records written.")
        self.audit_errors = counter(
            "retrieval_gate_audit_errors", "Audit records that could not be written."
        )
        self.audit_shipping_failed = Gauge(
            "retrieval_gate_audit_shipping_failed",
            "1 when the audit shipper stopped for good (see the sidecar log); records pile up.",
            registry=r,
            # With several workers: 1 when any worker's shipper stopped.
            multiprocess_mode="max",
        )
        self.audit_backlog = Gauge(
            "retrieval_gate_audit_backlog",
            "Audit records spooled locally and not yet confirmed in the PostgreSQL audit table.",
            registry=r,
            # With several workers: the backlogs of the live workers, added up.
            multiprocess_mode="livesum",
        )
        self.serving = Gauge(
            "retrieval_gate_serving",
            "1 while the gate's gRPC health service reports SERVING; 0 while it waits for "
            "its metadata store at start (every request refused) and once it stops.",
            registry=r,
            # With several workers: 1 only while every live worker serves.
            multiprocess_mode="livemin",
        )
        self.audit_spool_bytes = Gauge(
            "retrieval_gate_audit_spool_bytes",
            "Bytes in all segments of the local audit log (the spool, with a PostgreSQL "
            "audit store).",
            registry=r,
            # With several workers: each writes its own log; their sizes added up.
            multiprocess_mode="livesum",
        )
        self.audit_spool_limit_bytes = Gauge(
            "retrieval_gate_audit_spool_limit_bytes",
            "audit.max_spool_bytes, the bound on the audit log's segments (0: none).",
            registry=r,
            # Per worker, like the spool: added up, comparable with the spool's bytes.
            multiprocess_mode="livesum",
        )
        self.audit_oldest_unshipped = Gauge(
            "retrieval_gate_audit_oldest_unshipped_timestamp_seconds",
            "Unix time of the oldest spooled audit record not yet confirmed in PostgreSQL "
            "(0: none).",
            registry=r,
            # With several workers: one series per worker (pid); 0 must not hide another's.
            multiprocess_mode="liveall",
        )
        self.audit_segments_deleted = counter(
            "retrieval_gate_audit_segments_deleted",
            "Sealed audit log segments deleted, by reason: shipped (PostgreSQL was read back "
            "to hold every record), retention (audit.max_spool_bytes or "
            "audit.retention_seconds without a store: their records are gone).",
            ("reason",),
        )
        self.audit_checkpoints = counter(
            "retrieval_gate_audit_checkpoints",
            "Signed checkpoints of the audit chain's head written (audit.checkpoint_key_file).",
        )
        self.audit_last_checkpoint = Gauge(
            "retrieval_gate_audit_last_checkpoint_timestamp_seconds",
            "Unix time of the last signed audit checkpoint this process wrote (0: none yet).",
            registry=r,
            # With several workers: one series per worker (pid), each its own chain.
            multiprocess_mode="liveall",
        )
        self.audit_oldest_unsigned = Gauge(
            "retrieval_gate_audit_oldest_unsigned_timestamp_seconds",
            "Unix time of the first audit record no signed checkpoint covers yet (0: none, "
            "or no signing key).",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.audit_checkpoint_every_seconds = Gauge(
            "retrieval_gate_audit_checkpoint_every_seconds",
            "audit.checkpoint_every_seconds while checkpoints are signed (0: no signing key).",
            registry=r,
            multiprocess_mode="liveall",
        )
        self.policy_info = Gauge(
            "retrieval_gate_policy_info",
            "1 for the policy revision decisions are made with (a policy_bundle's revision; "
            "without a bundle, the policy's version), 0 for revisions active before.",
            ("revision",),
            registry=r,
            # With several workers: 1 while any live worker has that revision active.
            multiprocess_mode="livemax",
        )
        self.policy_bundle_refusals = counter(
            "retrieval_gate_policy_bundle_refusals",
            "Policy bundles refused (the last good revision stays active), by reason: "
            "unavailable, format, too_large, unsafe_path, unsigned, signature, roots, "
            "compile, tests, time_purity.",
            ("reason",),
        )
        self.answer_claims = counter(
            "retrieval_gate_answer_claims",
            "Claims of answers checked by Gate/VerifyAnswer, by verdict (supported, "
            "unknown_decision, not_released, text_mismatch, revoked_since, superseded_since, "
            "quote_not_found).",
            ("verdict",),
        )
        self.answer_verifications = counter(
            "retrieval_gate_answer_verifications",
            "Answers checked by Gate/VerifyAnswer, by result: supported (every claim "
            "supported, every decision id the caller's) or unsupported.",
            ("result",),
        )
        # Every verdict's series exists from the start: the first unsupported
        # claim must be an increase an alert can see.
        for verdict in ClaimVerdict:
            self.answer_claims.labels(verdict.value)
        for result in ("supported", "unsupported"):
            self.answer_verifications.labels(result)

        # labels() is slow next to inc(): children are kept per label values.
        # Their number is bounded by the closed label sets.
        self._chunk_children: dict[tuple[str, str, str, str], Any] = {}
        self._reason_children: dict[tuple[str, str, str], Any] = {}
        self._response_children: dict[tuple[str, str, str], Any] = {}
        self._drift_children: dict[tuple[str, str, str], Any] = {}

    def preset(self, format_names: Iterable[str]) -> None:
        """Create the series alerts wait for at 0, for each format and collection label.

        ``PRESET_REASONS`` in ``retrieval_gate_chunk_reasons_total``, every
        drift kind in ``retrieval_gate_drift_total`` and
        ``retrieval_gate_pushdown_tenant_mismatches_total``: one tampered or
        leaked chunk must raise its alert even when it is the first ever seen.
        """
        for status in REFUSAL_STATUSES:
            self.request_refusals.labels(status)
        collections = [*sorted(self._collections), OTHER_COLLECTION, NO_COLLECTION]
        for format_name in format_names:
            for collection in collections:
                self.count_reasons(format_name, collection, dict.fromkeys(PRESET_REASONS, 0))
                self.count_drift(format_name, collection, dict.fromkeys(Drift, 0))
                self.pushdown_tenant_mismatches.labels(format_name, collection)

    def policy_activated(self, revision: str, previous: str | None) -> None:
        """Mark ``revision`` as the active policy bundle revision (and ``previous`` as not)."""
        if previous is not None and previous != revision:
            self.policy_info.labels(previous).set(0)
        self.policy_info.labels(revision).set(1)

    def preset_bundle_refusals(self, reasons: Iterable[str]) -> None:
        """Create ``retrieval_gate_policy_bundle_refusals_total`` at 0 for each reason,
        so that the first refused bundle is an increase an alert can see."""
        for reason in reasons:
            self.policy_bundle_refusals.labels(reason)

    def count_request_refusal(self, status: int) -> None:
        """Count a request refused before the database was asked (``status`` label)."""
        label = str(status) if str(status) in REFUSAL_STATUSES else "other"
        self.request_refusals.labels(label).inc()

    def collection_label(
        self, names: Sequence[str], aliases: Mapping[str, str] | None = None
    ) -> str:
        """The ``collection`` label of a route naming ``names`` (see NO_COLLECTION).

        ``aliases`` gives the name learned for a collection a route names by id
        (Chroma): it counts under that name when the name is on the allowlist,
        else under its id when the id is.
        """
        if not names:
            return NO_COLLECTION
        if len(names) == 1:
            alias = (aliases or {}).get(names[0])
            if alias is not None and alias in self._collections:
                return alias
            if names[0] in self._collections:
                return names[0]
        return OTHER_COLLECTION

    def count_chunks(
        self, format_name: str, collection: str, counts: Mapping[tuple[str, str], int]
    ) -> None:
        """Add ``counts`` per (decision, primary reason) to ``retrieval_gate_chunks_total``."""
        children = self._chunk_children
        for (decision, reason), n in counts.items():
            key = (decision, reason, format_name, collection)
            child = children.get(key)
            if child is None:
                child = children[key] = self.chunks.labels(*key)
            child.inc(n)

    def count_reasons(self, format_name: str, collection: str, counts: Mapping[str, int]) -> None:
        """Add ``counts`` per reason to ``retrieval_gate_chunk_reasons_total``."""
        _count_per_kind(self.chunk_reasons, self._reason_children, format_name, collection, counts)

    def count_drift(self, format_name: str, collection: str, counts: Mapping[str, int]) -> None:
        """Add ``counts`` per drift kind (a ``Drift`` value) to ``retrieval_gate_drift_total``."""
        _count_per_kind(self.drift, self._drift_children, format_name, collection, counts)

    def count_response(self, outcome: str, format_name: str, collection: str) -> None:
        """Count one response in ``retrieval_gate_responses_total``."""
        key = (outcome, format_name, collection)
        child = self._response_children.get(key)
        if child is None:
            child = self._response_children[key] = self.responses.labels(*key)
        child.inc()

    def count_verification(self, check: AnswerCheck) -> None:
        """Count one verified answer and each of its claims by verdict."""
        counts: dict[str, int] = {}
        for claim in check.claims:
            counts[claim.verdict] = counts.get(claim.verdict, 0) + 1
        for verdict, n in counts.items():
            self.answer_claims.labels(verdict).inc(n)
        self.answer_verifications.labels("supported" if check.supported else "unsupported").inc()

    def preset_segment_deletions(self, reasons: Iterable[str]) -> None:
        """Create ``retrieval_gate_audit_segments_deleted_total`` at 0 for each reason."""
        for reason in reasons:
            self.audit_segments_deleted.labels(reason)

    # SpoolObserver protocol (sidecar.audit.jsonl): keeps the audit log free of Prometheus.
    def spool_size(self, total_bytes: int) -> None:
        self.audit_spool_bytes.set(total_bytes)

    def segment_deleted(self, reason: str) -> None:
        self.audit_segments_deleted.labels(reason).inc()

    # CheckpointObserver protocol (sidecar.audit.checkpointing).
    def checkpoint_written(self, at: float) -> None:
        self.audit_checkpoints.inc()
        self.audit_last_checkpoint.set(at)

    def unsigned_since(self, at: float) -> None:
        self.audit_oldest_unsigned.set(at)

    # CacheObserver protocol (sidecar.store.cache): keeps the cache free of Prometheus.
    def hit(self, n: int) -> None:
        if n:
            self.cache_hits.inc(n)

    def miss(self, n: int) -> None:
        if n:
            self.cache_misses.inc(n)

    def store_error(self) -> None:
        self.store_errors.inc()

    def store_latency(self, seconds: float) -> None:
        self.store_seconds.observe(seconds)

    def evicted(self, n: int) -> None:
        if n:
            self.cache_evictions.inc(n)

    def invalidated(self, n: int) -> None:
        if n:
            self.cache_invalidations.inc(n)

    def cleared(self) -> None:
        self.cache_flushes.inc()

    def watching(self, seen: bool) -> None:
        self.store_changes_watched.set(1 if seen else 0)

    def stale_served(self, n: int) -> None:
        if n:
            self.cache_stale_served.inc(n)


def _count_per_kind(
    metric: Any,
    children: dict[tuple[str, str, str], Any],
    format_name: str,
    collection: str,
    counts: Mapping[str, int],
) -> None:
    """Add ``counts`` to ``metric``'s (kind, format, collection) children, kept in
    ``children``: ``labels()`` resolves a child per call, which the hot path avoids."""
    for kind, n in counts.items():
        key = (kind, format_name, collection)
        child = children.get(key)
        if child is None:
            child = children[key] = metric.labels(*key)
        child.inc(n)
