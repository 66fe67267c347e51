"""Identity from Envoy's ``jwt_authn`` filter (identity mode ``envoy-jwt``).

Envoy has already verified the token's signature, ``exp`` and ``nbf`` and put
either its claims (``payload_in_metadata``) or why it failed
(``failed_status_in_metadata``) in filter metadata, which the ext_proc filter
forwards to the sidecar (``metadata_options``). A client cannot write filter
metadata, so a payload found there is as trustworthy as Envoy's verification.

jwt_authn is configured never to refuse on its own, so that every identity
failure gets the sidecar's 401 with a machine-readable reason; issuer and
audience are checked here for the same reason (Envoy answers a wrong audience
with 403). A token without ``exp``, which Envoy takes as never expiring, is
refused here as `jwt` mode refuses it, and so is an ``iat`` beyond the leeway,
which Envoy does not check.

jwt_authn verifies every token it finds and keeps the payload of one, so the
request must carry exactly one token (``jwt_authn`` forwards it, and the
sidecar strips it), and that token's payload must be the one Envoy verified:
two tokens, or a verified one beside one Envoy could not verify, are refused
as `jwt` mode refuses them.
"""

from __future__ import annotations

import binascii
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from jwt.utils import base64url_decode

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest
from sidecar.identity.claims import ClaimMapping
from sidecar.identity.credentials import BEARER, credential_headers, find_token

JWT_AUTHN_NAMESPACE = "envoy.filters.http.jwt_authn"
PAYLOAD_KEY = "jwt_payload"
FAILURE_KEY = "jwt_failure"

# Envoy's verification messages (jwt_verify_lib) -> the reasons the `jwt` mode gives.
_FAILURES = (
    ("is missing", "token_missing"),
    ("expired", "token_expired"),
    ("not yet valid", "token_not_yet_valid"),
    ("verification fail", "signature_invalid"),
    ("issuer is not configured", "issuer_mismatch"),
    ("audiences", "audience_mismatch"),
    ("is not supported", "algorithm_not_allowed"),
    ("doesn't have key", "key_unknown"),
    ("remote fetch", "jwks_unavailable"),
)
# Of those, the one that is an outage (Envoy could not fetch the keys), not the caller's fault.
_OUTAGE = "jwks_unavailable"


def failure_code(message: str) -> str:
    """The reason code for an Envoy jwt_authn failure message."""
    lowered = message.lower()
    return next((code for text, code in _FAILURES if text in lowered), "token_malformed")


class EnvoyJwtPayload:
    """Reads ``request.metadata[namespace][payload_key]`` and maps its claims."""

    def __init__(
        self,
        mapping: ClaimMapping,
        *,
        issuer: str,
        audience: str,
        namespace: str = JWT_AUTHN_NAMESPACE,
        payload_key: str = PAYLOAD_KEY,
        locations: Sequence[str] = (BEARER,),
        leeway_seconds: float = 30,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``locations``: where clients may put the token (all removed upstream)."""
        # jwt_authn forwards the token (the sidecar compares it with the payload);
        # the vector DB never needs any of them.
        self._locations = tuple(locations)
        self.strip_headers = credential_headers(self._locations)
        self._mapping = mapping
        self._issuer = issuer
        self._audience = audience
        self._namespace = namespace
        self._payload_key = payload_key
        self._leeway_seconds = leeway_seconds
        self._clock = clock

    async def identify(self, request: AuthRequest) -> Caller:
        """The caller from the verified payload; IdentityError ``token_missing`` without one."""
        metadata = request.metadata.get(self._namespace, {})
        payload = metadata.get(self._payload_key)
        failure = metadata.get(FAILURE_KEY)
        if isinstance(failure, Mapping):
            # One token Envoy could not verify is enough: beside a verified one,
            # which of the two a client meant is not the gate's guess to make.
            code = failure_code(str(failure.get("message", "")))
            if payload is not None and code != "token_missing":
                code = "token_ambiguous"
            raise IdentityError(
                code, "Envoy jwt_authn refused a token of the request", outage=code == _OUTAGE
            )
        if payload is None:
            raise IdentityError(
                "token_missing",
                f"no verified JWT payload in metadata {self._namespace}/{self._payload_key}",
            )
        if not isinstance(payload, Mapping):
            raise IdentityError("token_malformed", "the JWT payload in metadata is not an object")
        if _claims_of(find_token(request.headers, self._locations)) != payload:
            raise IdentityError(
                "token_ambiguous", "the request carries another token than the verified one"
            )
        exp = payload.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            # Envoy accepts a token without exp as never expiring; `jwt` mode
            # requires one, and both modes must refuse the same tokens.
            raise IdentityError("token_malformed", "token has no 'exp' claim")
        iat = payload.get("iat")
        if isinstance(iat, int | float) and iat > self._clock() + self._leeway_seconds:
            raise IdentityError("token_not_yet_valid", "token is not yet valid (iat)")
        if payload.get("iss") != self._issuer:
            raise IdentityError("issuer_mismatch", "token issuer is not the configured issuer")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self._audience not in audiences:
            raise IdentityError("audience_mismatch", "token audience does not include ours")
        return self._mapping.caller_from_claims(payload)


def _claims_of(token: str) -> Any:
    """The token's payload as JSON, unverified (None when it is not a JWS payload)."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        return json.loads(base64url_decode(parts[1]))
    except (binascii.Error, ValueError):
        return None
