"""Where a caller's JWT travels: wherever its database client already sends a credential.

An application keeps its vector-database client and hands it a JWT where it
passed the database's key before; the gate verifies that token (identity
``jwt``) and removes every credential header before the request goes on.

- ``bearer``: ``authorization: Bearer <jwt>`` (HTTP clients, the Weaviate
  client, Milvus REST);
- ``base64``: ``authorization: <base64 of the jwt>``, no scheme (pymilvus
  sends its ``token`` so);
- ``api-key``: ``api-key: <jwt>`` (qdrant-client, the Pinecone clients).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Final

from sidecar.core.caller import IdentityError

BEARER: Final = "bearer"
BASE64: Final = "base64"
API_KEY: Final = "api-key"
LOCATIONS: Final = (BEARER, BASE64, API_KEY)
_HEADERS = {BEARER: "authorization", BASE64: "authorization", API_KEY: "api-key"}


def check_locations(value: Iterable[str]) -> tuple[str, ...]:
    """The configured locations, checked: a non-empty list of known names, each once."""
    locations = tuple(value)
    unknown = [name for name in locations if name not in LOCATIONS]
    if unknown:
        raise ValueError(
            f"unknown credential location {unknown[0]!r} (known: {', '.join(LOCATIONS)})"
        )
    if not locations or len(set(locations)) != len(locations):
        raise ValueError("must name each credential location once, and at least one")
    return locations


def credential_headers(locations: Iterable[str]) -> tuple[str, ...]:
    """The headers ``locations`` read: all of them are removed before the database."""
    return tuple(dict.fromkeys(_HEADERS[name] for name in locations))


def find_token(headers: Mapping[str, str], locations: Iterable[str]) -> str:
    """The one JWT the request carries in ``locations``; IdentityError otherwise.

    ``token_missing`` when none holds one; ``token_ambiguous`` when two hold
    different tokens (which one the database or a later filter would read is
    not the gate's guess to make).
    """
    found = {token for name in locations if (token := _read(headers, name))}
    if not found:
        raise IdentityError("token_missing", "no token where the configured clients send one")
    if len(found) > 1:
        raise IdentityError("token_ambiguous", "the request carries two different tokens")
    return found.pop()


def _read(headers: Mapping[str, str], location: str) -> str | None:
    value = headers.get(_HEADERS[location], "").strip()
    if not value:
        return None
    if location == API_KEY:
        return value
    scheme, space, rest = value.partition(" ")
    if location == BEARER:
        # RFC 7235: the auth scheme is case-insensitive.
        return rest.strip() or None if space and scheme.lower() == "bearer" else None
    if space:
        return None  # a scheme (Bearer, Basic): not a bare base64 token
    try:
        decoded = base64.b64decode(value, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        return None
    # A JWS has three dot-separated parts; pymilvus' user:password is no token.
    return decoded if decoded.count(".") == 2 else None
