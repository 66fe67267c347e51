"""Where the JWT travels: the credential headers of each database's client."""

from __future__ import annotations

import base64

import pytest

from sidecar.core.caller import IdentityError
from sidecar.identity.credentials import (
    LOCATIONS,
    check_locations,
    credential_headers,
    find_token,
)

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2ln"
B64 = base64.b64encode(JWT.encode()).decode()


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": f"Bearer {JWT}"},  # HTTP clients, weaviate-client
        {"authorization": f"bearer  {JWT} "},
        {"authorization": B64},  # pymilvus MilvusClient(token=...)
        {"api-key": JWT},  # qdrant-client, pinecone
        {"authorization": f"Bearer {JWT}", "api-key": JWT},  # the same token twice
    ],
)
def test_the_token_is_found_where_each_client_sends_it(headers: dict[str, str]) -> None:
    assert find_token(headers, LOCATIONS) == JWT


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"authorization": "Bearer "},
        {"authorization": "Basic " + B64},
        # pymilvus with user and password: base64 of "user:password", no token.
        {"authorization": base64.b64encode(b"root:Milvus").decode()},
        {"authorization": "not base64!"},
        {"api-key": ""},
    ],
)
def test_no_token_is_token_missing(headers: dict[str, str]) -> None:
    with pytest.raises(IdentityError) as raised:
        find_token(headers, LOCATIONS)
    assert raised.value.code == "token_missing"


def test_only_the_configured_locations_are_read() -> None:
    with pytest.raises(IdentityError):
        find_token({"api-key": JWT}, ("bearer",))
    with pytest.raises(IdentityError):
        find_token({"authorization": B64}, ("bearer", "api-key"))


def test_two_different_tokens_are_refused() -> None:
    with pytest.raises(IdentityError) as raised:
        find_token({"authorization": f"Bearer {JWT}", "api-key": JWT + "x"}, LOCATIONS)
    assert raised.value.code == "token_ambiguous"
    assert JWT not in str(raised.value)


def test_locations_are_checked_and_their_headers_stripped() -> None:
    assert check_locations(["api-key", "bearer"]) == ("api-key", "bearer")
    for wrong in ([], ["bearer", "bearer"], ["cookie"]):
        with pytest.raises(ValueError):
            check_locations(wrong)
    assert credential_headers(LOCATIONS) == ("authorization", "api-key")
