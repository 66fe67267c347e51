"""Assembles the sidecar from settings and runs its gRPC and metrics servers."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import orjson
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, start_http_server

from sidecar.audit.checkpointing import CheckpointingSink, SigningKey
from sidecar.audit.checkpoints import (
    CheckpointError,
    checkpoints_path,
    key_fingerprint,
    load_signing_key,
)
from sidecar.audit.jsonl import DELETE_REASONS, JsonlAuditSink, SpoolLimits
from sidecar.audit.postgres import PostgresAuditSink, default_chain_id
from sidecar.audit.sink import AuditSink, NullAuditSink
from sidecar.config import ConfigError, IdentityMode, PolicyEngineName, Settings, format_table
from sidecar.config.groups import StoreSettings
from sidecar.core.decision_core import DecisionCore
from sidecar.core.modes import RoutePolicies
from sidecar.core.policy import PolicyEngine, PolicyError, RequestPolicyEngine
from sidecar.core.reasons import ReasonOrder
from sidecar.enforcement.answer_verification import AnswerVerifier
from sidecar.enforcement.response_filter import ResponseFilter
from sidecar.envoy.ext_authz import AuthorizationServicer
from sidecar.envoy.ext_proc import ExternalProcessorServicer
from sidecar.envoy.gate_service import GateServicer
from sidecar.identity import IdentityProvider
from sidecar.identity.claims import ClaimMapping
from sidecar.identity.envoy_jwt import EnvoyJwtPayload
from sidecar.identity.headers import TrustedHeaders
from sidecar.identity.jwt import JwtBearer, JwtVerifier
from sidecar.identity.keys import key_source
from sidecar.identity.mesh import MeshMtls
from sidecar.identity.spiffe import WorkloadMap
from sidecar.metrics import GateMetrics
from sidecar.rego.opa_engine import OpaEngine, OpaRequestPolicy, OpaServer, read_token_file
from sidecar.rego.policy_data import PolicyDataError, check_policy_data, schema_for
from sidecar.rego.regorus_engine import RegorusEngine
from sidecar.rego.request_policy import RequestPolicy
from sidecar.request.admission import RequestAdmission
from sidecar.request.answers import RequestAnswers
from sidecar.request.gate_route import gate_admission
from sidecar.request.request_path import RequestPath
from sidecar.runtime.addresses import parse_host_port
from sidecar.runtime.answer_verification import answer_verification
from sidecar.runtime.channel import ListenError, PinnedPeer, add_listener, server_credentials
from sidecar.runtime.metadata_store import open_metadata_store
from sidecar.runtime.policy_source import (
    REFUSAL_REASONS,
    PolicySource,
    bundle_display,
    load_bundle_policy,
)
from sidecar.runtime.signals import StopSignals
from sidecar.runtime.summary import record_count, startup_summary
from sidecar.runtime.tracing import TracedCacheObserver, gate_tracer, start_tracing
from sidecar.store.cache import CachedStore
from sidecar.store.listener import ChangeListener
from sidecar.store.open import PendingStore, is_outage
from sidecar.store.store import MetadataStore, StoreUnavailable
from sidecar.store.watch import ChangeWatcher, change_watcher
from sidecar.wire import ext_authz_pb2_grpc, ext_proc_pb2_grpc, gate_pb2_grpc

log = logging.getLogger(__name__)

# On SIGTERM the gRPC server takes no new stream and gives those in flight this
# long to finish: an ext_proc stream lasts as long as its HTTP request, and the
# shipped Envoy configurations time a route out after 60 s
# (docs/kubernetes.md, "Rollouts without resets").
STOP_GRACE_SECONDS = 60.0
# A metadata store that cannot be reached at start is tried again after
# 0.25 s, 0.5 s, ... then every 5 s until it answers.
STORE_RETRY_FIRST_SECONDS = 0.25
STORE_RETRY_MAX_SECONDS = 5.0


def build_identity(settings: Settings) -> IdentityProvider:
    """The identity provider for the configured mode."""
    if settings.identity.mode is IdentityMode.TRUSTED_HEADERS:
        log.warning(
            "identity mode 'trusted-headers' believes x-gate-tenant and x-gate-principals "
            "as sent by the client: for development only, never in production"
        )
        return TrustedHeaders()
    if settings.identity.mode is IdentityMode.MESH_MTLS:
        return MeshMtls(WorkloadMap.parse(settings.identity.workloads))
    mapping = ClaimMapping(
        tenant_claim=settings.identity.tenant_claim,
        principal_claims=settings.identity.principal_claims,
        drafts_scope=settings.identity.drafts_scope,
    )
    identity = settings.identity
    assert identity.issuer is not None and identity.audience is not None  # load_settings
    if identity.mode is IdentityMode.ENVOY_JWT:
        return EnvoyJwtPayload(
            mapping,
            issuer=identity.issuer,
            audience=identity.audience,
            payload_key=identity.jwt_payload_key,
            locations=identity.jwt_credentials,
            leeway_seconds=identity.jwt_leeway_seconds,
        )
    if identity.mode is IdentityMode.JWT:
        try:
            keys = key_source(
                jwks=identity.jwks,
                public_key=identity.jwt_public_key,
                hmac_secret_file=identity.jwt_hmac_secret_file,
            )
        except (ValueError, OSError) as exc:
            # The message names the key file and what is wrong with it.
            raise ConfigError(f"identity keys: {exc}") from exc
        verifier = JwtVerifier(
            keys,
            issuer=identity.issuer,
            audience=identity.audience,
            leeway_seconds=identity.jwt_leeway_seconds,
        )
        return JwtBearer(verifier, mapping, identity.jwt_credentials)
    raise ConfigError(f"unsupported identity mode {identity.mode!r}")


def build_audit(settings: Settings, metrics: GateMetrics) -> AuditSink:
    """The audit sink: nothing, a JSON Lines log, or that log as a spool shipped to PostgreSQL;
    with a checkpoint key, wrapped to sign checkpoints of the chain's head."""
    audit = settings.audit
    if audit.log is None:
        log.warning("no audit log configured (--audit-log): decisions are not recorded")
        return NullAuditSink()
    signing = load_checkpoint_key(settings)
    limits = SpoolLimits(
        segment_bytes=audit.segment_bytes,
        segment_seconds=audit.segment_seconds,
        max_spool_bytes=audit.max_spool_bytes,
        retention_seconds=audit.retention_seconds,
    )
    metrics.audit_spool_limit_bytes.set(audit.max_spool_bytes)
    metrics.preset_segment_deletions(DELETE_REASONS)
    checkpoints = checkpoints_path(audit.log)
    sink: JsonlAuditSink | PostgresAuditSink
    if audit.store is None:
        sink = JsonlAuditSink(audit.log, limits, observer=metrics)
    else:
        sink = _postgres_audit(settings, limits, metrics, checkpoints if signing else None)
    if signing is None:
        return sink
    metrics.audit_checkpoint_every_seconds.set(audit.checkpoint_every_seconds)
    try:
        return CheckpointingSink(
            sink,
            checkpoints,
            chain_id=audit.chain_id or default_chain_id(audit.log),
            signing=signing,
            every_records=audit.checkpoint_every_records,
            every_seconds=audit.checkpoint_every_seconds,
            observer=metrics,
        )
    except CheckpointError as exc:
        sink.close()
        raise ConfigError(f"audit checkpoints: {exc}") from None
    except BaseException:
        sink.close()
        raise


def load_checkpoint_key(settings: Settings) -> SigningKey | None:
    """The checkpoint signing key and its id, or None when checkpoints are off.

    ConfigError names the file and what is wrong with it, never its contents.
    """
    path = settings.audit.checkpoint_key_file
    if path is None:
        return None
    try:
        key = load_signing_key(path)
    except ValueError as exc:
        raise ConfigError(f"audit.checkpoint_key_file {exc}") from None
    return SigningKey(key, settings.audit.checkpoint_key_id or key_fingerprint(key.public_key()))


def _postgres_audit(
    settings: Settings, limits: SpoolLimits, metrics: GateMetrics, checkpoints: Path | None
) -> PostgresAuditSink:
    audit = settings.audit
    assert audit.log is not None and audit.store is not None

    def report(backlog: int) -> None:
        # Set, not set_function: with several workers only set values reach
        # the parent's /metrics (prometheus-client multiprocess mode).
        metrics.audit_backlog.set(backlog)
        metrics.audit_oldest_unshipped.set(sink.oldest_unshipped)
        metrics.audit_shipping_failed.set(0 if sink.failure is None else 1)

    sink = PostgresAuditSink(
        audit.log,
        audit.store,
        chain_id=audit.chain_id,
        limits=limits,
        observer=metrics,
        on_backlog=report,
        checkpoints=checkpoints,
    )
    report(sink.backlog)
    sink.start()
    return sink


def load_policy_data(settings: Settings) -> dict[str, Any] | None:
    """The --policy-data JSON document, or None."""
    if settings.policy.data is None:
        return None
    try:
        document = orjson.loads(settings.policy.data.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"policy data {settings.policy.data}: {exc}") from exc
    if not isinstance(document, dict):
        raise ConfigError(f"policy data {settings.policy.data}: must be a JSON object")
    try:
        check_policy_data(document, schema_for(settings.policy.dir))
    except PolicyDataError as exc:
        raise ConfigError(
            *(f"policy data {settings.policy.data}: {problem}" for problem in exc.problems)
        ) from None
    except PolicyError as exc:
        raise ConfigError(f"policy.dir {settings.policy.dir}: {exc}") from None
    return document


def build_policies(settings: Settings) -> tuple[PolicyEngine, RequestPolicyEngine, str]:
    """The chunk policy engine, the request policy and where they come from (for the log).

    regorus: the Rego files of ``policy.dir`` (and ``policy.data``) in process,
    or the current revision of ``policy.bundle`` (not reloaded: a serving
    sidecar builds its PolicySource with :func:`load_bundle_policy`).
    opa: both policies asked of the OPA server at ``policy.opa_url``, which holds the
    policy and its data; an OPA that does not answer at start-up is logged and
    the sidecar starts anyway, failing closed until it does.
    """
    if settings.policy.bundle is not None:
        # Outside a serving sidecar (explain): the bundle's current revision, not polled.
        bundle = load_bundle_policy(settings, GateMetrics())
        return bundle.policy, bundle.policy.request_policy, bundle_display(settings)
    if settings.policy.engine is PolicyEngineName.REGORUS:
        data = load_policy_data(settings)
        try:
            policy = RegorusEngine.from_directory(settings.policy.dir, data=data)
            request_policy = RequestPolicy.from_directory(settings.policy.dir, data=data)
        except PolicyError as exc:
            raise ConfigError(f"policy.dir {settings.policy.dir}: {rego_error_line(exc)}") from exc
        return policy, request_policy, str(settings.policy.dir)
    assert settings.policy.opa_url is not None  # load_settings
    try:
        token = None
        if settings.policy.opa_token_file is not None:
            token = read_token_file(settings.policy.opa_token_file)
        server = OpaServer(
            settings.policy.opa_url,
            token=token,
            timeout_seconds=settings.policy.opa_timeout_ms / 1000,
            ca_file=settings.policy.opa_ca_file,
        )
    except ValueError as exc:
        raise ConfigError(f"policy_engine 'opa': {exc}") from exc
    engine = OpaEngine(server)
    try:
        engine.probe()
    except PolicyError as exc:
        log.warning(
            "OPA does not serve the chunk policy yet (%s): failing closed until it does", exc
        )
    return engine, OpaRequestPolicy(server), server.display_url


def rego_error_line(error: PolicyError) -> str:
    """A Rego compile error in one line: ``file:line:col: message``.

    regorus draws the source line and a caret under it over several lines;
    a start-up error is one line (``retrieval-gate policy test`` shows the
    drawing).
    """
    text = str(error)
    where = re.search(r"-->\s*(\S+)", text)
    what = re.search(r"^error:\s*(.+)$", text, re.MULTILINE)
    if where is None or what is None:
        return one_line(text)
    return f"{where[1]}: {what[1].strip()}"


def serve_metrics(address: str, registry: CollectorRegistry) -> Any:
    """Start the /metrics HTTP server on ``address``; ListenError when it cannot listen."""
    host, port = parse_host_port(address)
    try:
        server, _ = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise ListenError(
            f"telemetry.metrics {address}: {exc.strerror or exc}; choose another "
            "host:port (--metrics) or stop what listens there"
        ) from None
    return server


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces (libpq's
    messages span lines)."""
    return " ".join(text.split())


def open_store_at_start(store: StoreSettings) -> MetadataStore:
    """The metadata store ``store`` names, or a PendingStore when it cannot be reached now.

    A misconfiguration (a malformed URL, a refused login, an unknown database,
    a schema at another version) raises, so the process exits 2 at once. An
    outage (connection refused or timed out, a name that does not resolve yet:
    e.g. a mesh proxy that is not running yet) does not end the process: the
    sidecar serves NOT_SERVING, refuses every request, and the server keeps
    trying (:meth:`SidecarServer.start`).
    """
    try:
        return open_metadata_store(store)
    except StoreUnavailable as exc:
        if not is_outage(exc):
            raise ConfigError(one_line(str(exc))) from None
        log.warning(
            "metadata store unreachable at start (%s); NOT_SERVING and refusing every request "
            "until it is reached",
            one_line(str(exc)),
        )
        return PendingStore(store.url, one_line(str(exc)))


@dataclass
class Sidecar:
    """The assembled parts of one sidecar process."""

    settings: Settings
    metrics: GateMetrics
    store: CachedStore
    audit: AuditSink
    request_path: RequestPath
    response_filter: ResponseFilter
    # Live invalidation: PostgreSQL's LISTEN, the SQLite change poll (store.watch).
    listener: ChangeWatcher | None
    tracing: TracerProvider | None = None  # this process's spans (OTEL_* variables); None: off
    # The Gate service's admission (its own route); None: not served (no listen.gate).
    gate_admission: RequestAdmission | None = None
    policy_source: PolicySource | None = None  # polls policy.bundle; None: no bundle
    # The metadata store when it could not be reached at start: the server
    # opens it in the background (SidecarServer); None: opened.
    pending_store: PendingStore | None = None
    # Gate/VerifyAnswer's checks; None without an audit log to verify against.
    answer_verifier: AnswerVerifier | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> Sidecar:
        tracing = start_tracing()
        tracer = None if tracing is None else gate_tracer(tracing)
        metrics = GateMetrics(collections=settings.telemetry.metric_collections)
        inner = open_store_at_start(settings.store)
        store = CachedStore(
            inner,
            ttl=settings.cache.ttl_seconds,
            maxsize=settings.cache.size,
            negative_ttl=settings.cache.negative_ttl_seconds,
            negative_maxsize=settings.cache.negative_size,
            stale_if_error_seconds=settings.cache.stale_if_error_seconds,
            observer=metrics if tracer is None else TracedCacheObserver(metrics),
        )
        bundle: PolicySource | None = None
        policy: PolicyEngine
        request_policy: RequestPolicyEngine
        if settings.policy.bundle is not None:
            bundle = load_bundle_policy(settings, metrics)
            policy, request_policy = bundle.policy, bundle.policy.request_policy
            policy_source = bundle_display(settings)
        else:
            policy, request_policy, policy_source = build_policies(settings)
            # Without a bundle the policy's version (its sources' digest, or the
            # OPA rule) is its revision: the dashboard shows what decides.
            metrics.policy_activated(policy.version, None)
            metrics.preset_bundle_refusals(REFUSAL_REASONS)
        core = DecisionCore(
            policy,
            ReasonOrder(settings.policy.custom_reasons),
            verdict_cache_size=settings.cache.verdict_size,
        )
        formats = format_table(settings)
        metrics.preset(fmt.name for fmt in formats.formats)
        sink = build_audit(settings, metrics)
        audit, verifier = answer_verification(settings, sink, store, metrics)
        policies = RoutePolicies(settings.route_policy)
        response_filter = ResponseFilter(
            formats=formats,
            store=store,
            core=core,
            audit=audit,
            metrics=metrics,
            policies=policies,
            max_hits=settings.filter.max_hits,
            tracer=tracer,
            log_decisions=settings.audit.log_decisions,
        )
        log.info("policy %s loaded from %s", policy.version, policy_source)
        records = None if isinstance(inner, PendingStore) else record_count(settings)
        summary = startup_summary(
            settings,
            records=records,
            policy_version=policy.version,
            policy_source=policy_source,
            formats=[fmt.name for fmt in formats.formats],
        )
        log.info("%s", summary)
        identity = build_identity(settings)
        admission = RequestAdmission(
            identity,
            request_policy,
            route_kind=formats.route_kind,
            collections=formats.collections,
            id_names=formats.id_names,
            answers=(
                RequestAnswers(settings.cache.request_size) if settings.cache.request_size else None
            ),
            count_refusal=metrics.count_request_refusal,
        )
        request_path = RequestPath(
            admission, formats, policies, metrics, overfetch_cap=settings.filter.overfetch_cap
        )
        listener = (
            ChangeListener(settings.store.listen_url or settings.store.url, store)
            if isinstance(inner, PendingStore)
            else change_watcher(inner, store)
        )
        return cls(
            settings,
            metrics,
            store,
            audit,
            request_path,
            response_filter,
            listener,
            tracing,
            None
            if settings.listen.gate is None
            else gate_admission(identity, request_policy, metrics.count_request_refusal),
            bundle,
            inner if isinstance(inner, PendingStore) else None,
            verifier,
        )

    async def aclose(self) -> None:
        """Stop polling and listening, ship or close the audit trail, close the store,
        export the last spans."""
        if self.policy_source is not None:
            await self.policy_source.stop()
        if self.listener is not None:
            await self.listener.stop()
        if self.answer_verifier is not None:
            await self.answer_verifier.aclose()
        self.audit.close()
        await self.store.aclose()
        if self.tracing is not None:
            # Blocks while the exporter sends what is queued (the SDK gives it 30 s at most).
            await asyncio.to_thread(self.tracing.shutdown)


class SidecarServer:
    """The gRPC servers and the /metrics endpoint.

    Envoy's (``listen.grpc``: ext_proc, ext_authz, health) and, with
    ``listen.gate``, the Gate service's (Gate, health) are two servers, so
    that neither listener serves the other's services: an application that
    may call Gate/Filter is not Envoy, whose streams name their caller.
    """

    def __init__(self, sidecar: Sidecar) -> None:
        self.sidecar = sidecar
        listen = sidecar.settings.listen
        limit = listen.grpc_max_message_bytes
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            # A second sidecar on the same port must fail, not silently share
            # Envoy's streams (workers listen on port + i).
            ("grpc.so_reuseport", 0),
        ]
        # Read now: a missing or malformed file is a ConfigError before anything listens.
        self._credentials = server_credentials(listen)
        self._grpc = grpc.aio.server(
            options=options,
            interceptors=[]
            if listen.grpc_client_id is None
            else [PinnedPeer(listen.grpc_client_id)],
        )
        # False until the metadata store is open (at once, unless it was
        # unreachable at start): every stream is refused meanwhile.
        self._store_ready = sidecar.pending_store is None
        self._opening: asyncio.Task[None] | None = None
        ext_proc_pb2_grpc.add_ExternalProcessorServicer_to_server(
            ExternalProcessorServicer(
                sidecar.request_path,
                sidecar.response_filter,
                max_body_bytes=sidecar.settings.listen.max_body_bytes,
                ready=self.store_ready,
            ),
            self._grpc,
        )
        ext_authz_pb2_grpc.add_AuthorizationServicer_to_server(
            AuthorizationServicer(sidecar.request_path.admission, ready=self.store_ready),
            self._grpc,
        )
        # The standard gRPC health service, for Kubernetes' grpc probes and
        # Envoy's health checks: SERVING once the gate is ready, NOT_SERVING
        # from the moment it starts to stop.
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        self._gate: grpc.aio.Server | None = None
        if sidecar.gate_admission is not None:
            self._gate = grpc.aio.server(options=options)
            gate_pb2_grpc.add_GateServicer_to_server(
                GateServicer(
                    sidecar.response_filter, sidecar.gate_admission, sidecar.answer_verifier
                ),
                self._gate,
            )
            health_pb2_grpc.add_HealthServicer_to_server(self._health, self._gate)
        self._metrics_server: Any = None
        sidecar.metrics.serving.set(0)

    def store_ready(self) -> bool:
        """True once the metadata store is open."""
        return self._store_ready

    async def start(self) -> None:
        """Listen, and report SERVING once the metadata store is open.

        A store that was unreachable at start is opened in the background
        (:meth:`failure` raises if it turns out to be misconfigured); until
        then the health service reports NOT_SERVING and every stream is refused.
        """
        settings = self.sidecar.settings
        if self._store_ready:
            await self._start_listener()
        address = settings.listen.grpc
        add_listener(self._grpc, address, self._credentials)
        if self._gate is not None:
            assert settings.listen.gate is not None  # Sidecar.from_settings
            add_listener(self._gate, settings.listen.gate)
        await self._grpc.start()
        if self._gate is not None:
            await self._gate.start()
        if self.sidecar.policy_source is not None:
            self.sidecar.policy_source.start()
        log.info(
            "gRPC (ext_authz, ext_proc, health) listening on %s%s",
            address,
            " (mTLS)" if self._credentials is not None else "",
        )
        if self._gate is not None:
            log.info("gRPC (Gate, health) listening on %s", settings.listen.gate)
        pending = self.sidecar.pending_store
        if pending is None:
            await self._serving()
        else:
            await self._health.set(
                health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.NOT_SERVING
            )
            self._opening = asyncio.create_task(
                self._open_store(pending), name="retrieval-gate-store-opening"
            )
        if settings.telemetry.metrics:
            self._metrics_server = serve_metrics(
                settings.telemetry.metrics, self.sidecar.metrics.registry
            )
            log.info("metrics on http://%s/metrics", settings.telemetry.metrics)

    async def _start_listener(self) -> None:
        listener = self.sidecar.listener
        if listener is not None:
            await listener.start()
            # Serving before the first LISTEN would miss revocations meanwhile;
            # the cache starts empty, so a late start only costs store lookups.
            if not await listener.wait_listening(5.0):
                log.warning(
                    "metadata store changes not seen yet (LISTEN not connected, or the SQLite "
                    "change poll failed); caching no metadata until they are"
                )

    async def _serving(self) -> None:
        await self._health.set(health.OVERALL_HEALTH, health_pb2.HealthCheckResponse.SERVING)
        self.sidecar.metrics.serving.set(1)

    async def _open_store(self, pending: PendingStore) -> None:
        """Open the store at ``pending.url`` with exponential backoff, then serve.

        Logs when the reason changes, not at every attempt. A misconfiguration
        found meanwhile (e.g. the network came up and the login is refused)
        raises ConfigError: the process ends as it would have at start.
        """
        started = time.monotonic()
        delay = STORE_RETRY_FIRST_SECONDS
        reason = pending.reason
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, STORE_RETRY_MAX_SECONDS)
            try:
                store = await asyncio.to_thread(open_metadata_store, self.sidecar.settings.store)
            except StoreUnavailable as exc:
                if not is_outage(exc):
                    raise ConfigError(one_line(str(exc))) from None
                if one_line(str(exc)) != reason:
                    reason = one_line(str(exc))
                    log.warning("metadata store still unreachable: %s", reason)
                continue
            break
        pending.attach(store)
        log.info("metadata store reached after %.1f s; serving", time.monotonic() - started)
        await self._start_listener()
        self._store_ready = True
        await self._serving()

    async def failure(self) -> int:
        """Wait for as long as the server runs; raise ConfigError if the metadata store,
        unreachable at start, turns out to be misconfigured when it is reached."""
        if self._opening is not None:
            await self._opening
        await asyncio.Future()  # until cancelled
        return 0

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """NOT_SERVING, no new streams; those in flight get ``grace`` seconds to finish."""
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        self.sidecar.metrics.serving.set(0)
        await self._health.enter_graceful_shutdown()
        servers = [self._grpc] if self._gate is None else [self._grpc, self._gate]
        await asyncio.gather(*(server.stop(grace) for server in servers))
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        await self.sidecar.aclose()


async def serve_until_signalled(settings: Settings) -> int:
    """Run one sidecar process until SIGINT or SIGTERM, then stop it gracefully; 0."""
    with StopSignals() as signals:
        server = SidecarServer(Sidecar.from_settings(settings))
        try:
            await server.start()
            return await signals.wait({"the metadata store": server.failure()})
        finally:
            await server.stop()
