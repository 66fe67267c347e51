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
