"""Bundle signatures as OPA verifies them: ``.signatures.json``, its JWT, and each file's digest.

``opa build --signing-key`` and ``opa sign`` write ``{"signatures": ["<JWT>"]}``;
the JWT's payload lists every other file of the bundle with a digest
(``{"files": [{"name", "hash", "algorithm"}], "scope"?, "keyid"?}``). OPA
digests ``data.json`` and ``.manifest`` over their *structure*, so that
whitespace and key order do not matter: objects with keys in sorted order,
and every string, key and number written as Go's JSON encoder writes it
(numbers keep their literal text: ``1e3`` stays ``1e3``). Other files are
digested as bytes. This module does the same, so a bundle OPA accepts is
accepted here, and one it refuses is refused.

The gate behaves as OPA with one verification key, ``key_id``: the
signature must be made with the configured algorithm, its ``scope`` must
equal the configured scope, and a key id it names (JWT ``kid``, or the
deprecated ``keyid`` claim) must be the configured one. MD5 and SHA-1 file
digests, which OPA accepts, are refused: they prove nothing about the file.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt

# Asymmetric algorithms only: a bundle is verified with a public key, never a shared secret.
ALGORITHMS = (
    *("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    *("ES256", "ES384", "ES512", "EdDSA"),
)
# OPA's names for file digests (bundle/hash.go), to hashlib's.
_DIGESTS = {
    "SHA-224": "sha224",
    "SHA-256": "sha256",
    "SHA-384": "sha384",
    "SHA-512": "sha512",
    "SHA-512-224": "sha512_224",
    "SHA-512-256": "sha512_256",
}
_WEAK_DIGESTS = frozenset({"MD5", "SHA-1"})
# The files OPA digests over their JSON structure (bundle.IsStructuredDoc).
_STRUCTURED = frozenset({"data.json", ".manifest"})


class SignatureError(Exception):
    """The bundle's signature does not verify; the message says why, without secrets."""


@dataclass(frozen=True)
class Verification:
    """OPA's verification config with one key: what a bundle's signature must match."""

    public_key: bytes
    """PEM."""
    algorithm: str = "RS256"
    """The only JWT algorithm accepted (OPA's key ``algorithm``, RS256 by default)."""
    key_id: str = "default"
    """The key's id; a signature naming another is refused (``opa build``'s default id)."""
    scope: str = ""
    """The payload's ``scope`` must equal this (OPA compares them as strings, "" included)."""


def verify_signatures(
    files: Mapping[str, bytes], signatures: bytes, verification: Verification
) -> None:
    """Check ``.signatures.json`` against ``files`` (every other file of the bundle, by path).

    Raises SignatureError: a malformed or extra signature, a JWT that does not
    verify with the key and algorithm, a scope or key id that differs, a file
    that is not listed or listed but absent, a digest algorithm that is
    missing, unknown or weak, or a digest that does not match.
    """
    claims = _verified_claims(_one_token(signatures), verification)
    listed = _listed_digests(claims)
    unsigned = sorted(files.keys() - listed.keys())
    missing = sorted(listed.keys() - files.keys())
    if unsigned or missing:
        raise SignatureError(
            f"signed file list differs: {len(unsigned)} files unsigned"
            f"{_first(unsigned)}, {len(missing)} missing{_first(missing)}"
        )
    for name, content in files.items():
        algorithm, expected = listed[name]
        if not _digest_matches(name, content, algorithm, expected):
            raise SignatureError(f"{name}: digest does not match its signature")


def _digest_matches(name: str, content: bytes, algorithm: Any, expected: str) -> bool:
    return hmac.compare_digest(file_digest(name, content, algorithm), expected)


def file_digest(name: str, content: bytes, algorithm: str) -> str:
    """The hex digest OPA computes for the bundle file ``name``, with OPA's ``algorithm`` name.

    Raises SignatureError for an algorithm OPA does not know, or one refused as
    weak, and for a structured file that is not JSON.
    """
    digest = hashlib.new(_digest_name(name, algorithm))
    if posixpath.basename(name) in _STRUCTURED:
        try:
            document = json.loads(
                content.decode("utf-8"),
                parse_int=_Number,
                parse_float=_Number,
                parse_constant=_refuse_constant,
            )
        except (UnicodeDecodeError, ValueError):
            raise SignatureError(f"{name}: not valid JSON") from None
        _write_structure(document, digest.update)
    else:
        digest.update(content)
    return digest.hexdigest()


def _digest_name(name: str, algorithm: Any) -> str:
    if not isinstance(algorithm, str) or not algorithm:
        raise SignatureError(f"{name}: no digest algorithm in the signature (OPA requires one)")
    if algorithm in _WEAK_DIGESTS:
        raise SignatureError(f"{name}: {algorithm} digests are refused as weak; sign with SHA-256")
    found = _DIGESTS.get(algorithm)
    if found is None:
        raise SignatureError(
            f"{name}: unknown digest algorithm {algorithm[:40]!r} "
            f"(OPA's names: {', '.join(_DIGESTS)})"
        )
    return found


def _one_token(signatures: bytes) -> str:
    try:
        document = json.loads(signatures)
    except ValueError:
        raise SignatureError(".signatures.json: not valid JSON") from None
    if not isinstance(document, dict):
        raise SignatureError(".signatures.json: must be a JSON object")
    if document.get("plugin", "") not in ("", None):
        raise SignatureError(".signatures.json: signature plugins are not supported")
    tokens = document.get("signatures")
    if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(tokens[0], str):
        raise SignatureError(".signatures.json: must hold exactly one signature (as OPA requires)")
    return tokens[0]


def _verified_claims(token: str, verification: Verification) -> dict[str, Any]:
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(
            token,
            verification.public_key,
            algorithms=[verification.algorithm],
            options={"verify_aud": False, "verify_iss": False},
        )
    except jwt.PyJWTError as exc:
        raise SignatureError(
            f"bundle signature not valid with the {verification.algorithm} key: "
            f"{type(exc).__name__}"
        ) from None
    # OPA takes the key id from the JWT header, else from the deprecated claim.
    named = header.get("kid") or claims.get("keyid")
    if named is not None and named != verification.key_id:
        raise SignatureError(
            f"signed with key id {str(named)[:64]!r}, not the configured {verification.key_id!r}"
        )
    scope = claims.get("scope", "")
    if scope != verification.scope:
        raise SignatureError(
            f"signature scope {str(scope)[:64]!r} is not the configured {verification.scope!r}"
        )
    return claims


def _listed_digests(claims: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    listed = claims.get("files")
    if not isinstance(listed, list):
        raise SignatureError("signature payload has no files list")
    digests: dict[str, tuple[Any, str]] = {}
    for entry in listed:
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("name"), str)
            or not isinstance(entry.get("hash"), str)
        ):
            raise SignatureError("signature payload has a malformed file entry")
        name = entry["name"].removeprefix("/")
        if name in digests:
            raise SignatureError(f"{name}: listed twice in the signature")
        digests[name] = (entry.get("algorithm"), entry["hash"].lower())
    return digests


def _first(names: list[str]) -> str:
    return f" ({names[0][:80]!r}{', ...' if len(names) > 1 else ''})" if names else ""


# --- OPA's structural digest (bundle/hash.go), in Go's JSON spelling ----------------


class _Number(str):
    """A JSON number kept as its literal text, as Go's json.Number keeps it."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# Go's encoder writes these control characters short (\b and \f since Go 1.22);
# the others as \u00xx, and U+2028, U+2029 escaped even with HTML escaping off.
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_SHORT_ESCAPES |= {"\b": "\\b", "\f": "\\f"}


def go_json_string(text: str) -> str:
    """``text`` as Go's ``encoding/json`` writes it with HTML escaping off."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[char])
        elif code < 0x20 or code in (0x2028, 0x2029):
            out.append(f"\\u{code:04x}")
        elif 0xD800 <= code <= 0xDFFF:
            out.append("\\ufffd")  # a lone surrogate: Go decodes it as U+FFFD
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _write_structure(value: Any, write: Callable[[bytes], None]) -> None:
    if isinstance(value, dict):
        write(b"{")
        for index, key in enumerate(sorted(value)):
            if index:
                write(b",")
            write(go_json_string(key).encode())
            write(b":")
            _write_structure(value[key], write)
        write(b"}")
    elif isinstance(value, list):
        write(b"[")
        for index, item in enumerate(value):
            if index:
                write(b",")
            _write_structure(item, write)
        write(b"]")
    elif isinstance(value, _Number):
        write(value.encode())
    elif isinstance(value, str):
        write(go_json_string(value).encode())
    elif value is None:
        write(b"null")
    else:
        write(b"true" if value else b"false")
