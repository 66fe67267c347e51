"""Tokens as a case describes them, minted at the moment they are sent.

A :class:`TokenSpec` says who signs (the gate's keys, an attacker's, an RSA
public key used as an HMAC secret, nobody), with which header and claims, and
what is done to the signed token afterwards. Times are relative to the
minting second (:class:`Rel`), so a token sent a few milliseconds later sits
exactly where the case put it relative to the configured leeway. Specs hold
no key material and no token, so they can be written to a results file.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from tests.fixtures import tokens as fixture_tokens

ABSENT = "<absent>"  # a claim or header member to leave out
ATTACKER_URL = "$attacker-url"  # replaced by the attacker's JWKS server URL
ATTACKER_JWK = "$attacker-jwk"  # replaced by the attacker's public JWK
ATTACKER_X5C = "$attacker-x5c"  # replaced by a certificate chain of the attacker's key

GATE_SIGNERS = ("rsa", "ec", "hs")
# Signers whose keys the gate does not trust, or that are not keys at all.
FORGING_SIGNERS = (
    "attacker-rsa",
    "attacker-ec",
    "attacker-hs",
    "rsa-pem-as-hmac",
    "rsa-jwk-as-hmac",
    "unsigned",
)
MUTATIONS = (
    "",
    "strip-signature",
    "swap-signature",
    "jwe-shape",
    "pad-signature",
    "pad-payload",
    "trailing-dot",
    "space-inside",
)


@dataclass(frozen=True)
class Rel:
    """A NumericDate this many seconds after the minting second."""

    seconds: int

    def __str__(self) -> str:
        return f"now{self.seconds:+d}"


@dataclass(frozen=True)
class TokenSpec:
    """How to build one token; ``claims`` and ``header`` override the defaults."""

    signer: str
    claims: Mapping[str, Any] = field(default_factory=dict)
    header: Mapping[str, Any] = field(default_factory=dict)
    alg: str | None = None  # the header's alg; the signature follows the signer
    mutation: str = ""
    tamper: Mapping[str, Any] = field(default_factory=dict)  # claims changed after signing
    repeat: Mapping[str, Any] = field(default_factory=dict)  # claims written a second time
    inner: TokenSpec | None = None  # a nested JWT: this token is the payload

    def describe(self) -> dict[str, Any]:
        """The spec as JSON for a results file (no key, no token)."""
        described: dict[str, Any] = {"signer": self.signer}
        for name in ("claims", "header", "tamper", "repeat"):
            value = getattr(self, name)
            if value:
                described[name] = {k: _printable(v) for k, v in value.items()}
        if self.alg is not None:
            described["alg"] = self.alg
        if self.mutation:
            described["mutation"] = self.mutation
        if self.inner is not None:
            described["inner"] = self.inner.describe()
        return described


def _printable(value: Any) -> Any:
    if isinstance(value, Rel):
        return str(value)
    if isinstance(value, str) and len(value) > 80:
        return f"{value[:40]!r}... ({len(value)} characters)"
    if isinstance(value, list) and len(value) > 8:
        return f"a list of {len(value)}"
    return value


class Keys:
    """The gate's keys (its JWKS), an attacker's keys, and the attacker's JWKS URL."""

    def __init__(self) -> None:
        self.rsa = fixture_tokens.KeyPair.rsa("rsa-1")
        self.ec = fixture_tokens.KeyPair.ec("ec-1")
        self.secret = fixture_tokens.hmac_secret()
        self.attacker_rsa = fixture_tokens.KeyPair.rsa("attacker-1")
        self.attacker_ec = fixture_tokens.KeyPair.ec("attacker-ec")
        self.attacker_secret = fixture_tokens.hmac_secret()
        self.attacker_url = ""  # set once the attacker's server listens
        self._certificate = _self_signed(self.attacker_ec)

    def gate_jwks(self) -> dict[str, Any]:
        """The JWKS the gate verifies with: an RSA, an EC and an HMAC key."""
        secret = base64.urlsafe_b64encode(self.secret).rstrip(b"=").decode()
        oct_key = {"kty": "oct", "k": secret, "kid": "hs-1", "use": "sig"}
        return fixture_tokens.jwks(self.rsa, self.ec, oct_key)

    def attacker_jwks(self) -> dict[str, Any]:
        """What the attacker's server publishes: its keys, one under the gate's RSA kid."""
        impostor = self.attacker_rsa.public_jwk(kid="rsa-1")
        return fixture_tokens.jwks(self.attacker_rsa, self.attacker_ec, impostor)

    def _marker(self, value: Any) -> Any:
        markers = {
            ATTACKER_URL: self.attacker_url,
            ATTACKER_JWK: self.attacker_rsa.public_jwk(),
            ATTACKER_X5C: [self._certificate],
        }
        return markers.get(value, value) if isinstance(value, str) else value

    def mint(self, spec: TokenSpec, tenant_default: str, now: int) -> str:
        """The compact token ``spec`` describes, for a caller of ``tenant_default``."""
        base: dict[str, Any] = {
            "iss": fixture_tokens.ISSUER,
            "aud": fixture_tokens.AUDIENCE,
            "sub": "alice",
            "tenant": tenant_default,
            "groups": ["qa"],
            "iat": Rel(0),
            "exp": Rel(300),
        }
        alg, kid = self._signer_defaults(spec.signer)
        header: dict[str, Any] = {"alg": spec.alg or alg, "typ": "JWT", "kid": kid}
        header.update({k: self._marker(v) for k, v in spec.header.items()})
        if spec.inner is not None:
            header.setdefault("cty", "JWT")
            payload = self.mint(spec.inner, tenant_default, now).encode()
        else:
            base.update(spec.claims)
            payload = _claims_json({**base}, spec.repeat, now)
        header = {k: v for k, v in header.items() if v != ABSENT and v is not None}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(payload)}"
        signature = self._sign(spec.signer, str(header.get("alg")), signing_input.encode())
        token = f"{signing_input}.{_b64(signature)}"
        if spec.tamper:
            token = fixture_tokens.tamper(token, **_times(dict(spec.tamper), now))
        return self._mutate(token, spec.mutation, tenant_default, now)

    def _signer_defaults(self, signer: str) -> tuple[str, str | None]:
        return {
            "rsa": ("RS256", "rsa-1"),
            "ec": ("ES256", "ec-1"),
            "hs": ("HS256", "hs-1"),
            "attacker-rsa": ("RS256", "attacker-1"),
            "attacker-ec": ("ES256", "attacker-ec"),
            "attacker-hs": ("HS256", "hs-1"),
            "rsa-pem-as-hmac": ("HS256", "rsa-1"),
            "rsa-jwk-as-hmac": ("HS256", "rsa-1"),
            "unsigned": ("none", None),
        }[signer]

    def _sign(self, signer: str, alg: str, message: bytes) -> bytes:
        if signer == "unsigned":
            return b""
        if signer in ("hs", "attacker-hs", "rsa-pem-as-hmac", "rsa-jwk-as-hmac"):
            secret = {
                "hs": self.secret,
                "attacker-hs": self.attacker_secret,
                "rsa-pem-as-hmac": self.rsa.public_pem(),
                "rsa-jwk-as-hmac": json.dumps(self.rsa.public_jwk()).encode(),
            }[signer]
            digest = {"HS384": hashlib.sha384, "HS512": hashlib.sha512}.get(alg, hashlib.sha256)
            return hmac.new(secret, message, digest).digest()
        pair = {
            "rsa": self.rsa,
            "ec": self.ec,
            "attacker-rsa": self.attacker_rsa,
            "attacker-ec": self.attacker_ec,
        }[signer]
        # An alg header that does not fit the key (a confusion case) still gets
        # a signature the key can make: the key's own algorithm.
        try:
            algorithm = jwt.get_algorithm_by_name(alg)
            signed: bytes = algorithm.sign(message, algorithm.prepare_key(pair.private_key))
        except (NotImplementedError, jwt.InvalidKeyError, TypeError, ValueError):
            algorithm = jwt.get_algorithm_by_name(pair.algorithm)
            signed = algorithm.sign(message, algorithm.prepare_key(pair.private_key))
        return signed

    def _mutate(self, token: str, mutation: str, tenant: str, now: int) -> str:
        header, payload, signature = token.split(".")
        if mutation == "strip-signature":
            return f"{header}.{payload}."
        if mutation == "swap-signature":
            valid = self.mint(TokenSpec("rsa"), tenant, now)
            return f"{header}.{payload}.{valid.rsplit('.', 1)[1]}"
        if mutation == "jwe-shape":
            return f"{token}.AAAA.BBBB"
        if mutation == "pad-signature":
            return f"{token}=="
        if mutation == "pad-payload":
            return f"{header}.{payload}==.{signature}"
        if mutation == "trailing-dot":
            return f"{token}."
        if mutation == "space-inside":
            return f"{header}. {payload}.{signature}"
        return token


def _claims_json(claims: dict[str, Any], repeat: Mapping[str, Any], now: int) -> bytes:
    """The payload JSON; ``repeat`` writes some claims a second time (duplicate keys)."""
    values = {k: v for k, v in _times(claims, now).items() if v != ABSENT}
    text = json.dumps(values)
    if repeat:
        extra = json.dumps(_times(dict(repeat), now))[1:-1]
        text = f"{text[:-1]}, {extra}}}"
    return text.encode()


def _times(values: dict[str, Any], now: int) -> dict[str, Any]:
    return {k: now + v.seconds if isinstance(v, Rel) else v for k, v in values.items()}


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _self_signed(pair: fixture_tokens.KeyPair) -> str:
    """A self-signed certificate of the key, base64 DER, as a JWS ``x5c`` entry carries it."""
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer.test")])
    now = datetime.datetime.now(datetime.UTC)
    private_key = pair.private_key
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private_key.public_key())
        .serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private_key, hashes.SHA256())
    )
    return base64.b64encode(certificate.public_bytes(serialization.Encoding.DER)).decode()
