"""Gate/VerifyAnswer on a real `retrieval-gate serve` and Envoy, for both audit stores.

A retrieval through Gate/Filter, then an answer whose claims are supported,
cite another tenant's chunk or one the decision rejected, send a tampered
text, misquote, and cite a chunk revoked since: each gets its verdict, from
memory and, after a restart of the sidecar, from the audit store itself (the
JSON Lines log, or PostgreSQL's audit_records). The verification is an audit
record in the chain, holding hashes and never the texts or quotes.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from sidecar.audit.verification_record import text_digest
from sidecar.integrations.client import ClaimToVerify, GateClient, Verification
from tests.fixtures.harness import CLI, GateStack, wait_until
from tests.fixtures.postgres import fresh_database
from tests.fixtures.records import text_for
from tests.fixtures.verify_answer import RETRIEVED, jwt, revoke, verify_stack

TAMPERED = text_for("ok-3").replace("care", "c\u0430re")  # a Cyrillic a: looks the same
# ok-1's text is "Text of chunk ok-1: handle with care.\nSecond line.": quoted with
# other whitespace and curly quotes where the text has none, it is still found.
QUOTE = "handle   with care.\n  Second line."
MISQUOTE = "handle with great care."


def _claims() -> list[tuple[str, ClaimToVerify]]:
    return [
        ("supported", ClaimToVerify(("ok-1",), (QUOTE,))),
        ("not_released", ClaimToVerify(("other-tenant",))),
        ("not_released", ClaimToVerify(("draft",), ("Text of chunk draft",))),
        ("text_mismatch", ClaimToVerify(("ok-3",), ("Second line.",))),
        ("quote_not_found", ClaimToVerify(("ok-1",), ("Second line.", MISQUOTE))),
        ("revoked_since", ClaimToVerify(("ok-2", "ok-1"), ("Text of chunk ok-2",))),
    ]


def _chunks() -> list[tuple[str, str]]:
    held = dict(RETRIEVED)
    held["ok-3"] = TAMPERED
    return list(held.items())


@pytest.fixture(params=["jsonl", "postgres"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[GateStack]:
    if request.param == "jsonl":
        gate = verify_stack(tmp_path).start()
        try:
            yield gate
        finally:
            gate.stop()
        return
    with fresh_database() as database:
        gate = verify_stack(tmp_path, audit_store=database).start()
        gate.audit_database = database  # type: ignore[attr-defined]
        try:
            yield gate
        finally:
            gate.stop()


def _verify(stack: GateStack, decision_ids: list[str], token: str) -> Verification:
    client = GateClient(f"unix:{stack.gate_socket}", timeout_seconds=10)
    try:
        return client.verify_answer(
            decision_ids, [claim for _, claim in _claims()], _chunks(), token
        )
    finally:
        client.close()


def _retrieve(stack: GateStack) -> str:
    client = GateClient(f"unix:{stack.gate_socket}", timeout_seconds=10)
    try:
        decisions = client.filter(RETRIEVED, jwt())
    finally:
        client.close()
    admitted = [cid for (cid, _), ok in zip(RETRIEVED, decisions.admitted, strict=True) if ok]
    assert admitted == ["ok-1", "ok-2", "ok-3"]
    return decisions.decision_id


def _expect_verdicts(verification: Verification) -> None:
    expected = [verdict for verdict, _ in _claims()]
    assert [c.verdict for c in verification.claims] == expected
    by_verdict = {c.verdict: c for c in verification.claims}
    assert by_verdict["text_mismatch"].chunk_id == "ok-3"
    assert by_verdict["revoked_since"].chunk_id == "ok-2"
    assert verification.claims[4].quote == 1
    assert [c.chunk_id for c in verification.claims[1:3]] == ["other-tenant", "draft"]
    assert not verification.supported
    assert verification.unknown_decision_ids == ()


def test_each_claim_gets_its_verdict_from_memory_and_from_the_audit_store(
    stack: GateStack,
) -> None:
    decision_id = _retrieve(stack)
    revoke(stack, "ok-2")
    first = _verify(stack, [decision_id], jwt())
    _expect_verdicts(first)

    # Nothing in memory after a restart: the decision comes from the audit store.
    database = getattr(stack, "audit_database", None)
    if database is not None:
        assert wait_until(lambda: _shipped(database, decision_id))
    stack.kill_sidecar()
    stack.start_sidecar()
    _expect_verdicts(_verify(stack, [decision_id], jwt()))

    assert stack.metric('retrieval_gate_answer_claims_total{verdict="not_released"}') == 2
    assert stack.metric('retrieval_gate_answer_claims_total{verdict="supported"}') == 1
    assert stack.metric('retrieval_gate_answer_verifications_total{result="unsupported"}') == 1

    records = [r for r in _log_records(stack) if r.get("kind") == "answer_verification"]
    assert [r["decision_id"] for r in records][:1] == [first.verification_id]
    record = records[0]
    assert record["decisions"] == [decision_id]
    assert [c["verdict"] for c in record["claims"]] == [v for v, _ in _claims()]
    assert record["claims"][0]["quotes_sha256"] == [text_digest(QUOTE)]
    assert {"chunk_id": "ok-3", "text_sha256": text_digest(TAMPERED)} in record["chunks"]
    raw = b"".join(path.read_bytes() for path in stack.workdir.glob("decisions.jsonl*"))
    for secret in (QUOTE, MISQUOTE, TAMPERED, text_for("ok-1")):
        assert json.dumps(secret)[1:-1].encode() not in raw
    done = subprocess.run(
        [*CLI, "audit", "verify", str(stack.audit_log)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_decision_of_another_caller_is_answered_as_one_that_does_not_exist(
    stack: GateStack,
) -> None:
    decision_id = _retrieve(stack)
    for token in (jwt(tenant="globex"), jwt(groups=["sales"])):
        other = _verify(stack, [decision_id], token)
        missing = _verify(stack, ["f" * 32], token)
        for verification, asked in ((other, decision_id), (missing, "f" * 32)):
            assert verification.unknown_decision_ids == (asked,)
            assert {c.verdict for c in verification.claims} == {"unknown_decision"}
            assert not verification.supported


def test_all_supported_and_the_cli_exit_codes(stack: GateStack, tmp_path: Path) -> None:
    decision_id = _retrieve(stack)
    answer = {
        "decision_ids": [decision_id],
        "chunks": [{"id": "ok-1", "text": text_for("ok-1")}],
        "claims": [{"chunk_ids": ["ok-1"], "quotes": ["\u201chandle with care.\u201d"[1:-1]]}],
    }
    answer_file = tmp_path / "answer.json"
    answer_file.write_bytes(orjson.dumps(answer))
    (tmp_path / "token").write_text(jwt())
    base = [*CLI, "verify-answer", "--gate", f"unix:{stack.gate_socket}", str(answer_file)]
    done = subprocess.run(
        [*base, "--credential-file", str(tmp_path / "token")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "claim 0: supported" in done.stdout and "answer: supported" in done.stdout

    answer["claims"] = [{"chunk_ids": ["ok-1"], "quotes": [MISQUOTE]}]
    answer_file.write_bytes(orjson.dumps(answer))
    env = {**os.environ, "RETRIEVAL_GATE_CREDENTIAL": jwt()}
    done = subprocess.run([*base, "--json"], capture_output=True, text=True, env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert json.loads(done.stdout)["claims"][0]["verdict"] == "quote_not_found"

    answer["claim"] = answer.pop("claims")
    answer_file.write_bytes(orjson.dumps(answer))
    done = subprocess.run(base, capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert "unknown key 'claim'" in done.stderr


def _shipped(database: str, decision_id: str) -> bool:
    with psycopg.connect(database) as connection:
        row = connection.execute(
            "SELECT count(*) FROM audit_records WHERE decision_id = %s", (decision_id,)
        ).fetchone()
    return bool(row and row[0])


def _log_records(stack: GateStack) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stack.audit_log.read_bytes().splitlines() if line]
