"""Verification keys for sidecar-verified JWTs: where they come from and what they may verify.

A key is loaded from configuration only (a JWKS file or http(s) URL, a PEM
public key, an HMAC secret file), never from a token's header. Each key is
bound at load time to the algorithms its type allows: an RSA key of at least
2048 bits verifies RS*/PS*, an EC key the ES algorithm of its curve, an
Ed25519 key EdDSA, an HMAC secret the HS* its length allows. Keys that fit
none of these are refused (a single key) or left out (a JWKS entry, logged
with its kid and the reason, never the key).
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import json
import logging
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from sidecar.core.caller import IdentityError

log = logging.getLogger(__name__)

RSA_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512")
EC_ALGORITHMS_BY_CURVE = {
    "secp256r1": "ES256",
    "secp384r1": "ES384",
    "secp521r1": "ES512",
    "secp256k1": "ES256K",
}
# RFC 7518 section 3.2: an HMAC key must be at least as long as the hash output,
# so a 32-byte secret verifies HS256 only.
HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
MIN_HMAC_SECRET_BYTES = HMAC_MIN_BYTES["HS256"]
# NIST SP 800-131A; PyJWT would only warn on shorter keys.
MIN_RSA_BITS = 2048
# A JWKS is a few kilobytes; refuse to buffer whatever a misbehaving URL sends.
MAX_JWKS_BYTES = 1024 * 1024

_KNOWN_ALGORITHMS = frozenset(
    (*RSA_ALGORITHMS, *EC_ALGORITHMS_BY_CURVE.values(), "EdDSA", *HMAC_MIN_BYTES)
)

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | bytes


@dataclass(frozen=True)
class VerificationKey:
    """A key and the only algorithms it may verify."""

    key: PublicKey
    algorithms: tuple[str, ...]
    kid: str | None = None


class KeySource(Protocol):
    """Where verification keys come from (a JWKS file or URL, a PEM key, an HMAC secret)."""

    async def key_for(self, kid: str | None) -> VerificationKey:
        """The key for a token's ``kid``; raises IdentityError (``key_unknown``, ...)."""
        ...


def verification_key(key: object, kid: str | None = None) -> VerificationKey | None:
    """Wrap a key with the algorithms its type allows; None for unsupported or weak keys."""
    checked = _checked_key(key, kid)
    return checked if isinstance(checked, VerificationKey) else None


def _checked_key(key: object, kid: str | None) -> VerificationKey | str:
    """The key with the algorithms its type allows, or why it cannot verify (no key material)."""
    algorithms: tuple[str, ...]
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            return f"RSA key of {key.key_size} bits (at least {MIN_RSA_BITS} required)"
        algorithms = RSA_ALGORITHMS
    elif isinstance(key, ec.EllipticCurvePublicKey):
        curve_algorithm = EC_ALGORITHMS_BY_CURVE.get(key.curve.name)
        if curve_algorithm is None:
            return "unsupported EC curve"
        algorithms = (curve_algorithm,)
    elif isinstance(key, ed25519.Ed25519PublicKey):
        algorithms = ("EdDSA",)
    elif isinstance(key, bytes):
        algorithms = tuple(alg for alg, size in HMAC_MIN_BYTES.items() if len(key) >= size)
        if not algorithms:
            return f"HMAC secret of {len(key)} bytes (at least {MIN_HMAC_SECRET_BYTES} required)"
    else:
        # Private JWKs land here too: their type is not a public key type.
        return "not a public key of a supported type"
    return VerificationKey(key, algorithms, kid)


def _key_from_jwk(jwk: object) -> VerificationKey | str:
    """One JWKS entry as a verification key, or why it cannot verify signatures."""
    if not isinstance(jwk, dict):
        return "not a JSON object"
    if jwk.get("use", "sig") != "sig":
        return "not for signatures (use)"
    kid = jwk.get("kid")
    declared = jwk.get("alg")
    if kid is not None and not isinstance(kid, str):
        return "kid is not a string"
    if declared is not None and declared not in _KNOWN_ALGORITHMS:
        return "unsupported alg"
    try:
        parsed = jwt.PyJWK(jwk)
    # A JWKS is outside input; PyJWT lets KeyError/ValueError through for some defects.
    except (jwt.PyJWTError, KeyError, TypeError, ValueError):
        return "not a valid JWK"
    key = _checked_key(parsed.key, kid)
    if isinstance(key, str) or declared is None:
        return key
    # A JWK's `alg` narrows the key to that one algorithm.
    if declared not in key.algorithms:
        return "alg does not fit the key"
    return dataclasses.replace(key, algorithms=(declared,))


def _kid_for_logs(entry: object) -> str:
    """The entry's kid as log text: quoted, cut short (it is the issuer's free text)."""
    kid = entry.get("kid") if isinstance(entry, dict) else None
    return repr(kid[:64]) if isinstance(kid, str) else "(none)"


@dataclass(frozen=True)
class _KeySet:
    keys: tuple[VerificationKey, ...]

    @classmethod
    def from_jwks(cls, document: object, origin: str) -> _KeySet:
        entries = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise ValueError(f"{origin}: not a JWKS (no 'keys' list)")
        keys: list[VerificationKey] = []
        for index, entry in enumerate(entries):
            checked = _key_from_jwk(entry)
            if isinstance(checked, VerificationKey):
                keys.append(checked)
            else:
                # Which key and why, never the key: an operator can fix the issuer's set.
                log.warning(
                    "%s: JWKS key #%d (kid %s) left out: %s",
                    origin,
                    index,
                    _kid_for_logs(entry),
                    checked,
                )
        if not keys:
            raise ValueError(f"{origin}: JWKS has no usable signature verification key")
        return cls(tuple(keys))

    def find(self, kid: str | None) -> VerificationKey | None:
        if kid is None:
            # Without a kid only an unambiguous set can say which key signed.
            return self.keys[0] if len(self.keys) == 1 else None
        return next((key for key in self.keys if key.kid == kid), None)


def _key_unknown() -> IdentityError:
    return IdentityError("key_unknown", "no configured key matches the token's key id")


class JwksFile:
    """A JWKS document read once from a file at start-up."""

    def __init__(self, path: Path | str) -> None:
        origin = str(path)
        try:
            document = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as error:
            raise ValueError(f"{origin}: cannot read JWKS: {error}") from error
        self._keys = _KeySet.from_jwks(document, origin)

    @property
    def keys(self) -> tuple[VerificationKey, ...]:
        """The usable keys: entries not for signatures, unsupported or too weak are left out."""
        return self._keys.keys

    async def key_for(self, kid: str | None) -> VerificationKey:
        """The key with this kid (or the only key when the token has none)."""
        key = self._keys.find(kid)
        if key is None:
            raise _key_unknown()
        return key


class JwksUrl:
    """A JWKS fetched from an http(s) URL, cached and refreshed.

    The set is refetched when older than ``refresh_seconds`` (the request that
    notices pays for the fetch; concurrent ones keep using the cached set) and
    when a token names an unknown ``kid`` (key rotation), at most once per
    ``min_refetch_seconds`` so forged kids cannot hammer the issuer. Concurrent
    fetches are coalesced into one. When a fetch fails, the cached set stays in
    use; without one, the request fails with ``jwks_unavailable``. ``clock``
    (monotonic seconds) is replaceable for tests.
    """

    def __init__(
        self,
        url: str,
        *,
        refresh_seconds: float = 300,
        fetch_timeout_seconds: float = 2.0,
        min_refetch_seconds: float = 30,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ValueError(f"JWKS URL must be http:// or https://, got {url!r}")
        self._url = url
        # For messages: a JWKS URL may carry credentials in its userinfo or query.
        parts = urlsplit(url)
        self._url_for_logs = f"{parts.scheme}://{parts.hostname}{parts.path}"
        self._refresh_seconds = refresh_seconds
        self._fetch_timeout_seconds = fetch_timeout_seconds
        self._min_refetch_seconds = min_refetch_seconds
        self._clock = clock
        self._keys: _KeySet | None = None
        self._fetched_at = 0.0  # clock() of the last successful fetch
        self._attempted_at: float | None = None  # ... of the last attempt, failed or not
        self._finished_fetches = 0
        self._lock = asyncio.Lock()

    async def key_for(self, kid: str | None) -> VerificationKey:
        """The key for ``kid``, refetching the set once if the kid is new."""
        key = (await self._current()).find(kid)
        # A fetch in flight may bring the kid; joining it costs the issuer nothing.
        if key is None and kid is not None and (self._lock.locked() or self._may_fetch()):
            key = (await self._fetch_coalesced()).find(kid)
        if key is None:
            raise _key_unknown()
        return key

    async def keys(self) -> tuple[VerificationKey, ...]:
        """Every usable key now, fetched and refreshed as for ``key_for``.

        For handing the set on (to Envoy, ``sidecar.runtime.jwks_relay``);
        IdentityError ``jwks_unavailable`` while no fetch has ever succeeded.
        """
        return (await self._current()).keys

    async def _current(self) -> _KeySet:
        keys = self._keys
        if keys is None or (self._expired() and not self._lock.locked() and self._may_fetch()):
            keys = await self._fetch_coalesced()
        return keys

    def _expired(self) -> bool:
        return self._clock() - self._fetched_at >= self._refresh_seconds

    def _may_fetch(self) -> bool:
        attempted = self._attempted_at
        return attempted is None or self._clock() - attempted >= self._min_refetch_seconds

    async def _fetch_coalesced(self) -> _KeySet:
        finished_before = self._finished_fetches
        async with self._lock:
            # Callers that queued behind a fetch share its outcome instead of repeating it.
            if self._finished_fetches == finished_before:
                try:
                    await self._fetch()
                finally:
                    self._finished_fetches += 1
        if self._keys is None:
            raise IdentityError(
                "jwks_unavailable",
                f"JWKS could not be fetched from {self._url_for_logs}",
                outage=True,
            )
        return self._keys

    async def _fetch(self) -> None:
        self._attempted_at = self._clock()
        try:
            # The socket timeout bounds each read; wait_for bounds the whole fetch.
            keys = await asyncio.wait_for(
                asyncio.to_thread(self._download), self._fetch_timeout_seconds
            )
        # TimeoutError and URLError are OSErrors; a broken HTTP exchange is neither.
        except (OSError, ValueError, http.client.HTTPException) as error:
            log.warning(
                "JWKS fetch from %s failed (%s: %s); %s",
                self._url_for_logs,
                type(error).__name__,
                error,
                "keeping the cached keys" if self._keys is not None else "no keys available",
            )
            return
        self._keys = keys
        self._fetched_at = self._attempted_at

    def _download(self) -> _KeySet:
        headers = {"accept": "application/json"}
        timeout = self._fetch_timeout_seconds
        # The scheme was checked in __init__ (http or https only).
        request = urllib.request.Request(self._url, headers=headers)  # noqa: S310
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            body = response.read(MAX_JWKS_BYTES + 1)
        if len(body) > MAX_JWKS_BYTES:
            raise ValueError(f"JWKS larger than {MAX_JWKS_BYTES} bytes")
        return _KeySet.from_jwks(json.loads(body), self._url_for_logs)


class _SingleKey:
    """A key source with exactly one key, used whatever the token's kid."""

    _key: VerificationKey

    @property
    def key(self) -> VerificationKey:
        """The validated key (for handing it to Envoy's jwt_authn as a JWK)."""
        return self._key

    async def key_for(self, kid: str | None) -> VerificationKey:
        """The configured key, whatever the kid."""
        return self._key


class PemPublicKey(_SingleKey):
    """One PEM public key (RSA of at least 2048 bits, EC or Ed25519); the token's kid is ignored."""

    def __init__(self, path: Path | str) -> None:
        try:
            loaded = serialization.load_pem_public_key(Path(path).read_bytes())
        except (OSError, ValueError) as error:
            raise ValueError(f"{path}: not a PEM public key: {error}") from error
        key = verification_key(loaded)
        if key is None:
            raise ValueError(
                f"{path}: unsupported key type (want RSA >= {MIN_RSA_BITS} bits, EC or Ed25519)"
            )
        self._key = key


class HmacSecret(_SingleKey):
    """A shared HMAC secret read from a file (one trailing newline is not part of it)."""

    def __init__(self, path: Path | str) -> None:
        try:
            secret = Path(path).read_bytes()
        except OSError as error:
            raise ValueError(f"{path}: cannot read HMAC secret: {error}") from error
        # Editors and `echo` add a newline that the issuer's copy does not have.
        for newline in (b"\r\n", b"\n"):
            if secret.endswith(newline):
                secret = secret[: -len(newline)]
                break
        key = verification_key(secret)
        if key is None:
            raise ValueError(
                f"{path}: HMAC secret is {len(secret)} bytes; at least "
                f"{MIN_HMAC_SECRET_BYTES} are required"
            )
        self._key = key


def is_jwks_url(jwks: str | None) -> bool:
    """True when a ``--jwks`` value names a URL to fetch rather than a file."""
    return jwks is not None and jwks.startswith(("http://", "https://"))


def key_source(
    *, jwks: str | None, public_key: Path | None, hmac_secret_file: Path | None
) -> KeySource:
    """The key source for exactly one of the flags.

    ``--jwks`` (an http(s) URL or a file), ``--jwt-public-key``, ``--jwt-hmac-secret-file``.
    """
    given = [value for value in (jwks, public_key, hmac_secret_file) if value is not None]
    if len(given) != 1:
        raise ValueError(
            "exactly one of --jwks, --jwt-public-key, --jwt-hmac-secret-file is required"
        )
    if jwks is not None:
        if is_jwks_url(jwks):
            return JwksUrl(jwks)
        return JwksFile(jwks)
    if public_key is not None:
        return PemPublicKey(public_key)
    assert hmac_secret_file is not None
    return HmacSecret(hmac_secret_file)
