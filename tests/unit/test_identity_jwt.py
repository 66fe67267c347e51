"""Sidecar-verified JWTs (identity ``jwt``) and Envoy's verified payload (``envoy-jwt``)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity import AuthRequest
from sidecar.identity.claims import ClaimMapping
from sidecar.identity.envoy_jwt import EnvoyJwtPayload
from sidecar.identity.jwt import JwtBearer, JwtVerifier
from sidecar.identity.keys import (
    HmacSecret,
    JwksFile,
    JwksUrl,
    KeySource,
    PemPublicKey,
    key_source,
)
from tests.fixtures.jwks_server import JwksServer
from tests.fixtures.tokens import (
    AUDIENCE,
    ISSUER,
    KeyPair,
    claims,
    hmac_secret,
    hmac_token_unchecked,
    jwks,
    tamper,
    token,
    unsigned_token,
)

# Key generation is the slow part of these tests; share keys per module.


@pytest.fixture(scope="module")
def rsa_key() -> KeyPair:
    return KeyPair.rsa("rsa-1")


@pytest.fixture(scope="module")
def other_rsa_key() -> KeyPair:
    return KeyPair.rsa("rsa-2")


@pytest.fixture(scope="module")
def ec_key() -> KeyPair:
    return KeyPair.ec("ec-1")


def write(path: Path, content: bytes | dict[str, Any]) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
    return path


def jwks_file(tmp_path: Path, *keys: KeyPair | dict[str, Any]) -> JwksFile:
    return JwksFile(write(tmp_path / "jwks.json", jwks(*keys)))


def verify(keys: KeySource, compact: str, *, leeway: float = 30) -> dict[str, Any]:
    verifier = JwtVerifier(keys, issuer=ISSUER, audience=AUDIENCE, leeway_seconds=leeway)
    return asyncio.run(verifier.verify(compact))


def rejection(keys: KeySource, compact: str, *, leeway: float = 30) -> str:
    """The IdentityError code; also checks the message leaks neither token nor claims."""
    with pytest.raises(IdentityError) as raised:
        verify(keys, compact, leeway=leeway)
    assert_no_leak(raised.value, compact)
    return raised.value.code


def assert_no_leak(error: IdentityError, compact: str) -> None:
    text = f"{error} {error.code} {error!r}"
    for part in [compact, *compact.split(".")]:
        assert len(part) < 8 or part not in text
    for value in ("alice", "acme"):  # claim values of tests.fixtures.tokens.claims()
        assert value not in text
    assert error.__cause__ is None  # no PyJWT exception (and its text) rides along


# --- verification with each kind of key ----------------------------------------------


def test_rs256_via_jwks_file(tmp_path: Path, rsa_key: KeyPair, ec_key: KeyPair) -> None:
    verified = verify(jwks_file(tmp_path, rsa_key, ec_key), token(rsa_key, claims()))
    assert verified["sub"] == "alice"
    assert verified["tenant"] == "acme"


def test_es256_via_jwks_file(tmp_path: Path, rsa_key: KeyPair, ec_key: KeyPair) -> None:
    assert verify(jwks_file(tmp_path, rsa_key, ec_key), token(ec_key, claims()))["sub"] == "alice"


@pytest.mark.parametrize("curve", ["P-384", "P-521"])
def test_other_ec_curves_use_their_own_algorithm(tmp_path: Path, curve: str) -> None:
    key = KeyPair.ec("ec-x", curve=curve)
    assert verify(jwks_file(tmp_path, key), token(key, claims()))["sub"] == "alice"


def test_eddsa_via_jwks_file(tmp_path: Path) -> None:
    key = KeyPair.ed25519()
    assert verify(jwks_file(tmp_path, key), token(key, claims()))["sub"] == "alice"


@pytest.mark.parametrize("alg", ["RS384", "RS512", "PS256", "PS384", "PS512"])
def test_an_rsa_key_verifies_every_rsa_algorithm(
    tmp_path: Path, rsa_key: KeyPair, alg: str
) -> None:
    assert verify(jwks_file(tmp_path, rsa_key), token(rsa_key, claims(), alg=alg))


def test_a_jwk_alg_narrows_the_key_to_that_algorithm(tmp_path: Path, rsa_key: KeyPair) -> None:
    keys = jwks_file(tmp_path, rsa_key.public_jwk(alg="PS256"))
    assert verify(keys, token(rsa_key, claims(), alg="PS256"))
    assert rejection(keys, token(rsa_key, claims(), alg="RS256")) == "algorithm_not_allowed"


def test_hs256_via_secret_file(tmp_path: Path) -> None:
    secret = hmac_secret()
    keys = HmacSecret(write(tmp_path / "secret", secret + b"\n"))
    assert verify(keys, token(secret, claims()))["sub"] == "alice"
    assert rejection(keys, token(hmac_secret(), claims())) == "signature_invalid"


# Signing HS512 with a 32-byte secret is the point of the test; PyJWT warns about it.
@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_hmac_algorithms_follow_the_secret_length(tmp_path: Path) -> None:
    short, long = hmac_secret(32), hmac_secret(64)
    assert rejection(HmacSecret(write(tmp_path / "s", short)), token(short, claims(), alg="HS512"))
    keys = HmacSecret(write(tmp_path / "l", long))
    for alg in ("HS256", "HS384", "HS512"):
        assert verify(keys, token(long, claims(), alg=alg))


def test_hmac_secret_file_strips_exactly_one_trailing_newline(tmp_path: Path) -> None:
    secret = hmac_secret() + b"\n"  # a newline that belongs to the secret
    keys = HmacSecret(write(tmp_path / "secret", secret + b"\r\n"))
    assert verify(keys, token(secret, claims()))


@pytest.mark.parametrize("content", [b"", b"short\n", b"x" * 31 + b"\n", b"x" * 31 + b"\r\n"])
def test_short_hmac_secrets_are_refused_at_load(tmp_path: Path, content: bytes) -> None:
    with pytest.raises(ValueError, match="at least 32"):
        HmacSecret(write(tmp_path / "secret", content))


def test_rs256_via_pem_public_key(tmp_path: Path, rsa_key: KeyPair) -> None:
    keys = PemPublicKey(write(tmp_path / "key.pem", rsa_key.public_pem()))
    # A PEM key has no kid, so the token's kid does not matter.
    assert verify(keys, token(rsa_key, claims(), headers={"kid": "whatever"}))
    assert verify(keys, token(rsa_key, claims(), headers={"kid": None}))


def test_es256_via_pem_public_key(tmp_path: Path, ec_key: KeyPair) -> None:
    keys = PemPublicKey(write(tmp_path / "key.pem", ec_key.public_pem()))
    assert verify(keys, token(ec_key, claims()))


def test_pem_files_that_are_not_usable_public_keys_are_refused(
    tmp_path: Path, rsa_key: KeyPair
) -> None:
    private_pem = rsa_key.private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(ValueError, match="not a PEM public key"):
        PemPublicKey(write(tmp_path / "private.pem", private_pem))
    with pytest.raises(ValueError, match="unsupported key"):
        PemPublicKey(write(tmp_path / "weak.pem", KeyPair.rsa(bits=1024).public_pem()))
    with pytest.raises(ValueError, match="not a PEM public key"):
        PemPublicKey(tmp_path / "missing.pem")


# --- time, issuer and audience ---------------------------------------------------------


@pytest.fixture
def rsa_jwks(tmp_path: Path, rsa_key: KeyPair) -> JwksFile:
    return jwks_file(tmp_path, rsa_key)


def test_expired_token(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    now = int(time.time())
    assert rejection(rsa_jwks, token(rsa_key, claims(exp=now - 120))) == "token_expired"


def test_nbf_in_the_future(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    now = int(time.time())
    compact = token(rsa_key, claims(nbf=now + 120))
    assert rejection(rsa_jwks, compact) == "token_not_yet_valid"


def test_iat_in_the_future(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    now = int(time.time())
    compact = token(rsa_key, claims(iat=now + 120))
    assert rejection(rsa_jwks, compact) == "token_not_yet_valid"


# Offsets are 5 s away from the 30 s leeway so that a slow test run cannot flip them.
@pytest.mark.parametrize(
    ("claim", "offset", "code"),
    [
        ("exp", -25, None),
        ("exp", -35, "token_expired"),
        ("nbf", 25, None),
        ("nbf", 35, "token_not_yet_valid"),
        ("iat", 25, None),
        ("iat", 35, "token_not_yet_valid"),
    ],
)
def test_leeway_boundaries(
    rsa_jwks: JwksFile, rsa_key: KeyPair, claim: str, offset: int, code: str | None
) -> None:
    compact = token(rsa_key, claims(**{claim: int(time.time()) + offset}))
    if code is None:
        assert verify(rsa_jwks, compact, leeway=30)
    else:
        assert rejection(rsa_jwks, compact, leeway=30) == code


def test_zero_leeway(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    compact = token(rsa_key, claims(exp=int(time.time()) - 2))
    assert verify(rsa_jwks, compact, leeway=30)
    assert rejection(rsa_jwks, compact, leeway=0) == "token_expired"


def test_wrong_issuer(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    compact = token(rsa_key, claims(iss="https://evil.test"))
    assert rejection(rsa_jwks, compact) == "issuer_mismatch"


def test_wrong_audience(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    assert rejection(rsa_jwks, token(rsa_key, claims(aud="other-api"))) == "audience_mismatch"


def test_audience_as_list(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    assert verify(rsa_jwks, token(rsa_key, claims(aud=["other-api", AUDIENCE])))
    compact = token(rsa_key, claims(aud=["other-api", "third"]))
    assert rejection(rsa_jwks, compact) == "audience_mismatch"


@pytest.mark.parametrize(
    ("claim", "code"),
    [("exp", "token_malformed"), ("iss", "issuer_mismatch"), ("aud", "audience_mismatch")],
)
def test_required_claims(rsa_jwks: JwksFile, rsa_key: KeyPair, claim: str, code: str) -> None:
    payload = claims()
    del payload[claim]
    compact = token(rsa_key, payload)
    with pytest.raises(IdentityError) as raised:
        verify(rsa_jwks, compact)
    assert raised.value.code == code
    assert repr(claim) in str(raised.value)


# --- signatures, algorithms and keys ----------------------------------------------------


def test_tampered_payload(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    compact = tamper(token(rsa_key, claims()), tenant="globex")
    assert rejection(rsa_jwks, compact) == "signature_invalid"


def test_signed_by_another_key_with_the_same_kid(
    rsa_jwks: JwksFile, other_rsa_key: KeyPair
) -> None:
    compact = token(other_rsa_key, claims(), headers={"kid": "rsa-1"})
    assert rejection(rsa_jwks, compact) == "signature_invalid"


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_is_refused(tmp_path: Path, rsa_key: KeyPair, alg: str) -> None:
    sources: list[KeySource] = [
        jwks_file(tmp_path, rsa_key),
        HmacSecret(write(tmp_path / "secret", hmac_secret())),
        PemPublicKey(write(tmp_path / "key.pem", rsa_key.public_pem())),
    ]
    for source in sources:
        for headers in ({"alg": alg, "kid": "rsa-1"}, {"alg": alg}):
            compact = unsigned_token(claims(), headers=headers)
            assert rejection(source, compact) == "algorithm_not_allowed"


def test_hs256_signed_with_the_rsa_public_key_is_refused(tmp_path: Path, rsa_key: KeyPair) -> None:
    """The classic confusion: the verifier must not use RSA key material as an HMAC secret."""
    pem = rsa_key.public_pem()
    der = rsa_key.private_key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    sources: list[KeySource] = [
        PemPublicKey(write(tmp_path / "key.pem", pem)),
        jwks_file(tmp_path, rsa_key),
    ]
    for source in sources:
        for secret in (pem, pem.strip(), der, json.dumps(rsa_key.public_jwk()).encode()):
            forged = hmac_token_unchecked(secret, claims(), headers={"kid": "rsa-1"})
            assert rejection(source, forged) == "algorithm_not_allowed"


def test_rs256_token_against_an_ec_key(tmp_path: Path, rsa_key: KeyPair, ec_key: KeyPair) -> None:
    keys = jwks_file(tmp_path, ec_key)
    compact = token(rsa_key, claims(), headers={"kid": "ec-1"})
    assert rejection(keys, compact) == "algorithm_not_allowed"


def test_es384_token_against_a_p256_key(tmp_path: Path, ec_key: KeyPair) -> None:
    p384 = KeyPair.ec("ec-1", curve="P-384")
    compact = token(p384, claims())
    assert rejection(jwks_file(tmp_path, ec_key), compact) == "algorithm_not_allowed"


def test_unknown_kid(rsa_jwks: JwksFile, other_rsa_key: KeyPair) -> None:
    assert rejection(rsa_jwks, token(other_rsa_key, claims())) == "key_unknown"


def test_token_without_kid_uses_the_only_key(
    tmp_path: Path, rsa_key: KeyPair, ec_key: KeyPair
) -> None:
    compact = token(rsa_key, claims(), headers={"kid": None})
    assert verify(jwks_file(tmp_path, rsa_key), compact)
    assert rejection(jwks_file(tmp_path, rsa_key, ec_key), compact) == "key_unknown"


def test_token_with_kid_does_not_match_a_key_without_kid(tmp_path: Path) -> None:
    key = KeyPair.ec(kid=None)
    assert rejection(jwks_file(tmp_path, key), token(key, claims(), headers={"kid": "k"}))


@pytest.mark.filterwarnings("ignore::jwt.warnings.InsecureKeyLengthWarning")
def test_unusable_jwks_entries_are_skipped(
    tmp_path: Path, rsa_key: KeyPair, ec_key: KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    weak = KeyPair.rsa("weak", bits=1024)
    entries = [
        weak.public_jwk(),
        rsa_key.public_jwk(use="enc"),
        ec_key.public_jwk(kid=7),
        {"kty": "oct", "kid": "short", "k": "c2hvcnQ"},
        {"kty": "RSA", "kid": "broken"},
        {"kty": "oct", "kid": "no-k"},
        {"kty": "EC", "kid": "bad-alg", "alg": "none", "crv": "P-256"},
        "not a key",
        KeyPair.ec("good").public_jwk(),
    ]
    keys = JwksFile(write(tmp_path / "jwks.json", {"keys": entries}))
    assert rejection(keys, token(weak, claims())) == "key_unknown"
    assert rejection(keys, token(rsa_key, claims())) == "key_unknown"
    # One line per key left out, naming it and why; never the key itself.
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records] == [
        "JWKS key #0 (kid 'weak') left out: RSA key of 1024 bits (at least 2048 required)",
        "JWKS key #1 (kid 'rsa-1') left out: not for signatures (use)",
        "JWKS key #2 (kid (none)) left out: kid is not a string",
        "JWKS key #3 (kid 'short') left out: HMAC secret of 5 bytes (at least 32 required)",
        "JWKS key #4 (kid 'broken') left out: not a valid JWK",
        "JWKS key #5 (kid 'no-k') left out: not a valid JWK",
        "JWKS key #6 (kid 'bad-alg') left out: unsupported alg",
        "JWKS key #7 (kid (none)) left out: not a JSON object",
    ]
    assert weak.public_jwk()["n"] not in caplog.text


def test_a_left_out_kid_is_logged_quoted_and_cut_short(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entries = [{"kty": "RSA", "kid": "x\n" + "k" * 100}, KeyPair.ec("good").public_jwk()]
    JwksFile(write(tmp_path / "jwks.json", {"keys": entries}))
    (line,) = caplog.messages
    assert "\n" not in line  # no forged log lines from a kid
    assert "(kid 'x\\n" + "k" * 62 + "')" in line


def test_keys_left_out_for_their_type(
    tmp_path: Path, rsa_key: KeyPair, caplog: pytest.LogCaptureFixture
) -> None:
    secret = base64.urlsafe_b64encode(hmac_secret(32)).rstrip(b"=").decode()
    assert isinstance(rsa_key.private_key, rsa.RSAPrivateKey)
    private: dict[str, Any] = json.loads(pyjwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.private_key))
    entries = [
        {"kty": "oct", "kid": "hs512-with-32-bytes", "alg": "HS512", "k": secret},
        {**private, "kid": "private"},
        KeyPair.ec("good").public_jwk(),
    ]
    JwksFile(write(tmp_path / "jwks.json", {"keys": entries}))
    assert [m.split(" left out: ")[1] for m in caplog.messages] == [
        "alg does not fit the key",
        "not a public key of a supported type",
    ]
    assert private["d"] not in caplog.text and secret not in caplog.text


@pytest.mark.parametrize(
    "document",
    [{}, {"keys": "x"}, {"keys": []}, {"keys": [{"kty": "RSA", "kid": "broken"}]}, ["keys"]],
)
def test_jwks_files_without_usable_keys_are_refused(tmp_path: Path, document: Any) -> None:
    with pytest.raises(ValueError, match="JWKS"):
        JwksFile(write(tmp_path / "jwks.json", document))


def test_unreadable_jwks_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read JWKS"):
        JwksFile(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="cannot read JWKS"):
        JwksFile(write(tmp_path / "bad.json", b"{not json"))


def malformed_tokens(key: KeyPair) -> list[str]:
    header = token(key, claims()).split(".")[0]
    return [
        "",
        "abc",
        "a.b",
        "a.b.c",
        "...",
        "a.b.c.d",
        "!!!.###.$$$",
        f"{header}.%%%.abc",
        "eyJhbGciOiJSUzI1NiJ9",  # a header alone
        "W10.e30.",  # header is a JSON array
        "eyJ0eXAiOiJKV1QifQ.e30.",  # header without alg
        "eyJhbGciOiJSUzI1NiIsImtpZCI6N30.e30.",  # kid is a number
        pyjwt.api_jws.encode(b"not json", key.private_key, "RS256", {"kid": key.kid}),
        pyjwt.api_jws.encode(b"[1, 2]", key.private_key, "RS256", {"kid": key.kid}),
        token(key, claims(exp="tomorrow")),
        token(key, claims(iat="yesterday")),
    ]


def test_malformed_tokens(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    for compact in malformed_tokens(rsa_key):
        assert rejection(rsa_jwks, compact) == "token_malformed", compact


# --- the identity providers ---------------------------------------------------------------


def bearer_request(authorization: str | None) -> AuthRequest:
    headers = {} if authorization is None else {"authorization": authorization}
    return AuthRequest(method="POST", path="/collections/docs/points/query", headers=headers)


def test_jwt_bearer_maps_verified_claims(rsa_jwks: JwksFile, rsa_key: KeyPair) -> None:
    verifier = JwtVerifier(rsa_jwks, issuer=ISSUER, audience=AUDIENCE)
    provider = JwtBearer(verifier, ClaimMapping(drafts_scope="drafts"))
    compact = token(rsa_key, claims(groups=["qa"], scope="read drafts"))
    for scheme in ("Bearer", "bearer", "BEARER"):
        caller = asyncio.run(provider.identify(bearer_request(f"{scheme} {compact}")))
        assert caller == Caller("acme", frozenset({"user:alice", "group:qa"}), True)
    assert provider.strip_headers == ("authorization",)


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Bearer   ", "Basic YTpi", "tok"])
def test_jwt_bearer_without_a_bearer_token(rsa_jwks: JwksFile, authorization: str | None) -> None:
    provider = JwtBearer(JwtVerifier(rsa_jwks, issuer=ISSUER, audience=AUDIENCE), ClaimMapping())
    with pytest.raises(IdentityError) as raised:
        asyncio.run(provider.identify(bearer_request(authorization)))
    assert raised.value.code == "token_missing"


def test_jwt_bearer_passes_on_verification_and_mapping_errors(
    rsa_jwks: JwksFile, rsa_key: KeyPair
) -> None:
    provider = JwtBearer(JwtVerifier(rsa_jwks, issuer=ISSUER, audience=AUDIENCE), ClaimMapping())
    for compact, code in [
        (token(rsa_key, claims(exp=int(time.time()) - 600)), "token_expired"),
        (token(rsa_key, claims(tenant=None)), "tenant_missing"),
    ]:
        with pytest.raises(IdentityError) as raised:
            asyncio.run(provider.identify(bearer_request(f"Bearer {compact}")))
        assert raised.value.code == code
        assert_no_leak(raised.value, compact)


def envoy_request(metadata: dict[str, Any], headers: dict[str, str] | None = None) -> AuthRequest:
    """A request as jwt_authn leaves it: the payload in metadata and (``forward: true``)
    the token it verified still in the headers, unless ``headers`` says otherwise."""
    if headers is None:
        payloads = [v for ns in metadata.values() for v in ns.values() if isinstance(v, dict)]
        headers = {"authorization": f"Bearer {unsigned_token(payloads[0])}"} if payloads else {}
    return AuthRequest(method="POST", path="/", headers=headers, metadata=metadata)


def envoy_provider(**options: Any) -> EnvoyJwtPayload:
    return EnvoyJwtPayload(ClaimMapping(), issuer=ISSUER, audience=AUDIENCE, **options)


VERIFIED = {"iss": ISSUER, "aud": AUDIENCE, "exp": 1.9e9}


def test_envoy_jwt_payload_maps_the_verified_payload() -> None:
    payload = {**VERIFIED, "tenant": "acme", "sub": "alice", "roles": ["author"], "exp": 1.9e9}
    request = envoy_request({"envoy.filters.http.jwt_authn": {"jwt_payload": payload}})
    caller = asyncio.run(envoy_provider().identify(request))
    assert caller == Caller("acme", frozenset({"user:alice", "role:author"}))
    assert envoy_provider().strip_headers == ("authorization",)


def test_envoy_jwt_payload_with_custom_namespace_and_key() -> None:
    provider = envoy_provider(namespace="ns", payload_key="claims")
    request = envoy_request({"ns": {"claims": {**VERIFIED, "tenant": "t", "sub": "u"}}})
    assert asyncio.run(provider.identify(request)) == Caller("t", frozenset({"user:u"}))


def test_envoy_jwt_payload_accepts_an_audience_list() -> None:
    payload = {"iss": ISSUER, "aud": ["other", AUDIENCE], "exp": 1.9e9, "tenant": "t", "sub": "u"}
    request = envoy_request({"envoy.filters.http.jwt_authn": {"jwt_payload": payload}})
    assert asyncio.run(envoy_provider().identify(request)).tenant == "t"


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ({}, "token_missing"),
        ({"envoy.filters.http.jwt_authn": {}}, "token_missing"),
        ({"envoy.filters.http.jwt_authn": {"other": {"tenant": "t"}}}, "token_missing"),
        ({"envoy.filters.http.jwt_authn": {"jwt_payload": "eyJ..."}}, "token_malformed"),
        (
            {"envoy.filters.http.jwt_authn": {"jwt_payload": {**VERIFIED, "sub": "u"}}},
            "tenant_missing",
        ),
        (
            {"envoy.filters.http.jwt_authn": {"jwt_payload": {"iss": ISSUER, "aud": AUDIENCE}}},
            "token_malformed",  # no exp: refused as `jwt` mode refuses it
        ),
        (
            {
                "envoy.filters.http.jwt_authn": {
                    "jwt_payload": {"iss": ISSUER, "aud": AUDIENCE, "exp": True, "tenant": "t"}
                }
            },
            "token_malformed",
        ),
        (
            {
                "envoy.filters.http.jwt_authn": {
                    "jwt_payload": {"aud": AUDIENCE, "exp": 1.9e9, "tenant": "t"}
                }
            },
            "issuer_mismatch",
        ),
        (
            {
                "envoy.filters.http.jwt_authn": {
                    "jwt_payload": {"iss": ISSUER, "exp": 1.9e9, "tenant": "t"}
                }
            },
            "audience_mismatch",
        ),
    ],
)
def test_envoy_jwt_payload_refusals(metadata: dict[str, Any], code: str) -> None:
    with pytest.raises(IdentityError) as raised:
        asyncio.run(envoy_provider().identify(envoy_request(metadata)))
    assert raised.value.code == code


# --- key_source factory -----------------------------------------------------------------------


def test_key_source_needs_exactly_one_key_flag(tmp_path: Path) -> None:
    secret = write(tmp_path / "secret", hmac_secret())
    for jwks_flag, secret_flag in ((None, None), ("jwks.json", secret)):
        with pytest.raises(ValueError) as raised:
            key_source(jwks=jwks_flag, public_key=None, hmac_secret_file=secret_flag)
        for flag in ("--jwks", "--jwt-public-key", "--jwt-hmac-secret-file"):
            assert flag in str(raised.value)


def test_key_source_picks_the_kind(tmp_path: Path, rsa_key: KeyPair) -> None:
    pem = write(tmp_path / "key.pem", rsa_key.public_pem())
    secret = write(tmp_path / "secret", hmac_secret())
    jwks_path = str(write(tmp_path / "jwks.json", jwks(rsa_key)))

    def source(
        jwks: str | None = None, public_key: Path | None = None, secret: Path | None = None
    ) -> KeySource:
        return key_source(jwks=jwks, public_key=public_key, hmac_secret_file=secret)

    assert isinstance(source(jwks="https://idp.test/jwks"), JwksUrl)
    assert isinstance(source(jwks="http://127.0.0.1:1/jwks"), JwksUrl)
    assert isinstance(source(jwks=jwks_path), JwksFile)
    assert isinstance(source(public_key=pem), PemPublicKey)
    assert isinstance(source(secret=secret), HmacSecret)


def test_verifier_needs_issuer_and_audience(rsa_jwks: JwksFile) -> None:
    with pytest.raises(ValueError, match="--issuer and --audience"):
        JwtVerifier(rsa_jwks, issuer="", audience=AUDIENCE)
    with pytest.raises(ValueError, match="--issuer and --audience"):
        JwtVerifier(rsa_jwks, issuer=ISSUER, audience="")


@pytest.mark.parametrize("url", ["file:///etc/jwks.json", "ftp://idp.test/jwks", "idp.test/jwks"])
def test_jwks_url_needs_http_or_https(url: str) -> None:
    with pytest.raises(ValueError, match="http"):
        JwksUrl(url)


# --- JWKS over HTTP ------------------------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def jwks_server(rsa_key: KeyPair) -> Iterator[JwksServer]:
    server = JwksServer(jwks(rsa_key))
    yield server
    server.stop()


def url_source(server: JwksServer, clock: Clock, **kwargs: Any) -> JwksUrl:
    return JwksUrl(server.url, clock=clock, **kwargs)


def test_jwks_url_is_fetched_once_and_cached(jwks_server: JwksServer, rsa_key: KeyPair) -> None:
    clock = Clock()
    keys = url_source(jwks_server, clock)
    verifier = JwtVerifier(keys, issuer=ISSUER, audience=AUDIENCE)

    async def scenario() -> None:
        # Concurrent first requests share one fetch.
        await asyncio.gather(*(verifier.verify(token(rsa_key, claims())) for _ in range(10)))
        clock.now += 299
        await verifier.verify(token(rsa_key, claims()))

    asyncio.run(scenario())
    assert jwks_server.fetches == 1


def test_jwks_url_is_refreshed_at_expiry(jwks_server: JwksServer, rsa_key: KeyPair) -> None:
    clock = Clock()
    keys = url_source(jwks_server, clock, refresh_seconds=300)
    verifier = JwtVerifier(keys, issuer=ISSUER, audience=AUDIENCE)

    async def scenario() -> None:
        await verifier.verify(token(rsa_key, claims()))
        clock.now += 300
        await verifier.verify(token(rsa_key, claims()))
        await verifier.verify(token(rsa_key, claims()))

    asyncio.run(scenario())
    assert jwks_server.fetches == 2


def test_jwks_url_rotation_refetches_once_for_a_new_kid(
    jwks_server: JwksServer, rsa_key: KeyPair, ec_key: KeyPair
) -> None:
    clock = Clock()
    verifier = JwtVerifier(url_source(jwks_server, clock), issuer=ISSUER, audience=AUDIENCE)

    async def scenario() -> None:
        await verifier.verify(token(rsa_key, claims()))
        jwks_server.document = jwks(rsa_key, ec_key)
        clock.now += 30
        await verifier.verify(token(ec_key, claims()))
        await verifier.verify(token(ec_key, claims()))
        await verifier.verify(token(rsa_key, claims()))

    asyncio.run(scenario())
    assert jwks_server.fetches == 2


def test_jwks_url_unknown_kid_refetch_is_rate_limited(
    jwks_server: JwksServer, rsa_key: KeyPair, other_rsa_key: KeyPair
) -> None:
    clock = Clock()
    keys = url_source(jwks_server, clock, min_refetch_seconds=30)
    verifier = JwtVerifier(keys, issuer=ISSUER, audience=AUDIENCE)
    unknown = token(other_rsa_key, claims())

    async def codes() -> list[str]:
        await verifier.verify(token(rsa_key, claims()))  # fetch 1
        found = []
        for advance in (0, 10, 25, 5, 1):  # at 1000, 1010, 1035 (fetch 2), 1040, 1041
            clock.now += advance
            try:
                await verifier.verify(unknown)
            except IdentityError as error:
                found.append(error.code)
        return found

    assert asyncio.run(codes()) == ["key_unknown"] * 5
    assert jwks_server.fetches == 2


def test_jwks_url_fetch_timeout_without_cache(jwks_server: JwksServer, rsa_key: KeyPair) -> None:
    jwks_server.delay_seconds = 2.0
    keys = JwksUrl(jwks_server.url, fetch_timeout_seconds=0.2)
    started = time.monotonic()
    code = rejection(keys, token(rsa_key, claims()))
    assert code == "jwks_unavailable"
    assert time.monotonic() - started < 1.5


def test_jwks_url_server_error_without_cache(jwks_server: JwksServer, rsa_key: KeyPair) -> None:
    jwks_server.status = 500
    assert rejection(JwksUrl(jwks_server.url), token(rsa_key, claims())) == "jwks_unavailable"
    jwks_server.status = 200
    jwks_server.document = {"keys": []}
    assert rejection(JwksUrl(jwks_server.url), token(rsa_key, claims())) == "jwks_unavailable"


def test_jwks_url_keeps_the_stale_set_when_the_server_goes_away(
    jwks_server: JwksServer, rsa_key: KeyPair
) -> None:
    clock = Clock()
    verifier = JwtVerifier(url_source(jwks_server, clock), issuer=ISSUER, audience=AUDIENCE)

    async def scenario() -> None:
        await verifier.verify(token(rsa_key, claims()))
        jwks_server.stop()
        clock.now += 3600
        assert await verifier.verify(token(rsa_key, claims()))

    asyncio.run(scenario())
    assert jwks_server.fetches == 1


def test_jwks_url_failed_refresh_is_retried_after_min_refetch(
    jwks_server: JwksServer, rsa_key: KeyPair
) -> None:
    clock = Clock()
    verifier = JwtVerifier(url_source(jwks_server, clock), issuer=ISSUER, audience=AUDIENCE)

    async def scenario() -> None:
        await verifier.verify(token(rsa_key, claims()))  # fetch 1
        jwks_server.status = 503
        clock.now += 300
        await verifier.verify(token(rsa_key, claims()))  # fetch 2 fails, cached keys
        clock.now += 10
        await verifier.verify(token(rsa_key, claims()))  # too soon to retry
        jwks_server.status = 200
        clock.now += 20
        await verifier.verify(token(rsa_key, claims()))  # fetch 3
        clock.now += 10
        await verifier.verify(token(rsa_key, claims()))  # fresh again

    asyncio.run(scenario())
    assert jwks_server.fetches == 3
