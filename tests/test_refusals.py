"""The one builder of every error body the gate sends."""

from __future__ import annotations

import orjson

from sidecar import refusals


def test_an_error_body_is_the_code_alone_by_default() -> None:
    assert refusals.error_body(refusals.GATE_MISCONFIGURED) == b'{"error":"gate_misconfigured"}'


def test_an_error_body_carries_the_decision_id_and_policy_reasons_when_given() -> None:
    body = refusals.error_body(refusals.FORBIDDEN, decision_id="d1", reasons=("not_owner",))
    assert orjson.loads(body) == {
        "error": "forbidden",
        "decision_id": "d1",
        "reasons": ["not_owner"],
    }


def test_no_reasons_means_no_reasons_key() -> None:
    assert "reasons" not in orjson.loads(refusals.error_body("x", reasons=()))
