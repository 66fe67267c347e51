"""Claim mapping: verified claims to tenant, principals and the drafts scope."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.caller import Caller, IdentityError
from sidecar.identity.claims import ClaimMapping


def test_default_mapping_gives_user_groups_and_roles() -> None:
    caller = ClaimMapping().caller_from_claims(
        {"tenant": "acme", "sub": "alice", "groups": ["qa", "ops"], "roles": ["author"]}
    )
    assert caller == Caller(
        "acme", frozenset({"user:alice", "group:qa", "group:ops", "role:author"})
    )


def test_list_entries_that_are_not_strings_and_other_claim_types_are_ignored() -> None:
    caller = ClaimMapping().caller_from_claims(
        {"tenant": "acme", "sub": "alice", "groups": ["qa", 7, None, "", ["x"]], "roles": 3}
    )
    assert caller.principals == {"user:alice", "group:qa"}


def test_a_string_claim_gives_one_principal() -> None:
    caller = ClaimMapping().caller_from_claims({"tenant": "acme", "groups": "qa"})
    assert caller.principals == {"group:qa"}


def test_custom_mapping() -> None:
    mapping = ClaimMapping(
        tenant_claim="org",
        principal_claims={"email": "mail", "teams": "team"},
        drafts_scope="docs:drafts",
        scope_claims=("permissions",),
    )
    caller = mapping.caller_from_claims(
        {
            "org": "globex",
            "email": "bob@globex.test",
            "teams": ["red"],
            "sub": "ignored",
            "tenant": "ignored",
            "permissions": ["docs:read", "docs:drafts"],
        }
    )
    assert caller == Caller(
        "globex", frozenset({"mail:bob@globex.test", "team:red"}), drafts_allowed=True
    )


@pytest.mark.parametrize(
    "claims",
    [
        {"scope": "docs:read docs:drafts"},
        {"scp": ["docs:read", "docs:drafts"]},
        {"scope": "docs:read", "scp": "docs:drafts"},
    ],
)
def test_drafts_scope_from_scope_string_or_scp_list(claims: dict[str, Any]) -> None:
    mapping = ClaimMapping(drafts_scope="docs:drafts")
    assert mapping.caller_from_claims({"tenant": "t", "sub": "u", **claims}).drafts_allowed


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"scope": "docs:read"},
        {"scope": "docs:drafts-extra"},
        {"scp": "docs:read docs:draft"},
        {"scope": 42},
    ],
)
def test_drafts_denied_without_the_exact_scope(claims: dict[str, Any]) -> None:
    mapping = ClaimMapping(drafts_scope="docs:drafts")
    assert not mapping.caller_from_claims({"tenant": "t", "sub": "u", **claims}).drafts_allowed


def test_no_drafts_scope_configured_never_allows_drafts() -> None:
    caller = ClaimMapping().caller_from_claims({"tenant": "t", "sub": "u", "scope": "drafts"})
    assert not caller.drafts_allowed


@pytest.mark.parametrize("tenant", [None, "", "  ", 42, ["acme"], {"id": "acme"}])
def test_tenant_must_be_a_non_empty_string(tenant: Any) -> None:
    claims = {"sub": "alice-secret-id"} | ({} if tenant is None else {"tenant": tenant})
    with pytest.raises(IdentityError) as raised:
        ClaimMapping().caller_from_claims(claims)
    assert raised.value.code == "tenant_missing"
    assert "'tenant'" in str(raised.value)
    assert "alice-secret-id" not in str(raised.value)


@pytest.mark.parametrize(
    "claims",
    [{}, {"sub": ""}, {"groups": []}, {"roles": [1, 2]}, {"sub": 12345}, {"email": "a@b"}],
)
def test_at_least_one_principal_is_required(claims: dict[str, Any]) -> None:
    with pytest.raises(IdentityError) as raised:
        ClaimMapping().caller_from_claims({"tenant": "acme-private", **claims})
    assert raised.value.code == "principals_missing"
    assert "acme-private" not in str(raised.value)
    assert "a@b" not in str(raised.value)


@pytest.mark.parametrize(
    "kwargs",
    [{"tenant_claim": ""}, {"principal_claims": {}}, {"principal_claims": {"sub": ""}}],
)
def test_unusable_mappings_are_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="claim mapping"):
        ClaimMapping(**kwargs)
