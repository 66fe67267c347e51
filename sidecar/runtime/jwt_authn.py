"""Envoy's jwt_authn filter for `--identity envoy-jwt`: Envoy verifies, the sidecar decides.

The filter verifies the bearer token's signature and time claims and puts
either the verified payload or the failure status in filter metadata, which
the ext_proc filter forwards to the sidecar (``metadata_options``).
It never refuses a request itself (``allow_missing_or_failed``): the sidecar
answers every identity failure, with the same 401 and machine-readable reason
in every mode, and without a verified payload nothing is admitted.

Keys reach Envoy by file name or from the sidecar, never inline, so secrets
do not show up in Envoy's configuration dump, and they are always keys the
sidecar's own loader accepts (``sidecar.identity.keys``), so `envoy-jwt`
verifies with no key that `jwt` mode would refuse: a PEM key, an HMAC secret
or a JWKS file reaches Envoy as a JWKS file the sidecar writes; a JWKS URL is
fetched by the sidecar and relayed to Envoy's ``remote_jwks``
(``sidecar.runtime.jwks_relay``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sidecar.config import Settings
from sidecar.identity.credentials import API_KEY
from sidecar.identity.envoy_jwt import FAILURE_KEY, JWT_AUTHN_NAMESPACE
from sidecar.identity.keys import HmacSecret, JwksFile, PemPublicKey, VerificationKey, is_jwks_url
from sidecar.identity.publish import public_jwks
from sidecar.runtime.jwks_relay import relay_address, relay_url

PROVIDER = "retrieval_gate"
JWKS_RELAY_CLUSTER = "jwks_relay"
# Envoy asks the relay this often; the relay's own cache follows the provider
# (300 s), so this only bounds how long Envoy lags behind the relay.
RELAY_CACHE_SECONDS = 30
# Longer than the relay's own fetch from the provider (2 s), which a request may wait for.
RELAY_TIMEOUT_SECONDS = 5

_TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"


def needs_generated_jwks(settings: Settings) -> bool:
    """True when Envoy gets its keys from a JWKS file the sidecar writes (every key but a URL)."""
    return not is_jwks_url(settings.identity.jwks)


def write_generated_jwks(settings: Settings, path: Path) -> None:
    """Write the configured keys as a JWKS file only its owner can read.

    The keys are loaded with the same checks as the sidecar's own verification
    (RSA >= 2048 bits, HMAC secrets >= 32 bytes; a JWKS file's weak or
    unsupported entries left out with a warning, none usable an error), so
    `envoy-jwt` accepts no weaker key than `jwt`.
    """
    keys: tuple[VerificationKey, ...]
    if settings.identity.jwt_public_key is not None:
        keys = (PemPublicKey(settings.identity.jwt_public_key).key,)
    elif settings.identity.jwt_hmac_secret_file is not None:
        keys = (HmacSecret(settings.identity.jwt_hmac_secret_file).key,)
    elif settings.identity.jwks is not None and not is_jwks_url(settings.identity.jwks):
        keys = JwksFile(settings.identity.jwks).keys
    else:
        raise ValueError("no PEM key, HMAC secret or JWKS file configured")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(public_jwks(keys), handle)


def _jwks_source(settings: Settings, generated_jwks: Path | None) -> dict[str, Any]:
    relay = relay_address(settings)
    if relay is not None:
        return {
            "remote_jwks": {
                "http_uri": {
                    "uri": relay_url(relay),
                    "cluster": JWKS_RELAY_CLUSTER,
                    "timeout": f"{RELAY_TIMEOUT_SECONDS}s",
                },
                "cache_duration": f"{RELAY_CACHE_SECONDS}s",
            }
        }
    if generated_jwks is None:
        raise ValueError("a PEM key, HMAC secret or JWKS file needs a generated JWKS for Envoy")
    return {"local_jwks": {"filename": str(generated_jwks)}}


def jwt_authn_filter(settings: Settings, generated_jwks: Path | None = None) -> dict[str, Any]:
    """The jwt_authn HTTP filter: verifies, records the outcome, never refuses on its own."""
    provider = {
        # Issuer and audience are also checked by the sidecar, from the payload.
        "issuer": settings.identity.issuer,
        # Kept for the sidecar, which checks that the request carries no other
        # token than the one verified here, and strips every credential header.
        "forward": True,
        "payload_in_metadata": settings.identity.jwt_payload_key,
        "failed_status_in_metadata": FAILURE_KEY,
        "clock_skew_seconds": int(settings.identity.jwt_leeway_seconds),
        # Where clients put it: Envoy reads headers with a prefix, so the pymilvus
        # form (the token in base64) needs identity jwt (docs/identity.md).
        "from_headers": [
            {"name": "authorization", "value_prefix": "Bearer "},
            *([{"name": "api-key"}] if API_KEY in settings.identity.jwt_credentials else []),
        ],
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
