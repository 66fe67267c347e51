"""Checks that relate two or more settings: every one of them is here.

Each check names the settings it reads; it is skipped when one of them was
already refused (its value is then the default, and the problem is reported
once, where it is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sidecar.config._schema import choices
from sidecar.config.groups import IdentityMode, PolicyEngineName
from sidecar.config.settings import Settings, format_table
from sidecar.postgres.dsn import SCHEMES as POSTGRES_SCHEMES

Check = Callable[[Settings], Iterator[str]]
_CHECKS: list[tuple[frozenset[str], Check]] = []


def _reads(*paths: str) -> Callable[[Check], Check]:
    def register(check: Check) -> Check:
        _CHECKS.append((frozenset(paths), check))
        return check

    return register


def cross_field_problems(settings: Settings, refused: set[str]) -> list[str]:
    """The problems between settings, skipping checks that read a refused setting."""
    return [
        problem for paths, check in _CHECKS if not paths & refused for problem in check(settings)
    ]


@_reads("identity.mode")
def _identity_given(settings: Settings) -> Iterator[str]:
    if settings.identity.mode is None:
        yield f"identity.mode is required (--identity): {choices(IdentityMode)}"


@_reads(
    "identity.mode",
    "identity.jwks",
    "identity.jwt_public_key",
    "identity.jwt_hmac_secret_file",
    "identity.issuer",
    "identity.audience",
)
def _jwt_keys(settings: Settings) -> Iterator[str]:
    identity = settings.identity
    if identity.mode not in (IdentityMode.JWT, IdentityMode.ENVOY_JWT):
        return
    keys = [identity.jwks, identity.jwt_public_key, identity.jwt_hmac_secret_file]
    if sum(k is not None for k in keys) != 1:
        yield (
            f"identity.mode {identity.mode.value!r} needs exactly one of identity.jwks, "
            "identity.jwt_public_key, identity.jwt_hmac_secret_file (--jwks, "
            "--jwt-public-key, --jwt-hmac-secret-file)"
        )
    if not identity.issuer or not identity.audience:
        yield (
            f"identity.mode {identity.mode.value!r} needs identity.issuer and "
            "identity.audience (--issuer, --audience)"
        )


@_reads("identity.mode", "identity.workloads")
def _mesh_workloads(settings: Settings) -> Iterator[str]:
    if settings.identity.mode is IdentityMode.MESH_MTLS and not settings.identity.workloads:
        yield (
            "identity.mode 'mesh-mtls' needs an [identity.workloads] table in the settings "
            "file (SPIFFE id = {tenant = ..., principals = [...]})"
        )


@_reads("audit.store", "audit.log")
def _audit_spool(settings: Settings) -> Iterator[str]:
    if settings.audit.store is not None and settings.audit.log is None:
        yield (
            "audit.store needs audit.log (--audit-log): the local spool that every "
            "decision is written to before it is shipped"
        )


@_reads("audit.max_spool_bytes", "audit.segment_bytes")
def _spool_bound(settings: Settings) -> Iterator[str]:
    audit = settings.audit
    if audit.max_spool_bytes and audit.max_spool_bytes < 2 * audit.segment_bytes:
        yield (
            f"audit.max_spool_bytes ({audit.max_spool_bytes}) must be 0 or at least twice "
            f"audit.segment_bytes ({audit.segment_bytes}): the segment being written and "
            "one sealed segment must fit"
        )


@_reads("audit.retention_seconds", "audit.store")
def _retention(settings: Settings) -> Iterator[str]:
    if settings.audit.retention_seconds and settings.audit.store is not None:
        yield (
            "audit.retention_seconds applies without audit.store only: with a store, "
            "segments are deleted once PostgreSQL holds their records"
        )


@_reads("audit.checkpoint_key_file", "audit.checkpoint_key_id", "audit.log")
def _checkpoints(settings: Settings) -> Iterator[str]:
    audit = settings.audit
    if audit.checkpoint_key_file is not None and audit.log is None:
        yield (
            "audit.checkpoint_key_file needs audit.log (--audit-log): checkpoints sign "
            "the chain written there"
        )
    if audit.checkpoint_key_id is not None and audit.checkpoint_key_file is None:
        yield "audit.checkpoint_key_id needs audit.checkpoint_key_file (--checkpoint-key-file)"


def _is_postgres_url(url: str) -> bool:
    return url.partition("://")[0].lower() in POSTGRES_SCHEMES


@_reads("store.url", "store.pool_min", "store.pool_max", "store.pgbouncer", "store.listen_url")
def _store_pool(settings: Settings) -> Iterator[str]:
    store = settings.store
    if store.pool_min > store.pool_max:
        yield "store.pool_min must not be above store.pool_max"
    # With SQLite the PostgreSQL settings are not read.
    if store.listen_url is not None and not _is_postgres_url(store.listen_url):
        yield "store.listen_url must be a postgresql:// URL"
    if store.pgbouncer and _is_postgres_url(store.url) and store.listen_url is None:
        yield (
            "store.pgbouncer needs store.listen_url (--store-listen-url): LISTEN through "
            "transaction pooling never hears a change, so revocations would wait for the "
            "cache TTL; name a direct connection to PostgreSQL (or a session-mode pool)"
        )


@_reads("policy.bundle", "policy.engine", "policy.data")
def _bundle(settings: Settings) -> Iterator[str]:
    policy = settings.policy
    if policy.bundle is None:
        return
    if policy.engine is PolicyEngineName.OPA:
        yield (
            "policy.bundle is not used with policy.engine 'opa': serve the bundle to OPA "
            "(its bundle service) instead"
        )
    if policy.data is not None:
        yield "policy.data is not used with policy.bundle: put data.json in the bundle"


@_reads(
    "policy.bundle",
    "policy.bundle_public_key",
    "policy.bundle_key_algorithm",
    "policy.bundle_key_id",
    "policy.bundle_scope",
)
def _bundle_key(settings: Settings) -> Iterator[str]:
    policy = settings.policy
    if policy.bundle_public_key is not None and policy.bundle is None:
        yield "policy.bundle_public_key needs policy.bundle (--policy-bundle)"
    # A verification detail without a key to verify with would be silently unused.
    unused = [
        name
        for name, value, default in (
            ("bundle_key_algorithm", policy.bundle_key_algorithm, "RS256"),
            ("bundle_key_id", policy.bundle_key_id, "default"),
            ("bundle_scope", policy.bundle_scope, ""),
        )
        if value != default
    ]
    if unused and policy.bundle_public_key is None:
        yield f"policy.{unused[0]} needs policy.bundle_public_key"


@_reads("policy.engine", "policy.data", "policy.opa_url")
def _opa(settings: Settings) -> Iterator[str]:
    # The URL's form is checked where the client is built (sidecar.rego.opa_engine).
    policy = settings.policy
    if policy.engine is not PolicyEngineName.OPA:
        return
    if policy.opa_url is None:
        yield "policy.engine 'opa' needs policy.opa_url (--opa-url)"
    if policy.data is not None:
        yield "policy.data is not used with policy.engine 'opa': load the data into OPA"


@_reads("policy.engine", "policy.opa_timeout_ms", "listen.message_timeout_ms")
def _opa_timeout(settings: Settings) -> Iterator[str]:
    if settings.policy.engine is not PolicyEngineName.OPA:
        return
    if settings.policy.opa_timeout_ms >= settings.listen.message_timeout_ms:
        yield (
            "policy.opa_timeout_ms must be below listen.message_timeout_ms, or Envoy gives "
            "up on the sidecar before the sidecar gives up on OPA"
        )


@_reads("routes", "formats", "filter.text_field", "filter.id_field")
def _formats(settings: Settings) -> Iterator[str]:
    try:
        format_table(settings)
    except ValueError as exc:
        yield f"formats: {exc}"


@_reads("upstream.credential_file", "upstream.credential_header", "upstream.credential_prefix")
def _upstream_credential(settings: Settings) -> Iterator[str]:
    upstream = settings.upstream
    if upstream.credential_file is None:
        if upstream.credential_header is not None or upstream.credential_prefix:
            yield (
                "upstream.credential_header and upstream.credential_prefix need "
                "upstream.credential_file (--upstream-credential-file)"
            )
        return
    if upstream.credential_header is None:
        yield (
            "upstream.credential_file needs upstream.credential_header "
            "(--upstream-credential-header): the header the database reads it from, e.g. "
            "api-key (Qdrant) or authorization with upstream.credential_prefix 'ApiKey ' "
            "(Elasticsearch)"
        )


_CHANNEL_TLS = (
    "listen.grpc_cert_file",
    "listen.grpc_key_file",
    "listen.grpc_client_ca_file",
    "listen.grpc_client_id",
)


@_reads(*_CHANNEL_TLS)
def _channel_tls(settings: Settings) -> Iterator[str]:
    # Half of mTLS is no authentication: a server certificate without a client CA
    # lets any peer in, a CA without a pinned identity lets any certificate of it in.
    listen = settings.listen
    given = [
        path
        for path, value in zip(
            _CHANNEL_TLS,
            (
                listen.grpc_cert_file,
                listen.grpc_key_file,
                listen.grpc_client_ca_file,
                listen.grpc_client_id,
            ),
            strict=True,
        )
        if value is not None
    ]
    if given and len(given) != len(_CHANNEL_TLS):
        missing = [path for path in _CHANNEL_TLS if path not in given]
        flags = ", ".join("--" + path.partition(".")[2].replace("_", "-") for path in missing)
        yield (
            f"{given[0]} needs {', '.join(missing)} ({flags}): mTLS on listen.grpc takes the "
            "sidecar's certificate and key, the CA Envoy's certificate chains to, and the "
            "identity it must name"
        )
