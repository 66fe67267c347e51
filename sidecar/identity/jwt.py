"""The sidecar verifies bearer tokens itself (identity mode ``jwt``).

The algorithms a token may use are decided by the key that verifies it, never
by the token's header: an RSA key verifies RS*/PS*, an EC key the ES algorithm
of its curve, an Ed25519 key EdDSA, an HMAC secret HS* (``sidecar.identity.keys``
binds each key to its algorithms). That closes the classic confusions
(``alg: none``; an HS256 token "signed" with the RSA public key as the HMAC
secret). Header fields that point at keys (``jku``, ``x5u``, ``jwk``) are
ignored: keys come only from configuration.

Error messages never contain the token or a claim value.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Sequence
from typing import Any

import jwt
from jwt.utils import base64url_decode

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest
from sidecar.identity.claims import ClaimMapping
from sidecar.identity.credentials import BEARER, credential_headers, find_token
from sidecar.identity.keys import KeySource


class JwtVerifier:
    """Verifies a compact JWS token: signature, ``exp``, ``nbf``, ``iat``, ``iss``, ``aud``."""

    def __init__(
        self, keys: KeySource, *, issuer: str, audience: str, leeway_seconds: float = 30
    ) -> None:
        if not issuer or not audience:
            raise ValueError("JWT verification needs a non-empty --issuer and --audience")
        self._keys = keys
        self._issuer = issuer
        self._audience = audience
        self._leeway_seconds = leeway_seconds

    async def verify(self, token: str) -> dict[str, Any]:
        """The verified claims, or IdentityError with a machine-readable code."""
        if _repeats_a_member(token):
            raise IdentityError("token_malformed", "token header or payload names a member twice")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise IdentityError("token_malformed", "token is not a well-formed JWS") from None
        algorithm = header.get("alg")
        if not isinstance(algorithm, str):
            raise IdentityError("token_malformed", "token header has no algorithm")
        if algorithm.lower() == "none":
            raise IdentityError("algorithm_not_allowed", "unsigned tokens (alg none) are refused")
        key = await self._keys.key_for(header.get("kid"))
        if algorithm not in key.algorithms:
            # The header value is attacker-chosen text; it stays out of the log line.
            raise IdentityError(
                "algorithm_not_allowed", "the verifying key does not allow the token's algorithm"
            )
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=list(key.algorithms),
                issuer=self._issuer,
                audience=self._audience,
                leeway=self._leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as error:
            raise _rejection(error) from None
        return claims


class _Repeated(ValueError):
    pass


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({name for name, _ in pairs}) != len(pairs):
        raise _Repeated
    return dict(pairs)


def _repeats_a_member(token: str) -> bool:
    """True when the token's header or payload names a member twice.

    JSON parsers keep the first or the last of two equal names (PyJWT the
    last, Envoy refuses the token), so such a token could mean two tenants.
    """
    for segment in token.split(".")[:2]:
        try:
            json.loads(base64url_decode(segment), object_pairs_hook=_no_repeats)
        except _Repeated:
            return True
        except (binascii.Error, ValueError):
            return False  # not JSON at all: PyJWT says how it is malformed
    return False


def _rejection(error: jwt.PyJWTError) -> IdentityError:
    """Map a PyJWT failure to a code; the message names the check, never a value."""
    if isinstance(error, jwt.MissingRequiredClaimError):
        code = {"iss": "issuer_mismatch", "aud": "audience_mismatch"}.get(
            error.claim, "token_malformed"
        )
        return IdentityError(code, f"token has no {error.claim!r} claim")
    codes: tuple[tuple[type[jwt.PyJWTError], str, str], ...] = (
        (jwt.ExpiredSignatureError, "token_expired", "token has expired"),
        (jwt.ImmatureSignatureError, "token_not_yet_valid", "token is not yet valid (nbf/iat)"),
        (jwt.InvalidIssuerError, "issuer_mismatch", "token issuer is not the configured one"),
        (jwt.InvalidAudienceError, "audience_mismatch", "token audience lacks the configured one"),
        (jwt.InvalidAlgorithmError, "algorithm_not_allowed", "token algorithm is not allowed"),
        (jwt.InvalidSignatureError, "signature_invalid", "token signature does not verify"),
    )
    for kind, code, message in codes:
        if isinstance(error, kind):
            return IdentityError(code, message)
    return IdentityError("token_malformed", f"token rejected ({type(error).__name__})")


class JwtBearer:
    """Identity from a JWT the sidecar verifies, found where the client sends its credential.

    ``locations`` are ``sidecar.identity.credentials`` names (default: an
    ``authorization: Bearer`` header only).
    """

    def __init__(
        self, verifier: JwtVerifier, mapping: ClaimMapping, locations: Sequence[str] = (BEARER,)
    ) -> None:
        self._verifier = verifier
        self._mapping = mapping
        self._locations = tuple(locations)
        # The caller's token is for the gate; the vector DB never sees it.
        self.strip_headers = credential_headers(self._locations)

    async def identify(self, request: AuthRequest) -> Caller:
        """Verify the token and map its claims; IdentityError when absent or invalid."""
        token = find_token(request.headers, self._locations)
        claims = await self._verifier.verify(token)
        return self._mapping.caller_from_claims(claims)
