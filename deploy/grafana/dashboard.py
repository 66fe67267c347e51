"""The Retrieval Gate Grafana dashboard, as code (grafana-foundation-sdk builders).

Run ``python deploy/grafana/dashboard.py > deploy/grafana/retrieval-gate.json``
to regenerate the committed JSON; tests/envoy/test_grafana.py fails when the two
differ, and runs every panel query against a real Prometheus scraping a gate.

Every query is limited to the ``cluster`` and ``namespace`` chosen and to the
gate deployments chosen in the ``job`` variable (Envoy's counters: the
``envoy_job`` variable); the per-chunk and per-response counters also to the
``format`` and ``collection`` variables. The "Gate health" row reads what the
shipped alerts read (deploy/prometheus, docs/alerts.md): scrape health,
Envoy's ext_proc counters and answers, the bypass detector's two sides (the
protected database's Istio counter, the ``database`` variable) and the audit
spool; firing RetrievalGate alerts show as annotations. The cache, store,
latency and audit instruments carry no format or collection labels, so their
panels show the whole of each deployment.
Queries sum over instances and workers, whatever the number of gate pods.
"""

from __future__ import annotations

import json
import sys

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    Threshold,
    ThresholdsMode,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

UID = "retrieval-gate"
# The example database of deploy/kubernetes/overlays/istio; the bypass panel's default.
DATABASE_WORKLOAD = "vector-db"
TITLE = "Retrieval Gate"

# Grafana replaces these before a query reaches Prometheus.
RATE_WINDOW = "$__rate_interval"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every query is limited to the chosen gate deployments (Prometheus jobs),
# cluster and namespace. A target without a cluster label matches "All" (.*).
JOB = 'job=~"$job"'
WHERE = 'cluster=~"$cluster", namespace=~"$namespace"'
# Envoy's statistics: the Envoy in front of the gate (job retrieval-gate-envoy
# in deploy/kubernetes/components/monitoring), its gated listener's stat prefix.
ENVOY = 'job=~"$envoy_job", cluster=~"$cluster", namespace=~"$namespace"'
GATED_LISTENER = 'envoy_http_conn_manager_prefix="retrieval_gate"'
# The protected database as Istio's istio-proxy in front of it reports it: the
# selector of the recording rule retrieval_gate:database_requests:rate5m.
DATABASE = (
    'reporter="destination", destination_workload=~"$database", response_code!="401", '
    'cluster=~"$cluster"'
)
# Firing alerts of deploy/prometheus, as annotations on every panel.
ALERT_ANNOTATIONS = (
    'ALERTS{alertname=~"RetrievalGate.*", alertstate="firing", '
    'cluster=~"$cluster", namespace=~"$namespace"}'
)

# The labelled counters (sidecar/metrics.py). CHUNKS counts each chunk once, by
# its primary reason; CHUNK_REASONS counts every reason of a rejected chunk, so
# a revoked chunk whose text was also tampered with shows in both drift panels.
CHUNKS = "retrieval_gate_chunks_total"
CHUNK_REASONS = "retrieval_gate_chunk_reasons_total"
RESPONSES = "retrieval_gate_responses_total"
PUSHDOWN_MISMATCHES = "retrieval_gate_pushdown_tenant_mismatches_total"
# HASH_MISMATCH chunks by drift class (kind), for records that hold their text.
DRIFT = "retrieval_gate_drift_total"

# Reasons that mean the index has drifted from the metadata store
# (docs/metrics-and-audit.md, "Reason codes").
HASH_REASONS = "HASH_MISMATCH|PAYLOAD_HASH_MISMATCH"
STALE_REASONS = "STATUS_SUPERSEDED|STATUS_REVOKED|EXPIRED"
# The alerts of deploy/prometheus/ name a collection of a format: so do these panels.
PER_COLLECTION = "collection, format"
COLLECTION_LEGEND = "{{collection}} ({{format}})"
REASON_LEGEND = COLLECTION_LEGEND + " {{reason}}"
DRIFT_LEGEND = COLLECTION_LEGEND + " {{kind}}"
FAIL_CLOSED_REASONS = "POLICY_ERROR|METADATA_UNAVAILABLE"
# Outcomes of responses the client did not get as the upstream sent them.
REFUSAL_OUTCOMES = "error|upstream_error|blocked"


def selector(metric: str, *matchers: str) -> str:
    """``metric{...}`` filtered by the dashboard's variables and ``matchers``.

    For the labelled counters only: each carries ``format`` and ``collection``.
    """
    labels = [JOB, WHERE, 'format=~"$format"', 'collection=~"$collection"', *matchers]
    return f"{metric}{{{', '.join(labels)}}}"


def of_job(metric: str) -> str:
    """``metric`` of the chosen gate deployments (the instruments without labels)."""
    return f"{metric}{{{JOB}, {WHERE}}}"


def rate(series: str) -> str:
    """Per-second rate of a counter selector over Grafana's rate window."""
    return f"rate({series}[{RATE_WINDOW}])"


def summed(by: str, series: str) -> str:
    """``sum by (by) (rate(series))``; ``by`` empty sums everything."""
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}({rate(series)})"


def ratio(by: str, part: str, whole: str) -> str:
    """Rate of ``part`` over rate of ``whole``, as deploy/prometheus/ records its ratios.

    ``or 0 * whole`` keeps a group whose part counter has no series yet: a
    collection that admits nothing must show 0 %, not disappear. ``> 0``
    leaves out groups with no traffic in the window instead of dividing by 0.
    """
    return f"({summed(by, part)} or 0 * {summed(by, whole)}) / ({summed(by, whole)} > 0)"


def total(counter: str) -> str:
    """Per-second rate of a counter without labels, over the chosen deployments."""
    return summed("", of_job(counter))


def age(timestamp: str) -> str:
    """Seconds since a Unix-time gauge of the chosen deployments, the oldest of them;
    0 where the gauge is 0 ("none": nothing unsigned, no key), not 56 years."""
    series = of_job(timestamp)
    return f"max((time() - {series}) * ({series} > bool 0))"


def hit_ratio(hits: str, misses: str) -> str:
    """Hits over hits and misses of a cache, from its two counters."""
    return f"{total(hits)} / ({total(hits)} + {total(misses)})"


def quantile(q: float, histogram: str) -> str:
    """The ``q`` quantile of a histogram over the rate window, all instances together."""
    return f"histogram_quantile({q}, sum by (le) ({rate(of_job(histogram + '_bucket'))}))"


def query(ref_id: str, expr: str, legend: str) -> prometheus.Dataquery:
    """One Prometheus range query of a panel."""
    return (
        prometheus.Dataquery()
        .ref_id(ref_id)
        .expr(expr)
        .legend_format(legend)
        .range()
        .datasource(DATASOURCE)
    )


def graph(
    title: str,
    description: str,
    unit: str,
    targets: list[tuple[str, str]],
    *,
    width: int = 12,
    stacked: bool = False,
) -> timeseries.Panel:
    """A time series panel; ``targets`` are (PromQL, legend) pairs."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .min(0)
        .height(8)
        .span(width)
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .show_legend(True)
            .calcs(["mean", "max"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI))
    )
    if stacked:
        panel = panel.stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL))
    for index, (expr, legend) in enumerate(targets):
        panel = panel.with_target(query(chr(ord("A") + index), expr, legend))
    return panel


def single(
    title: str,
    description: str,
    unit: str,
    expr: str,
    steps: list[Threshold],
) -> stat.Panel:
    """A stat panel showing the last value of one query, coloured by ``steps``."""
    return (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .height(4)
        .span(4)
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
        .thresholds(dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
        .with_target(query("A", expr, title))
    )


def _steps(*pairs: tuple[float | None, str]) -> list[Threshold]:
    return [Threshold(value=value, color=color) for value, color in pairs]


GOOD_HIGH = _steps((None, "red"), (0.5, "orange"), (0.8, "green"))
BAD_ABOVE_ZERO = _steps((None, "green"), (1, "red"))
NEUTRAL = _steps((None, "green"))
# Red from the RetrievalGateDecisionLatencyHigh alert's threshold (p99 > 0.25 s).
SLOW_DECISIONS = _steps((None, "green"), (0.05, "orange"), (0.25, "red"))

ALL_CHUNKS = selector(CHUNKS)
DECIDED = selector(RESPONSES, 'outcome=~"filtered|abstained|blocked"')


def overview() -> list[stat.Panel]:
    """Headline numbers, one row."""
    return [
        single(
            "Admitted ratio",
            "Chunks admitted over chunks decided. A fall means the index returns more "
            "chunks the caller may not see, or drifted ones (see the drift row).",
            "percentunit",
            ratio("", selector(CHUNKS, 'decision="admitted"'), ALL_CHUNKS),
            GOOD_HIGH,
        ),
        single(
            "Responses / s",
            "Upstream responses the gate saw, every outcome.",
            "reqps",
            summed("", selector(RESPONSES)),
            NEUTRAL,
        ),
        single(
            "Decision p99",
            "99th percentile of the time to decide one response body, sidecar side.",
            "s",
            quantile(0.99, "retrieval_gate_decision_seconds"),
            SLOW_DECISIONS,
        ),
        single(
            "Metadata cache hit ratio",
            "Metadata lookups served by the cache, over all lookups.",
            "percentunit",
            hit_ratio("retrieval_gate_cache_hits_total", "retrieval_gate_cache_misses_total"),
            GOOD_HIGH,
        ),
        single(
            "Audit backlog",
            "Audit records spooled locally, not yet confirmed in PostgreSQL "
            "(0 without --audit-store).",
            "short",
            f"sum({of_job('retrieval_gate_audit_backlog')})",
            _steps((None, "green"), (1000, "orange"), (10000, "red")),
        ),
        single(
            "Audit shipping stopped",
            "1 when an audit shipper stopped for good: records pile up; see the sidecar log.",
            "short",
            f"max({of_job('retrieval_gate_audit_shipping_failed')})",
            BAD_ABOVE_ZERO,
        ),
    ]


def envoy(metric: str, *matchers: str) -> str:
    """An Envoy statistic of the chosen Envoys (``envoy_job``)."""
    return f"{metric}{{{', '.join([ENVOY, *matchers])}}}"


OLDEST_UNSHIPPED = of_job("retrieval_gate_audit_oldest_unshipped_timestamp_seconds")


def health() -> list[timeseries.Panel]:
    """The gate itself: scraped and serving, called by Envoy, not routed around."""
    return [
        graph(
            "Gates up and serving",
            "up: 1 while Prometheus scrapes the gate's metrics port (RetrievalGateDown, "
            "RetrievalGateAbsent). serving: 1 while the gate's health service reports "
            "SERVING (RetrievalGateNotServing).",
            "short",
            [
                (f"up{{{JOB}, {WHERE}}}", "up {{instance}}"),
                (of_job("retrieval_gate_serving"), "serving {{instance}}"),
            ],
            width=8,
        ),
        graph(
            "Envoy ext_proc failures",
            "Envoy's calls to the gate: failed streams (gate down or erroring), message "
            "timeouts, and requests Envoy let through without the gate "
            "(failure_mode_allow; should stay 0).",
            "ops",
            [
                (summed("", envoy("envoy_http_ext_proc_streams_failed")), "failed streams"),
                (summed("", envoy("envoy_http_ext_proc_message_timeouts")), "message timeouts"),
                (
                    summed("", envoy("envoy_http_ext_proc_failure_mode_allowed")),
                    "passed without the gate",
                ),
            ],
            width=8,
        ),
        graph(
            "Gated listener answers by class",
            "Answers of the Envoy listener in front of the gate, by status class: 5xx when "
            "the gate is down (503), cannot audit (500) or the database fails "
            "(RetrievalGateEnvoy5xx).",
            "reqps",
            [
                (
                    summed(
                        "envoy_response_code_class",
                        envoy("envoy_http_downstream_rq_xx", GATED_LISTENER),
                    ),
                    "{{envoy_response_code_class}}xx",
                ),
            ],
            width=8,
            stacked=True,
        ),
        graph(
            "Bypass: database requests vs gate requests",
            "Requests the protected database's istio-proxy counted (the database variable) "
            "and requests the gate saw (responses and refusals). More at the database than "
            "through the gate is traffic around it (RetrievalGateBypassed).",
            "reqps",
            [
                (summed("", f"istio_requests_total{{{DATABASE}}}"), "reached the database"),
                (
                    f"{summed('', of_job(RESPONSES))}"
                    f" + {summed('', of_job('retrieval_gate_request_refusals_total'))}",
                    "passed the gate",
                ),
            ],
        ),
        graph(
            "Audit spool",
            "Bytes of the local audit spool per pod against its bound (0: no bound), and the "
            "age of the oldest record not yet in PostgreSQL (RetrievalGateAuditSpoolNearLimit, "
            "RetrievalGateAuditUnshippedTooOld).",
            "bytes",
            [
                (
                    f"sum by (instance) ({of_job('retrieval_gate_audit_spool_bytes')})",
                    "spool {{instance}}",
                ),
                (
                    f"max by (instance) ({of_job('retrieval_gate_audit_spool_limit_bytes')})",
                    "bound {{instance}}",
                ),
                # 0 while nothing waits (the gauge is 0 then).
                (
                    f"time() - min by (instance) ({OLDEST_UNSHIPPED} > 0)"
                    f" or min by (instance) ({OLDEST_UNSHIPPED}) * 0",
                    "oldest unshipped, seconds {{instance}}",
                ),
            ],
        ),
        graph(
            "Audit segments deleted",
            "Sealed segments of the audit log deleted per second: shipped (PostgreSQL read "
            "back to hold every record) or retention (no store: those records are gone).",
            "ops",
            [
                (
                    summed("reason", of_job("retrieval_gate_audit_segments_deleted_total")),
                    "{{reason}}",
                )
            ],
        ),
    ]


def decisions() -> list[timeseries.Panel]:
    """What the gate decided, per outcome, reason and collection."""
    return [
        graph(
            "Responses by outcome",
            "filtered: some chunks removed; abstained: nothing admitted; blocked: strict mode "
            "refused the body; passthrough: not inspected or audit mode; error: the gate's "
            "own refusal; upstream_error: a non-2xx upstream answer the gate replaced.",
            "reqps",
            [(summed("outcome", selector(RESPONSES)), "{{outcome}}")],
            stacked=True,
        ),
        graph(
            "Chunks by decision and reason",
            "Chunks decided per second: admitted (reason NONE) and rejected by primary reason.",
            "cps",
            [(summed("decision, reason", ALL_CHUNKS), "{{decision}} {{reason}}")],
            stacked=True,
        ),
        graph(
            "Rejections by reason and collection",
            "Rejected chunks per second by primary reason, per collection "
            "(`other` for collections outside the configured allowlist).",
            "cps",
            [
                (
                    summed("collection, reason", selector(CHUNKS, 'decision="rejected"')),
                    "{{collection}} {{reason}}",
                )
            ],
        ),
        graph(
            "Admitted ratio per collection",
            "Chunks admitted over chunks decided, per collection; 0 when a collection "
            "admits nothing.",
            "percentunit",
            [
                (
                    ratio(PER_COLLECTION, selector(CHUNKS, 'decision="admitted"'), ALL_CHUNKS),
                    COLLECTION_LEGEND,
                )
            ],
        ),
        graph(
            "Abstention ratio per collection",
            "Responses with nothing admitted over responses the gate decided, per collection. "
            "A spike against its own baseline: the index or the policy changed.",
            "percentunit",
            [
                (
                    ratio(PER_COLLECTION, selector(RESPONSES, 'outcome="abstained"'), DECIDED),
                    COLLECTION_LEGEND,
                )
            ],
            width=24,
        ),
    ]


def drift() -> list[timeseries.Panel]:
    """The index disagreeing with the metadata store, per collection and format.

    Every reason of a rejected chunk counts (CHUNK_REASONS), as in the alerts.
    """
    stale = selector(CHUNK_REASONS, f'reason=~"{STALE_REASONS}"')

    def reasons(matcher: str, by: str = f"{PER_COLLECTION}, reason") -> str:
        return summed(by, selector(CHUNK_REASONS, matcher))

    return [
        graph(
            "Hash mismatches",
            "Chunks whose returned text (HASH_MISMATCH) or hashed payload fields "
            "(PAYLOAD_HASH_MISMATCH) differ from the store's hash: tampering, or stale "
            "re-ingestion. Should be zero.",
            "cps",
            [(reasons(f'reason=~"{HASH_REASONS}"'), REASON_LEGEND)],
        ),
        graph(
            "Hash mismatches by drift class",
            "HASH_MISMATCH chunks whose record holds the authoritative text, by what "
            "changed: injection and replacement point at tampering "
            "(RetrievalGateIndexTampering); edit, format_only and truncation at stale "
            "re-ingestion (RetrievalGateStaleIngestion). Records without text are not here.",
            "cps",
            [(summed(f"{PER_COLLECTION}, kind", selector(DRIFT)), DRIFT_LEGEND)],
        ),
        graph(
            "Missing metadata",
            "Chunks the index returned that the metadata store does not know: ingestion "
            "wrote to the index only, or the store lost records.",
            "cps",
            [(reasons('reason="MISSING_METADATA"', PER_COLLECTION), COLLECTION_LEGEND)],
        ),
        graph(
            "Cross-tenant hits",
            "Chunks of another tenant in answers to searches the gate confined to the "
            "caller's tenant (push-down): the database ignored the filter, should be zero. "
            "Beside it, every chunk rejected TENANT_MISMATCH (expected on routes without "
            "push-down).",
            "cps",
            [
                (
                    summed(PER_COLLECTION, selector(PUSHDOWN_MISMATCHES)),
                    f"push-down ignored: {COLLECTION_LEGEND}",
                ),
                (
                    reasons('reason="TENANT_MISMATCH"', PER_COLLECTION),
                    f"all tenant mismatches: {COLLECTION_LEGEND}",
                ),
            ],
        ),
        graph(
            "Stale retrieval",
            "Superseded, revoked and expired chunks still retrieved, per collection, and "
            "superseded chunks replaced in place by their successor (all collections).",
            "cps",
            [
                (summed(f"{PER_COLLECTION}, reason", stale), REASON_LEGEND),
                (
                    total("retrieval_gate_substitutions_total"),
                    "substituted by successor",
                ),
            ],
        ),
        graph(
            "Stale retrieval ratio per collection",
            "Superseded, revoked and expired chunks over all chunks decided, per collection "
            "(capped at 1: a chunk can be both revoked and expired), as the "
            "RetrievalGateStaleRetrieval alert measures it: the share of what the index "
            "returns that should have been re-embedded or deleted.",
            "percentunit",
            [
                (
                    f"clamp_max({ratio(PER_COLLECTION, stale, ALL_CHUNKS)}, 1)",
                    COLLECTION_LEGEND,
                )
            ],
        ),
    ]


def latency() -> list[timeseries.Panel]:
    """Decision and store lookup latency, from the histograms."""
    decision = "retrieval_gate_decision_seconds"
    store = "retrieval_gate_store_seconds"
    return [
        graph(
            "Decision latency",
            "Time to decide one response body, sidecar side (all formats).",
            "s",
            [(quantile(q, decision), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
        ),
        graph(
            "Metadata store lookup latency",
            "Time of one batched metadata store lookup (cache misses only), failed or not.",
            "s",
            [(quantile(q, store), f"p{round(q * 100)}") for q in (0.5, 0.9, 0.99)],
        ),
    ]


def cache_and_store() -> list[timeseries.Panel]:
    """How often the store is asked, and how it answers."""
    return [
        graph(
            "Cache hit ratios",
            "Metadata lookups served by the cache; chunk verdicts of a time-pure policy "
            "served by the verdict cache.",
            "percentunit",
            [
                (
                    hit_ratio(
                        "retrieval_gate_cache_hits_total", "retrieval_gate_cache_misses_total"
                    ),
                    "metadata cache",
                ),
                (
                    hit_ratio(
                        "retrieval_gate_verdict_cache_hits_total",
                        "retrieval_gate_verdict_cache_misses_total",
                    ),
                    "verdict cache",
                ),
            ],
            width=8,
        ),
        graph(
            "Store lookups and failures",
            "Chunk ids looked up in the store (cache misses), failed lookups (chunks then "
            "rejected METADATA_UNAVAILABLE, fail closed) and expired records served "
            "because the store failed (stale_if_error).",
            "ops",
            [
                (total("retrieval_gate_cache_misses_total"), "ids looked up"),
                (total("retrieval_gate_store_errors_total"), "failed lookups"),
                (total("retrieval_gate_cache_stale_served_total"), "stale served"),
            ],
            width=8,
        ),
        graph(
            "Cache evictions",
            "Entries dropped before expiry to respect cache_size: raise it if this is "
            "steady and the hit ratio low.",
            "ops",
            [(total("retrieval_gate_cache_evictions_total"), "evictions")],
            width=8,
        ),
        graph(
            "Store changes watched",
            "1 while every gate sees store changes as they happen (PostgreSQL LISTEN up, "
            "SQLite change poll working); at 0 a gate caches nothing and asks the store for "
            "every chunk (RetrievalGateStoreChangesUnwatched).",
            "short",
            [(f"min({of_job('retrieval_gate_store_changes_watched')})", "watched")],
            width=8,
        ),
    ]


def revocation() -> list[timeseries.Panel]:
    """Store changes reaching the gate, and revoked chunks it still sees."""
    return [
        graph(
            "Revocation propagation",
            "Chunk ids invalidated by store change notifications (PostgreSQL LISTEN) and "
            "upserts, and whole-cache flushes (the listener reconnected). Flat zero with "
            "a PostgreSQL store while documents change: notifications are not arriving, "
            "so revocations wait for cache.ttl_seconds.",
            "ops",
            [
                (total("retrieval_gate_cache_invalidations_total"), "ids invalidated"),
                (total("retrieval_gate_cache_flushes_total"), "cache flushes"),
            ],
        ),
        graph(
            "Revoked chunks still retrieved",
            "Revoked chunks the index still returns (rejected STATUS_REVOKED), per "
            "collection: delete them from the index.",
            "cps",
            [
                (
                    summed(PER_COLLECTION, selector(CHUNK_REASONS, 'reason="STATUS_REVOKED"')),
                    COLLECTION_LEGEND,
                )
            ],
        ),
    ]


def refusals() -> list[timeseries.Panel]:
    """Responses the client did not get as sent, and the fail-closed paths."""
    return [
        graph(
            "Refusals by cause",
            "error: the gate's own refusal of a response (unreadable or malformed body, more "
            "hits than max_hits, audit unavailable); upstream_error: a non-2xx upstream "
            "answer replaced by the gate's error body; blocked: strict mode refused a body "
            "with a rejected chunk.",
            "reqps",
            [
                (
                    summed(
                        "outcome, format",
                        selector(RESPONSES, f'outcome=~"{REFUSAL_OUTCOMES}"'),
                    ),
                    "{{outcome}} {{format}}",
                )
            ],
        ),
        graph(
            "Requests refused before the database",
            "By HTTP status: 400 an unreadable or unfilterable search, 401 no usable "
            "identity, 403 the request policy (routes, collections), 405 a probing "
            "method, 5xx the gate's own failure.",
            "reqps",
            [
                (
                    summed("status", of_job("retrieval_gate_request_refusals_total")),
                    "{{status}}",
                )
            ],
        ),
        graph(
            "Fail-closed errors",
            "Policy evaluations and metadata store lookups that failed (whole gate), and "
            "the chunks refused for it per collection: POLICY_ERROR and "
            "METADATA_UNAVAILABLE, what the RetrievalGatePolicyErrors and "
            "RetrievalGateMetadataStoreUnavailable alerts watch.",
            "ops",
            [
                (total("retrieval_gate_policy_errors_total"), "policy errors"),
                (total("retrieval_gate_store_errors_total"), "store errors"),
                (
                    summed(
                        f"{PER_COLLECTION}, reason",
                        selector(CHUNK_REASONS, f'reason=~"{FAIL_CLOSED_REASONS}"'),
                    ),
                    REASON_LEGEND,
                ),
            ],
        ),
        graph(
            "Policy revision",
            "The policy bundle revision active in the gate (1 while any worker runs it; "
            "two at once only during a rollout), and bundles refused by reason: a "
            "refused bundle leaves the last good revision active.",
            "short",
            [
                (f"max by (revision) ({of_job('retrieval_gate_policy_info')})", "{{revision}}"),
                (
                    summed("reason", of_job("retrieval_gate_policy_bundle_refusals_total")),
                    "refused: {{reason}}",
                ),
            ],
        ),
    ]


def audit() -> list[timeseries.Panel]:
    """The audit trail: writes, failures and the PostgreSQL shipping backlog."""
    return [
        graph(
            "Audit backlog",
            "Audit records spooled locally and not yet confirmed in PostgreSQL, summed over "
            "live workers; shipping stopped is 1 when a shipper gave up for good.",
            "short",
            [
                (f"sum({of_job('retrieval_gate_audit_backlog')})", "backlog"),
                (f"max({of_job('retrieval_gate_audit_shipping_failed')})", "shipping stopped"),
            ],
        ),
        graph(
            "Audit writes",
            "Audit records written, and records that could not be written (the response "
            "was then refused with audit_unavailable).",
            "ops",
            [
                (total("retrieval_gate_audit_records_total"), "written"),
                (total("retrieval_gate_audit_errors_total"), "failed"),
                (total("retrieval_gate_audit_checkpoints_total"), "checkpoints signed"),
            ],
        ),
        graph(
            "Signed checkpoints",
            "How long the oldest record no checkpoint covers has waited, and the time since "
            "the last checkpoint, against audit.checkpoint_every_seconds: a wait above the "
            "interval means signing stopped while records are written. All 0 without a "
            "checkpoint key.",
            "s",
            [
                (age("retrieval_gate_audit_oldest_unsigned_timestamp_seconds"), "oldest unsigned"),
                (age("retrieval_gate_audit_last_checkpoint_timestamp_seconds"), "last checkpoint"),
                (
                    f"max({of_job('retrieval_gate_audit_checkpoint_every_seconds')})",
                    "interval",
                ),
            ],
        ),
        graph(
            "Answer verification",
            "Claims of answers checked by Gate/VerifyAnswer, by verdict, and answers by "
            "result: not_released or text_mismatch point at an application citing what the "
            "gate did not give it.",
            "ops",
            [
                (
                    summed("verdict", of_job("retrieval_gate_answer_claims_total")),
                    "claims {{verdict}}",
                ),
                (
                    summed("result", of_job("retrieval_gate_answer_verifications_total")),
                    "answers {{result}}",
                ),
            ],
        ),
    ]


def variables() -> list[
    dashboard.DatasourceVariable | dashboard.QueryVariable | dashboard.TextBoxVariable
]:
    """The data source; the ``cluster``, ``namespace``, ``job``, ``envoy_job``, ``format`` and
    ``collection`` filters (all by default); the protected ``database``."""
    everything = VariableOption(selected=True, text="All", value="$__all")

    def label_filter(name: str, metric: str, description: str) -> dashboard.QueryVariable:
        return (
            dashboard.QueryVariable(name)
            .label(name.capitalize())
            .description(description)
            .datasource(DATASOURCE)
            .query(f"label_values({metric}, {name})")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(everything)
        )

    return [
        dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        label_filter(
            "cluster",
            "retrieval_gate_decision_seconds_count",
            "Cluster (the target label your Prometheus or its federation sets; none: All).",
        ),
        label_filter(
            "namespace", "retrieval_gate_decision_seconds_count", "Namespaces of the gates."
        ),
        label_filter(
            "job",
            "retrieval_gate_decision_seconds_count",
            "Gate deployments: the Prometheus jobs that scrape them.",
        ),
        label_filter(
            "envoy_job",
            "envoy_http_ext_proc_streams_started",
            "The Prometheus jobs that scrape the Envoys calling the gate "
            "(retrieval-gate-envoy, or a mesh's proxies).",
        ),
        dashboard.TextBoxVariable("database")
        .label("Protected database")
        .description(
            "Istio destination_workload of the database the gate protects, as in the "
            "recording rule retrieval_gate:database_requests:rate5m (a regex)."
        )
        .default_value(DATABASE_WORKLOAD),
        label_filter("format", RESPONSES, "Response format (the route's adapter)."),
        label_filter(
            "collection",
            RESPONSES,
            "Collection named by the route (`other` outside the metric_collections "
            "allowlist, `none` on routes that name none).",
        ),
    ]


def build() -> dashboard.Dashboard:
    """The whole dashboard, rows in the order an operator reads them."""
    board = (
        dashboard.Dashboard(TITLE)
        .uid(UID)
        .description(
            "Retrieval Gate: the gate's health (scraped, serving, Envoy's calls, bypass), "
            "decisions, drift between the index and the metadata store, latency, cache, "
            "revocation propagation, refusals and the audit trail."
        )
        .tags(["retrieval-gate"])
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("browser")
    )
    for variable in variables():
        board = board.with_variable(variable)
    board = board.annotation(
        dashboard.AnnotationQuery()
        .name("Retrieval Gate alerts")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("red")
        .expr(ALERT_ANNOTATIONS)
    )
    rows: list[tuple[str, list[stat.Panel] | list[timeseries.Panel]]] = [
        ("Overview", overview()),
        ("Gate health", health()),
        ("Decisions", decisions()),
        ("Drift per collection", drift()),
        ("Latency", latency()),
        ("Cache and store", cache_and_store()),
        ("Revocation propagation", revocation()),
        ("Refusals and fail-closed errors", refusals()),
        ("Audit", audit()),
    ]
    panel_id = 0
    for title, panels in rows:
        panel_id += 1
        board = board.with_row(dashboard.Row(title).id(panel_id))
        for panel in panels:
            panel_id += 1
            board = board.with_panel(panel.id(panel_id))
    return board


def render() -> str:
    """The dashboard as Grafana's JSON model, keys sorted so that diffs stay small."""
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
