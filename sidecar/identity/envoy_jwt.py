"""Identity from Envoy's ``jwt_authn`` filter (identity mode ``envoy-jwt``).

Envoy has already verified the token's signature, ``exp`` and ``nbf`` and,
with ``payload_in_metadata``, put its claims in filter metadata, which
ext_authz forwards to the sidecar (``metadata_context_namespaces``). A client
cannot write filter metadata, so the payload found there is as trustworthy as
Envoy's verification.

Issuer and audience are checked here rather than by jwt_authn: Envoy answers a
wrong audience with 403, and a caller whose identity is not established must
get 401 like every other identity failure.
"""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.identity import AuthRequest, Caller, IdentityError
from sidecar.identity.claims import ClaimMapping

JWT_AUTHN_NAMESPACE = "envoy.filters.http.jwt_authn"


class EnvoyJwtPayload:
    """Reads ``request.metadata[namespace][payload_key]`` and maps its claims."""

    # jwt_authn keeps the header unless `forward: false`; the vector DB never needs it.
    strip_headers: tuple[str, ...] = ("authorization",)

    def __init__(
        self,
        mapping: ClaimMapping,
        *,
        issuer: str,
        audience: str,
        namespace: str = JWT_AUTHN_NAMESPACE,
        payload_key: str = "jwt_payload",
    ) -> None:
        self._mapping = mapping
        self._issuer = issuer
        self._audience = audience
        self._namespace = namespace
        self._payload_key = payload_key

    async def identify(self, request: AuthRequest) -> Caller:
        """The caller from the verified payload; IdentityError ``token_missing`` without one."""
        payload = request.metadata.get(self._namespace, {}).get(self._payload_key)
        if payload is None:
            raise IdentityError(
                "token_missing",
                f"no verified JWT payload in metadata {self._namespace}/{self._payload_key}",
            )
        if not isinstance(payload, Mapping):
            raise IdentityError("token_malformed", "the JWT payload in metadata is not an object")
        if payload.get("iss") != self._issuer:
            raise IdentityError("issuer_mismatch", "token issuer is not the configured issuer")
        audience = payload.get("aud")
        audiences = audience if isinstance(audience, list) else [audience]
        if self._audience not in audiences:
            raise IdentityError("audience_mismatch", "token audience does not include ours")
        return self._mapping.caller_from_claims(payload)
