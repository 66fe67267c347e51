"""The groups of settings: one frozen dataclass per TOML table.

Each field is declared with :func:`~sidecar.config._schema.setting`; its key
in the table is the field's name, its flag the name it had before the groups
(``name=``) with dashes. A group checks its values against these declarations
when it is made (:class:`~sidecar.config._schema.Group`); checks that relate
two settings are in ``sidecar.config.checks``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar.config._schema import Group, setting
from sidecar.core.modes import Mode
from sidecar.identity.claims import DEFAULT_PRINCIPAL_CLAIMS
from sidecar.identity.credentials import LOCATIONS, check_locations
from sidecar.identity.spiffe import WorkloadMap
from sidecar.metrics import check_metric_collections
from sidecar.rego.policy_data import BUNDLED_POLICY_DIR


class IdentityMode(StrEnum):
    JWT = "jwt"  # the sidecar verifies the bearer token
    ENVOY_JWT = "envoy-jwt"  # Envoy's jwt_authn verifies it; the sidecar reads the payload
    TRUSTED_HEADERS = "trusted-headers"  # development only: x-gate-tenant / x-gate-principals
    MESH_MTLS = "mesh-mtls"  # the peer's verified SPIFFE id, mapped by the workloads table


class PolicyEngineName(StrEnum):
    REGORUS = "regorus"  # the Rego files of policy.dir, in process
    OPA = "opa"  # an OPA server's REST Data API at policy.opa_url


class BundleKeyAlgorithm(StrEnum):
    """The JWT algorithms a bundle signature may use: asymmetric only, as OPA names them."""

    RS256 = "RS256"
    RS384 = "RS384"
    RS512 = "RS512"
    PS256 = "PS256"
    PS384 = "PS384"
    PS512 = "PS512"
    ES256 = "ES256"
    ES384 = "ES384"
    ES512 = "ES512"
    EDDSA = "EdDSA"


class EventLoopName(StrEnum):
    AUTO = "auto"  # uvloop where it is installed, else asyncio's own
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


def default_policy_dir() -> Path:
    """The bundled policies: ``sidecar/policies``, a link to the checkout's ``policies/``
    that wheels carry as a copy."""
    return BUNDLED_POLICY_DIR


def non_empty_field(value: str) -> str:
    """``value`` if it can name a field; raises ValueError."""
    if not value:
        raise ValueError("must be a non-empty field name")
    return value


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def _principal_claims(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise TypeError("must be a table of claim = principal prefix")
    return dict(value)


def _workloads(value: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise TypeError("must be a table of SPIFFE id = {tenant, principals, drafts}")
    WorkloadMap.parse(value)
    return {str(k): dict(v) for k, v in value.items()}


_MTLS = "(proxy: Envoy terminates mTLS on its listener with all three)"
_CHANNEL = "(serve; all four or none)"


@dataclass(frozen=True)
class ListenSettings(Group, group="listen"):
    """Where and how the sidecar serves Envoy."""

    grpc: str = setting(
        "unix:/run/retrieval-gate/envoy.sock",
        name="grpc_listen",
        help="where Envoy reaches the sidecar (ext_proc, ext_authz): unix:/path (the socket "
        "is made mode 0660, for the sidecar's user and group), or host:port with "
        "listen.grpc_client_ca_file or listen.expose_grpc (proxy: a private unix socket "
        "unless this flag is given)",
    )
    expose_grpc: bool = setting(
        False,
        name="expose_grpc_listen",
        help="allow a TCP listen.grpc without mTLS: whoever reaches it (on loopback, any "
        "process of this host) is believed as Envoy (the caller it names, the bodies it "
        "sends), so only where nothing but Envoy can connect",
    )
    # mTLS on a TCP listen.grpc: Envoy's client certificate must chain to the CA
    # and name grpc_client_id; checked on every call (runtime/channel.py).
    grpc_cert_file: Path | None = setting(
        None, help=f"the sidecar's certificate chain, PEM, for mTLS on listen.grpc {_CHANNEL}"
    )
    grpc_key_file: Path | None = setting(
        None, help=f"the sidecar's private key, PEM, for mTLS on listen.grpc {_CHANNEL}"
    )
    grpc_client_ca_file: Path | None = setting(
        None, help=f"CA bundle, PEM, that Envoy's client certificate must chain to {_CHANNEL}"
    )
    grpc_client_id: str | None = setting(
        None,
        check=_non_empty,
        help="the one identity Envoy's client certificate must name in a SAN (a SPIFFE id "
        f"or a DNS name); any other is refused on every call {_CHANNEL}",
    )
    gate: str | None = setting(
        None,
        name="gate_listen",
        help="where the sidecar serves retrieval_gate.v1.Gate/Filter to applications, "
        "host:port or unix:/path, never on listen.grpc; none: not served",
    )
    # With N > 1 each worker listens on its own address
    # (sidecar.runtime.workers.worker_addresses) and Envoy balances across them.
    workers: int = setting(1, minimum=1, help="sidecar processes, e.g. one per core")
    event_loop: EventLoopName = setting(
        EventLoopName.AUTO,
        help="the event loop each sidecar process serves on: auto (uvloop where installed), "
        "uvloop or asyncio",
    )
    # Envoy's buffer limit and the gRPC message limits are derived from it.
    max_body_bytes: int = setting(
        4 * 1024 * 1024,
        minimum=1,
        help="largest response body inspected; a larger one is an error",
    )
    message_timeout_ms: int = setting(
        2000, minimum=1, help="Envoy's wait per message for the sidecar"
    )
    tls_cert_file: Path | None = setting(
        None, help=f"proxy: the listener's certificate chain, PEM {_MTLS}"
    )
    tls_key_file: Path | None = setting(
        None, help=f"proxy: the listener's private key, PEM {_MTLS}"
    )
    tls_client_ca_file: Path | None = setting(
        None, help=f"proxy: CA bundle, PEM, that client certificates must chain to {_MTLS}"
    )
    # Envoy's overload manager and caps in the bootstrap `proxy` generates
    # (sidecar/runtime/bootstrap.py); a hand-written Envoy config sets its own.
    max_connections: int = setting(
        4096,
        minimum=1,
        help="proxy: the most client connections Envoy holds open at once (its overload "
        "manager's global_downstream_max_connections); more are closed at accept",
    )
    max_heap_bytes: int = setting(
        384 * 1024 * 1024,
        minimum=16 * 1024 * 1024,
        help="proxy: Envoy's heap budget: at 90% it returns free memory to the system, at "
        "95% it answers new requests 503 until usage falls (size below the memory limit)",
    )
    max_concurrent_streams: int = setting(
        100,
        minimum=1,
        help="proxy: the most HTTP/2 streams (gRPC calls) one client connection may have open",
    )

    @property
    def grpc_mtls(self) -> bool:
        """True when Envoy must present a client certificate on listen.grpc (all four
        grpc_* TLS settings are given: sidecar.config.checks)."""
        return self.grpc_client_ca_file is not None

    @property
    def grpc_max_message_bytes(self) -> int:
        """Body limit plus room for headers and metadata in the same message."""
        return self.max_body_bytes + 256 * 1024


_KEYS = "(identity jwt, envoy-jwt)"


@dataclass(frozen=True)
class IdentitySettings(Group, group="identity"):
    """Who the caller is: the identity mode and what it verifies with."""

    mode: IdentityMode | None = setting(
        None,
        name="identity",
        help="who the caller is: jwt (the sidecar verifies the token), envoy-jwt "
        "(Envoy verifies it), mesh-mtls (the client certificate's SPIFFE id), "
        "trusted-headers (development only); required",
        default_text="required",
    )
    jwks: str | None = setting(None, help=f"JWKS file or http(s) URL {_KEYS}")
    jwt_public_key: Path | None = setting(None, help=f"PEM public key file {_KEYS}")
    jwt_hmac_secret_file: Path | None = setting(
        None, help=f"HMAC secret file, 32 bytes or more {_KEYS}"
    )
    issuer: str | None = setting(None, help=f"required token issuer (iss) {_KEYS}")
    audience: str | None = setting(None, help=f"required token audience (aud) {_KEYS}")
    jwks_relay: str = setting(
        "127.0.0.1:9902",
        help="where the sidecar serves a JWKS URL's keys, as it accepts them, to Envoy "
        "(envoy-jwt): loopback ip:port or unix:/path (proxy: a private unix socket)",
    )
    jwt_credentials: tuple[str, ...] = setting(
        LOCATIONS,
        check=check_locations,
        help="where the JWT may travel (identity jwt), comma-separated: bearer "
        "(authorization: Bearer), base64 (authorization: base64 of the token, "
        "pymilvus), api-key (qdrant-client, pinecone)",
    )
    jwt_leeway_seconds: float = setting(
        30.0, minimum=0, help="clock skew allowed on exp, nbf and iat"
    )
    # Istio's RequestAuthentication writes the payload under its own key.
    jwt_payload_key: str = setting(
        "jwt_payload",
        check=_non_empty,
        help="key of the verified payload in Envoy jwt_authn's metadata (envoy-jwt); "
        "Istio 1.21+ RequestAuthentication: payload",
    )
    tenant_claim: str = setting("tenant", help="claim holding the tenant")
    principal_claims: dict[str, str] = setting(
        default_factory=lambda: dict(DEFAULT_PRINCIPAL_CLAIMS),
        check=_principal_claims,
        help="claim -> principal prefix",
        file_only="a table of claim = principal prefix",
    )
    drafts_scope: str | None = setting(None, help="token scope that allows reading draft chunks")
    workloads: dict[str, dict[str, Any]] = setting(
        default_factory=dict,
        check=_workloads,
        help="SPIFFE id or pattern -> tenant, principals, drafts (identity mesh-mtls)",
        file_only="a table of SPIFFE id = {tenant, principals, drafts}",
    )


@dataclass(frozen=True)
class PolicySettings(Group, group="policy"):
    """Which Rego policies decide, and who evaluates them."""

    # With opa, dir and data are not read: the policy and its data are OPA's
    # (sidecar/rego/opa_engine.py).
    engine: PolicyEngineName = setting(
        PolicyEngineName.REGORUS,
        name="policy_engine",
        help="who evaluates the Rego policies: regorus (policy.dir, in process) or "
        "opa (the OPA server at policy.opa_url)",
    )
    dir: Path = setting(
        default_factory=default_policy_dir,
        name="policy_dir",
        help="directory of Rego policies (default: the bundled ones)",
        default_text="bundled policies/",
    )
    data: Path | None = setting(
        None, name="policy_data", help="JSON file loaded as Rego data (e.g. collection owners)"
    )
    # With a bundle, dir is not read: the bundle holds the policy and its data
    # (sidecar/rego/bundle.py), reloaded while serving (sidecar/runtime/policy_source.py).
    bundle: str | None = setting(
        None,
        name="policy_bundle",
        check=_non_empty,
        help="OPA-format policy bundle (.tar.gz), a file or an http(s) URL, polled and "
        "hot-reloaded in place of policy.dir (policy.engine regorus)",
    )
    bundle_public_key: Path | None = setting(
        None,
        name="policy_bundle_public_key",
        help="PEM public key the bundle's .signatures.json must verify with; unsigned "
        "or tampered bundles are refused (default: signatures not checked)",
    )
    # OPA's verification config with this one key (sidecar/rego/bundle_signature.py).
    bundle_key_algorithm: BundleKeyAlgorithm = setting(
        BundleKeyAlgorithm.RS256,
        name="policy_bundle_key_algorithm",
        help="the one JWT algorithm the bundle signature may use, as OPA's key `algorithm`",
    )
    bundle_key_id: str = setting(
        "default",
        name="policy_bundle_key_id",
        check=_non_empty,
        help="the key's id: a signature naming another key id (JWT kid, or the keyid claim) "
        "is refused",
    )
    bundle_scope: str = setting(
        "",
        name="policy_bundle_scope",
        default_text="none",
        help="the scope the signature's payload must carry, as OPA's `scope` (default: none)",
    )
    # A zero interval would poll without pause.
    bundle_poll_seconds: float = setting(
        10.0,
        name="policy_bundle_poll_seconds",
        above=0,
        help="how often the policy bundle is checked for a new revision",
    )
    opa_url: str | None = setting(
        None, help="OPA's base URL, http(s)://host:port (required with policy.engine opa)"
    )
    opa_token_file: Path | None = setting(
        None, help="file holding the bearer token sent to OPA (default: none)"
    )
    opa_timeout_ms: int = setting(
        500,
        minimum=1,
        help="longest wait for each connect and each read of an OPA call; a connection "
        "error is retried once (must be below listen.message_timeout_ms)",
    )
    opa_ca_file: Path | None = setting(
        None,
        help="CA bundle (PEM) an https OPA's certificate must chain to (default: system)",
        default_text="system CAs",
    )
    custom_reasons: tuple[str, ...] = setting(
        (), help="reason codes your policy may emit as metric labels, comma-separated"
    )
    allow_plain_http: bool = setting(
        False,
        help="fetch the JWKS, the policy bundle or OPA's decisions over plain http:// from a "
        "host other than this one: whoever is on the path can swap keys, policy or answers",
    )


@dataclass(frozen=True)
class StoreSettings(Group, group="store"):
    """The metadata store the chunks' records are looked up in."""

    url: str = setting(
        "sqlite:///retrieval-gate.db",
        name="store",
        help="metadata store URL: sqlite:///relative.db, sqlite:////absolute.db, "
        "postgresql://user@host/db",
    )
    # Per sidecar process: with listen.workers = N a replica holds N pools
    # (docs/postgresql.md, "Connection budget").
    pool_min: int = setting(
        1,
        name="store_pool_min",
        minimum=0,
        help="PostgreSQL: connections each sidecar process keeps open for lookups",
    )
    pool_max: int = setting(
        4,
        name="store_pool_max",
        minimum=1,
        help="PostgreSQL: the most connections each sidecar process opens for lookups",
    )
    pgbouncer: bool = setting(
        False,
        name="store_pgbouncer",
        help="PostgreSQL: store.url goes through PgBouncer in transaction pooling mode "
        "(no prepared statements; LISTEN then needs store.listen_url)",
    )
    listen_url: str | None = setting(
        None,
        name="store_listen_url",
        check=_non_empty,
        help="PostgreSQL: where the change listener holds its LISTEN session, a direct "
        "connection to the server (default: store.url)",
        default_text="store.url",
    )


@dataclass(frozen=True)
class CacheSettings(Group, group="cache"):
    """What the sidecar remembers: store records and policy answers."""

    # A zero TTL would make the cache unusable, not off: a fresh entry must live a while.
    ttl_seconds: float = setting(
        30.0, name="cache_ttl_seconds", above=0, help="how long a looked-up record is trusted"
    )
    size: int = setting(100_000, name="cache_size", minimum=1, help="records held in the cache")
    # As long as a found record by default: an absence forgotten sooner would make
    # the time of a lookup tell an existing record from a missing one.
    negative_ttl_seconds: float = setting(
        30.0,
        name="negative_cache_ttl_seconds",
        above=0,
        help='how long "no such record" is remembered',
    )
    negative_size: int = setting(
        100_000, name="negative_cache_size", minimum=1, help='"no such record" answers held'
    )
    # 0 fails closed: METADATA_UNAVAILABLE.
    stale_if_error_seconds: float = setting(
        0.0,
        minimum=0,
        help="serve expired records this long while the store fails (0: fail closed)",
    )
    verdict_size: int = setting(
        20_000,
        name="verdict_cache_size",
        minimum=0,
        help="policy verdicts remembered per (caller, record) for a time-pure policy (0: off)",
    )
    request_size: int = setting(
        10_000,
        name="request_cache_size",
        minimum=0,
        help="request-policy answers remembered per (caller, method, path, collections) "
        "for a time-pure request policy (0: off)",
    )


@dataclass(frozen=True)
class AuditSettings(Group, group="audit"):
    """Where decision records go."""

    log: Path | None = setting(
        None,
        name="audit_log",
        help="append hash-chained decision records to this JSON Lines file "
        "(with audit.store: the local spool)",
        default_text="off (warning at start)",
    )
    store: str | None = setting(
        None,
        name="audit_store",
        help="PostgreSQL URL: ship the audit log to its audit_records table",
    )
    chain_id: str | None = setting(
        None,
        name="audit_chain_id",
        help="this sidecar's chain in a shared audit table (default: hostname + spool path digest)",
        default_text="hostname + spool digest",
    )
    # The log rotates into sealed segments (sidecar.audit.segments) so that
    # shipped or expired records can be deleted a segment at a time.
    segment_bytes: int = setting(
        16 * 1024 * 1024,
        minimum=4096,
        help="rotate the audit log into a sealed segment before it grows past this size",
    )
    segment_seconds: float = setting(
        3600.0,
        minimum=1,
        help="rotate the audit log at its first write this long after its segment started",
    )
    max_spool_bytes: int = setting(
        0,
        minimum=0,
        help="bound on all segments together, at least 2 x audit.segment_bytes (0: none); "
        "without audit.store the oldest segments are deleted to stay under it, with "
        "audit.store records are refused (audit_unavailable) while unshipped records fill it",
    )
    retention_seconds: float = setting(
        0.0,
        minimum=0,
        help="without audit.store: delete sealed segments whose last record is older "
        "(0: keep them)",
    )
    # A line for people and log pipelines beside the record for auditors; it
    # carries codes and counts only, so it may go wherever logs go.
    log_decisions: bool = setting(
        False,
        help="log one INFO line per decision (logger sidecar.decisions): decision id, route, "
        "format, outcome, codes, counts and latency, never a text",
    )
    # Signed checkpoints (sidecar.audit.checkpoints): the chain proves order,
    # a signature by a key its writers do not hold proves origin.
    checkpoint_key_file: Path | None = setting(
        None,
        help="Ed25519 private key (PEM file) that signs checkpoints of the audit chain's head "
        "into <audit.log>.checkpoints.jsonl",
        default_text="off (the chain is unsigned)",
    )
    checkpoint_key_id: str | None = setting(
        None,
        check=_non_empty,
        help="the key id every checkpoint names, for verifiers holding several keys "
        "(default: ed25519: and the public key's fingerprint)",
        default_text="key fingerprint",
    )
    checkpoint_every_records: int = setting(
        1000, minimum=1, help="sign a checkpoint once this many records are unsigned"
    )
    checkpoint_every_seconds: float = setting(
        60.0,
        minimum=1,
        help="sign a checkpoint this long after the first unsigned record was written",
    )


@dataclass(frozen=True)
class TelemetrySettings(Group, group="telemetry"):
    """Metrics (spans are configured by the standard OTEL_* environment variables)."""

    metrics: str | None = setting(
        None, help="host:port to serve /metrics on (default: off)", default_text="off"
    )
    metric_collections: tuple[str, ...] = setting(
        (),
        check=check_metric_collections,
        help="collections counted under their own name in the metrics' collection label "
        "(any other: other; Chroma's by name or id), comma-separated",
    )


@dataclass(frozen=True)
class FilterSettings(Group, group="filter"):
    """How responses are filtered, and how searches are pushed down; per route in ``routes``."""

    mode: Mode = setting(
        Mode.ENFORCE,
        help="enforce: remove rejected chunks; strict: refuse a response with any; "
        "audit: pass it unchanged, recorded as if enforced",
    )
    text_field: str = setting("text", help="field holding the chunk text")
    id_field: str | None = setting(
        None,
        help="field holding the chunk id (default: the database's hit id)",
        default_text="the database's hit id",
    )
    tenant_key: str = setting(
        "tenant",
        check=non_empty_field,
        help="field of the indexed chunks holding the tenant, for tenant push-down "
        "(routes without it: push_down = false)",
    )
    overfetch_factor: float = setting(
        2.0, minimum=1, help="ask the database for this many times k (1: off)"
    )
    overfetch_cap: int = setting(
        1000, minimum=1, help="the most hits an over-fetched search asks for"
    )
    max_hits: int = setting(
        10_000,
        minimum=1,
        help="the most hits one response may carry; a larger one is refused (502)",
    )
    substitute_superseded: bool = setting(
        False,
        help="replace a superseded chunk in place by its successor when the successor "
        "passes every check",
    )


def _header_name(value: str) -> str:
    """``value``, lowercased, if it can name the header the database reads; raises ValueError."""
    name = value.strip().lower()
    if not re.fullmatch(r"[a-z0-9!#$%&'*+.^_`|~-]+", name):
        raise ValueError(f"{value!r} is not an HTTP header name")
    if name in _NOT_CREDENTIAL_HEADERS or name.startswith(("x-envoy-", "x-gate-")):
        raise ValueError(f"{value!r} cannot carry the database's credential")
    return name


# Headers that route, frame or belong to Envoy or the gate: never the credential's.
_NOT_CREDENTIAL_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "upgrade",
        "trailer",
    }
)


def _header_prefix(value: str) -> str:
    if not all(" " <= c <= "~" for c in value):
        raise ValueError("must be printable ASCII (a scheme such as 'Bearer ' or 'ApiKey ')")
    return value


@dataclass(frozen=True)
class UpstreamSettings(Group, group="upstream"):
    """The credential `proxy`'s Envoy adds to every request it forwards to the database."""

    # Read by Envoy (credential_injector, a generic secret from the file), never
    # by the sidecar beyond the check at start that it is there and not empty:
    # the value is in no log, metric, error or generated file.
    credential_file: Path | None = setting(
        None,
        name="upstream_credential_file",
        help="proxy: file holding the database's credential (a mounted secret); Envoy adds "
        "it to every request it forwards, in place of any the client sent",
    )
    credential_header: str | None = setting(
        None,
        name="upstream_credential_header",
        check=_header_name,
        help="proxy: the header the database reads its credential from: api-key (Qdrant, "
        "Pinecone), authorization (Elasticsearch, Weaviate, Milvus, Chroma), "
        "x-chroma-token (Chroma); required with upstream.credential_file",
    )
    credential_prefix: str = setting(
        "",
        name="upstream_credential_prefix",
        check=_header_prefix,
        help="proxy: text before the credential in the header, e.g. 'Bearer ' or 'ApiKey '",
        default_text="none",
    )
