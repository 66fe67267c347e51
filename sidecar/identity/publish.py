"""Verification keys written back as a JWKS document, for Envoy's jwt_authn.

Only keys the loader accepted (``sidecar.identity.keys``) are written, each
rebuilt from the parsed key: its public numbers, its kid and the algorithms
it may verify. Nothing is copied from the source document, so a member the
loader does not read never reaches Envoy.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from sidecar.identity.keys import HMAC_MIN_BYTES, RSA_ALGORITHMS, VerificationKey

# A JWK without `alg` verifies every algorithm of its key type in Envoy.
_EVERY_ALGORITHM = {"RSA": frozenset(RSA_ALGORITHMS), "oct": frozenset(HMAC_MIN_BYTES)}


def public_jwks(keys: Iterable[VerificationKey]) -> dict[str, Any]:
    """A JWKS of ``keys`` that lets each verify exactly its own algorithms."""
    return {"keys": [jwk for key in keys for jwk in _jwks_for(key)]}


def _jwks_for(key: VerificationKey) -> list[dict[str, Any]]:
    jwk = _public_jwk(key)
    if key.kid is not None:
        jwk["kid"] = key.kid
    if len(key.algorithms) > 1 and frozenset(key.algorithms) == _EVERY_ALGORITHM.get(jwk["kty"]):
        return [jwk]
    # A JWK names one algorithm: a key narrowed to some of its type's (an EC
    # curve, a JWK's own alg, an HMAC secret too short for HS512) gets one
    # entry per algorithm, so Envoy refuses the others as the sidecar does.
    return [{**jwk, "alg": algorithm} for algorithm in key.algorithms]


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
