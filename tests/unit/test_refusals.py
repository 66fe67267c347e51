"""The one builder of every error body the gate sends."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from sidecar import refusals
from sidecar.formats.qdrant.rest import GROUP_ID_NOT_RELEASED


def test_an_error_body_is_the_code_alone_by_default() -> None:
    assert refusals.GATE_MISCONFIGURED.body() == b'{"error":"gate_misconfigured"}'


def test_an_error_body_carries_the_decision_id_and_policy_reasons_when_given() -> None:
    body = refusals.FORBIDDEN.with_reasons(("not_owner",)).body("d1")
    assert orjson.loads(body) == {
        "error": "forbidden",
        "decision_id": "d1",
        "reasons": ["not_owner"],
    }


def test_no_reasons_means_no_reasons_key() -> None:
    assert "reasons" not in orjson.loads(refusals.error_body("x", reasons=()))


# Backticked names in the table that are fields of the body, not codes.
_FIELDS = frozenset({"decision_id", "reasons"})


def _documented_statuses() -> dict[str, str]:
    """code -> the status cell of the table under "Error bodies" in docs/architecture.md."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    table = text.split("### Error bodies", 1)[1].split("\n\n", 3)[2]
    statuses: dict[str, str] = {}
    for row in table.splitlines()[2:]:
        status, codes, _ = row.strip("|").split("|", 2)
        for code in re.findall(r"`([a-z_]+)`", codes):
            statuses.setdefault(code, status.strip())
    return statuses


def test_the_documented_status_of_every_refusal_is_its_status() -> None:
    documented = _documented_statuses()
    assert {refusal.code: documented.get(refusal.code) for refusal in refusals.TABLE} == {
        refusal.code: str(refusal.http_status) for refusal in refusals.TABLE
    }


def test_every_other_documented_code_has_the_status_of_its_kind() -> None:
    # Codes an identity provider or an adapter gives (identity_refusal, Unreleasable).
    others = {
        code: status
        for code, status in _documented_statuses().items()
        if code not in {r.code for r in refusals.TABLE} and code not in _FIELDS
    }
    # The upstream's own status is kept; the table's status is the one without it.
    assert others.pop("upstream_error") == "the upstream's (300-599; else 502)"
    assert refusals.UPSTREAM_ERROR.http_status == 502
    # The adapters' Unreleasable codes: Weaviate's generative block, Qdrant's group ids.
    for code in ("generated_from_rejected_chunks", GROUP_ID_NOT_RELEASED):
        assert others.pop(code) == str(refusals.UNRELEASABLE.http_status)
    assert others
    for code, status in others.items():
        assert status == str(refusals.identity_refusal(code, outage=False).http_status), code


def test_an_identity_outage_is_503_and_any_other_identity_failure_401() -> None:
    assert refusals.identity_refusal("token_expired", outage=False).http_status == 401
    outage = refusals.identity_refusal("jwks_unavailable", outage=True)
    assert (outage.http_status, outage.grpc_status) == (503, refusals.GrpcStatus.UNAVAILABLE)


def test_every_refusal_says_in_envoys_log_which_code_answered() -> None:
    assert refusals.REQUEST_NOT_FILTERABLE.details == "retrieval_gate_request_not_filterable"
    assert len({refusal.details for refusal in refusals.TABLE}) == len(refusals.TABLE)
