"""Envoy's jwt_authn filter for `--identity envoy-jwt`: Envoy verifies, the sidecar decides.

The filter verifies the bearer token's signature and time claims and puts
either the verified payload or the failure status in filter metadata, which
the ext_proc filter forwards to the sidecar (``metadata_options``).
It never refuses a request itself (``allow_missing_or_failed``): the sidecar
answers every identity failure, with the same 401 and machine-readable reason
in every mode, and without a verified payload nothing is admitted.

Keys reach Envoy by file name, never inline, so secrets do not show up in
Envoy's configuration dump. A PEM key, an HMAC secret or a JWKS file reaches
Envoy as a JWKS the sidecar writes from the keys its own loader accepts
(``sidecar.identity.keys``), so `envoy-jwt` verifies with no key that `jwt`
mode would refuse. A JWKS URL is fetched by Envoy itself: its keys are not
checked (docs/identity.md).
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from sidecar.config import ConfigError, Settings
from sidecar.identity.envoy_jwt import FAILURE_KEY, JWT_AUTHN_NAMESPACE, PAYLOAD_KEY
from sidecar.identity.keys import HmacSecret, JwksFile, PemPublicKey, VerificationKey
from sidecar.runtime.addresses import parse_http_url

PROVIDER = "retrieval_gate"
JWKS_CLUSTER = "jwks_provider"

_TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"


def _is_url(jwks: str | None) -> bool:
    return bool(jwks) and str(jwks).startswith(("http://", "https://"))


def needs_generated_jwks(settings: Settings) -> bool:
    """True when Envoy gets its keys from a JWKS file the sidecar writes (every key but a URL)."""
    return not _is_url(settings.jwks)


def _jwk(key: VerificationKey) -> dict[str, Any]:
    jwk = _public_jwk(key)
    if key.kid is not None:
        jwk["kid"] = key.kid
    if len(key.algorithms) == 1:
        # A key narrowed to one algorithm (an EC curve, EdDSA, a JWK's own alg) stays narrowed.
        jwk["alg"] = key.algorithms[0]
    return jwk


def _public_jwk(key: VerificationKey) -> dict[str, Any]:
    value = key.key
    if isinstance(value, bytes):
        k = base64.urlsafe_b64encode(value).rstrip(b"=").decode()
        return {"kty": "oct", "k": k}
    if isinstance(value, rsa.RSAPublicKey):
        return dict(RSAAlgorithm.to_jwk(value, as_dict=True))
    if isinstance(value, ec.EllipticCurvePublicKey):
        return dict(ECAlgorithm.to_jwk(value, as_dict=True))
    if isinstance(value, ed25519.Ed25519PublicKey):
        return dict(OKPAlgorithm.to_jwk(value, as_dict=True))
    raise ValueError("unsupported key type")


def write_generated_jwks(settings: Settings, path: Path) -> None:
    """Write the configured keys as a JWKS file only its owner can read.

    The keys are loaded with the same checks as the sidecar's own verification
    (RSA >= 2048 bits, HMAC secrets >= 32 bytes; a JWKS file's weak or
    unsupported entries left out with a warning, none usable an error), so
    `envoy-jwt` accepts no weaker key than `jwt`.
    """
    keys: tuple[VerificationKey, ...]
    if settings.jwt_public_key is not None:
        keys = (PemPublicKey(settings.jwt_public_key).key,)
    elif settings.jwt_hmac_secret_file is not None:
        keys = (HmacSecret(settings.jwt_hmac_secret_file).key,)
    elif settings.jwks is not None and not _is_url(settings.jwks):
        keys = JwksFile(settings.jwks).keys
    else:
        raise ValueError("no PEM key, HMAC secret or JWKS file configured")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump({"keys": [_jwk(key) for key in keys]}, handle)


def _jwks_source(settings: Settings, generated_jwks: Path | None) -> dict[str, Any]:
    if _is_url(settings.jwks):
        return {
            "remote_jwks": {
                "http_uri": {"uri": settings.jwks, "cluster": JWKS_CLUSTER, "timeout": "2s"},
                "cache_duration": "300s",
            }
        }
    if generated_jwks is None:
        raise ValueError("a PEM key, HMAC secret or JWKS file needs a generated JWKS for Envoy")
    return {"local_jwks": {"filename": str(generated_jwks)}}


def jwt_authn_filter(settings: Settings, generated_jwks: Path | None = None) -> dict[str, Any]:
    """The jwt_authn HTTP filter: verifies, records the outcome, never refuses on its own."""
    provider = {
        # Issuer and audience are also checked by the sidecar, from the payload.
        "issuer": settings.issuer,
        # The caller's token is not the vector DB's business.
        "forward": False,
        "payload_in_metadata": PAYLOAD_KEY,
        "failed_status_in_metadata": FAILURE_KEY,
        "clock_skew_seconds": int(settings.jwt_leeway_seconds),
        **_jwks_source(settings, generated_jwks),
    }
    verify_or_record = {
        "requires_any": {
            "requirements": [{"provider_name": PROVIDER}, {"allow_missing_or_failed": {}}]
        }
    }
    return {
        "name": JWT_AUTHN_NAMESPACE,
        "typed_config": {
            "@type": _TYPE,
            "providers": {PROVIDER: provider},
            "rules": [{"match": {"prefix": "/"}, "requires": verify_or_record}],
        },
    }


def jwks_cluster(settings: Settings) -> dict[str, Any] | None:
    """The cluster Envoy fetches a remote JWKS through, when the JWKS is a URL."""
    if not _is_url(settings.jwks):
        return None
    try:
        url = parse_http_url(str(settings.jwks))
    except ValueError as exc:
        raise ConfigError(f"setting 'jwks': {exc}") from None
    address = {"address": url.host, "port_value": url.port}
    cluster: dict[str, Any] = {
        "name": JWKS_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": JWKS_CLUSTER,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": {"socket_address": address}}}]}
            ],
        },
    }
    if url.tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                "UpstreamTlsContext",
                "sni": url.host,
            },
        }
    return cluster
