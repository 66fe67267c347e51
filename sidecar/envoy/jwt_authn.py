"""Envoy's jwt_authn filter for `--identity envoy-jwt`: Envoy verifies, the sidecar maps claims.

The filter verifies the bearer token (signature, issuer, audience, expiry),
refuses the request itself (401) when the token is missing or invalid, and puts
the verified payload in filter metadata, which the ext_authz filter forwards to
the sidecar (``metadata_context_namespaces``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from sidecar.config import Settings

NAMESPACE = "envoy.filters.http.jwt_authn"
PAYLOAD_KEY = "jwt_payload"
PROVIDER = "retrieval_gate"
JWKS_CLUSTER = "jwks_provider"

_TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"


def _pem_to_jwk(path: Path) -> dict[str, Any]:
    key = load_pem_public_key(path.read_bytes())
    if isinstance(key, rsa.RSAPublicKey):
        return dict(RSAAlgorithm.to_jwk(key, as_dict=True), alg="RS256")
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}[key.curve.name]
        return dict(ECAlgorithm.to_jwk(key, as_dict=True), alg=alg)
    if isinstance(key, ed25519.Ed25519PublicKey):
        return dict(OKPAlgorithm.to_jwk(key, as_dict=True), alg="EdDSA")
    raise ValueError(f"{path}: unsupported public key type")


def _hmac_jwk(path: Path) -> dict[str, Any]:
    secret = path.read_bytes().removesuffix(b"\n")
    k = base64.urlsafe_b64encode(secret).rstrip(b"=").decode()
    return {"kty": "oct", "k": k, "alg": "HS256"}


def jwks_source(settings: Settings) -> dict[str, Any]:
    """The provider's key source: inline JWKS (file, PEM, HMAC secret) or a remote URL."""
    if settings.jwks and settings.jwks.startswith(("http://", "https://")):
        return {
            "remote_jwks": {
                "http_uri": {"uri": settings.jwks, "cluster": JWKS_CLUSTER, "timeout": "2s"},
                "cache_duration": "300s",
            }
        }
    if settings.jwks:
        document = Path(settings.jwks).read_text(encoding="utf-8")
    elif settings.jwt_public_key is not None:
        document = json.dumps({"keys": [_pem_to_jwk(settings.jwt_public_key)]})
    elif settings.jwt_hmac_secret_file is not None:
        document = json.dumps({"keys": [_hmac_jwk(settings.jwt_hmac_secret_file)]})
    else:
        raise ValueError("envoy-jwt needs --jwks, --jwt-public-key or --jwt-hmac-secret-file")
    return {"local_jwks": {"inline_string": document}}


def jwt_authn_filter(settings: Settings) -> dict[str, Any]:
    """The jwt_authn HTTP filter: every route requires a valid token."""
    # No `audiences` here: Envoy answers a wrong audience with 403, so the
    # sidecar checks issuer and audience from the payload and answers 401.
    provider = {
        "issuer": settings.issuer,
        # The caller's token is not the vector DB's business.
        "forward": False,
        "payload_in_metadata": PAYLOAD_KEY,
        "clock_skew_seconds": int(settings.jwt_leeway_seconds),
        **jwks_source(settings),
    }
    return {
        "name": NAMESPACE,
        "typed_config": {
            "@type": _TYPE,
            "providers": {PROVIDER: provider},
            "rules": [{"match": {"prefix": "/"}, "requires": {"provider_name": PROVIDER}}],
        },
    }


def jwks_cluster(settings: Settings) -> dict[str, Any] | None:
    """The cluster Envoy fetches a remote JWKS through, when the JWKS is a URL."""
    if not (settings.jwks and settings.jwks.startswith(("http://", "https://"))):
        return None
    url = urlsplit(settings.jwks)
    tls = url.scheme == "https"
    cluster: dict[str, Any] = {
        "name": JWKS_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": JWKS_CLUSTER,
            "endpoints": [
                {
                    "lb_endpoints": [
                        {
                            "endpoint": {
                                "address": {
                                    "socket_address": {
                                        "address": url.hostname,
                                        "port_value": url.port or (443 if tls else 80),
                                    }
                                }
                            }
                        }
                    ]
                }
            ],
        },
    }
    if tls:
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3."
                "UpstreamTlsContext",
                "sni": url.hostname,
            },
        }
    return cluster
